"""``deploy_app``: the classic saga. Four steps with side effects, each undone by its compensation.

It creates a DNS record, issues a certificate, starts a container and
registers an uptime check, as rows of the demo ``Resource`` table. When a
step fails for good (``fail_at`` makes one fail on purpose), the steps that
were done are undone newest first, and the run ends ``failed`` with
``compensation`` ``done``: nothing is left behind. Each step and each
compensation carries an idempotency key, so a crash in the middle repeats
neither.
"""

from __future__ import annotations

import time
from typing import Literal

from django.conf import settings
from django.utils import timezone
from pydantic import BaseModel, Field

from examples.deploys.models import Resource, ResourceState
from runs.registry import agent
from workers.context import RunContext
from workers.errors import Fatal

Stage = Literal["dns", "certificate", "container", "monitoring"]


class DeployIn(BaseModel):
    app: str = Field(
        pattern=r"^[a-z][a-z0-9-]{1,39}$",
        description="The application's name (lowercase, digits, '-')",
    )
    region: str = Field(
        default="eu-west", pattern=r"^[a-z]{2}-[a-z]{3,10}$", description="Where to deploy it"
    )
    fail_at: Stage | None = Field(
        default=None, description="Make this step fail, to watch the rollback"
    )


def _pause(seconds: float) -> None:
    time.sleep(seconds * settings.RUNS_DEMO_DELAY_SCALE)


def _creator(ctx: RunContext, stage: Stage, kind: str, fail_at: Stage | None):
    def create(name: str) -> dict:
        _pause(0.6)
        if stage == fail_at:
            raise Fatal(f"the {stage} provider refused {name!r}: quota exceeded in this region")
        resource, _ = Resource.objects.get_or_create(
            key=ctx.idempotency_key,
            defaults={"tenant_id": ctx.tenant_id, "kind": kind, "name": name, "run_id": ctx.run_id},
        )
        return {"id": resource.pk, "kind": kind, "name": name}

    return create


def _deleter(ctx: RunContext):
    def delete(created: dict) -> dict:
        _pause(0.4)
        gone = Resource.objects.filter(
            tenant_id=ctx.tenant_id, pk=created["id"], state=ResourceState.ACTIVE
        ).update(state=ResourceState.DELETED, deleted_at=timezone.now())
        return {"deleted": created["name"], "was_active": bool(gone)}

    return delete


@agent(
    "deploy_app",
    input_schema=DeployIn,
    max_attempts=3,
    compensate_on=("fatal", "retryable", "budget", "deadline"),
    title=lambda data: f"Deploy {data['app']} to {data['region']}",
)
def deploy_app(ctx: RunContext, data: DeployIn) -> dict:
    """Deploy an app: DNS record, certificate, container, monitoring; a failure rolls the done steps back."""
    host = f"{data.app}.{data.region}.example.test"
    ctx.progress(total=4)
    undo = _deleter(ctx)
    made = []
    for stage, kind, title, name in (
        ("dns", "dns", "create DNS record", host),
        ("certificate", "certificate", "issue certificate", f"*.{host}"),
        ("container", "container", "start container", f"{data.app}-web-1"),
        ("monitoring", "monitor", "register monitoring", f"https://{host}/health"),
    ):
        made.append(
            ctx.step(
                title,
                _creator(ctx, stage, kind, data.fail_at),
                name,
                side_effect=True,
                idempotency_key=True,
                compensate=undo,
                kind="tool",
            )
        )
    ctx.report(f"Deployed {data.app} to {data.region} at https://{host} ({len(made)} resources)")
    return {"url": f"https://{host}", "resources": made}
