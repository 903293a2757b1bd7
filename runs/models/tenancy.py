"""Who runs: tenants, their spend, keys and members; and the operator state of queues and kinds."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Final, TypedDict

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone


class DecimalPlaces(TypedDict):
    max_digits: int
    decimal_places: int


# Every column of money, in cents with six decimal places: ``DecimalField(**MONEY)``.
MONEY: Final[DecimalPlaces] = {"max_digits": 18, "decimal_places": 6}


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64, unique=True)
    max_running = models.PositiveIntegerField(default=3)
    max_queued = models.PositiveIntegerField(default=1000)
    # Its share of the workers' free slots against other tenants with runnable work (fair share,
    # runs/sql/claim.sql): the claim starts first the runs of the tenant with the fewest running
    # per unit of weight. A tenant of weight 3 beside one of weight 1 gets three slots to its one.
    weight = models.PositiveIntegerField(default=1)
    default_cost_ceiling_cents = models.DecimalField(**MONEY, null=True, blank=True)
    daily_cost_cap_cents = models.DecimalField(**MONEY, null=True, blank=True)
    paused = models.BooleanField(default=False)
    # The kinds its API keys and members may start (runs.kinds), set by an operator (the admin,
    # `manage.py allowkinds`); null: every kind that is public. It only narrows: a task kind or a
    # kind registered with public=False is never startable by a tenant, listed here or not.
    allowed_kinds = ArrayField(
        models.CharField(max_length=200), null=True, blank=True, default=None
    )
    # Live count of the tenant's running runs, plus the slots of runs that
    # left running and whose worker gives them back with its next claim:
    # changed only by the claim's guarded update and the one exit from
    # running; the reaper sets it to the truth (see runs.engine.reaping).
    running = models.IntegerField(default=0, editable=False)
    # When the reaper last set `running` to the truth (the database's clock,
    # read after its count): a slot given back later counts only for a run
    # that left running after this (runs.engine.claim).
    running_reconciled_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Approximate count of its queued runs, for backpressure (max_queued):
    # raised after a submit commits, lowered by the claim, raised by an exit
    # to queued; the reaper reconciles it. A count per submit would cost
    # O(max_queued).
    queued = models.IntegerField(default=0, editable=False)
    # Standard Webhooks signing secrets (whsec_...), made on first use; after a
    # rotation the previous one keeps signing too until previous_until
    # (runs.webhooks.signing). Shown only by `manage.py webhooksecret`.
    webhook_secret = models.CharField(max_length=100, blank=True, default="", editable=False)
    webhook_secret_previous = models.CharField(
        max_length=100, blank=True, default="", editable=False
    )
    webhook_secret_previous_until = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(running__gte=0), name="tenant_running_non_negative"),
            models.CheckConstraint(condition=Q(weight__gte=1), name="tenant_weight_positive"),
        ]

    def __str__(self) -> str:
        return self.slug


class TenantDailyCost(models.Model):
    """Money a tenant spent on one UTC day; written by checkpoints, read by the claim (daily cap)."""

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="daily_costs", db_index=False
    )
    day = models.DateField()
    cost_cents = models.DecimalField(**MONEY, default=Decimal(0))

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "day"], name="tenantdailycost_unique_tenant_day"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.day}: {self.cost_cents}"


class Pausable(models.Model):
    """Operator state of something workers claim from; with no row it is active."""

    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    # Its global limit across every worker and tenant (runs.engine.limits); null: none.
    max_running = models.PositiveIntegerField(null=True, blank=True)
    # Live count of its running runs while a limit is set (0 otherwise): changed only by the
    # claim's guarded update and the exit from running; the reaper sets it to the truth.
    running = models.IntegerField(default=0, editable=False)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.pk}{' (paused)' if self.paused else ''}"


class Queue(Pausable):
    """Operator state of a queue."""

    name = models.CharField(max_length=64, primary_key=True)


class KindState(Pausable):
    """Operator state of an agent kind."""

    name = models.CharField(max_length=100, primary_key=True)


class ApiKey(models.Model):
    class Scope(models.TextChoices):
        READ = "runs:read"  # read runs, steps, kinds
        WRITE = "runs:write"  # submit and control runs
        APPROVE = "runs:approve"  # approve, reject and resolve

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, db_index=True)
    secret_sha256 = models.CharField(max_length=64, unique=True)
    scopes = ArrayField(models.CharField(max_length=32, choices=Scope.choices), default=list)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


class Membership(models.Model):
    class Role(models.TextChoices):
        VIEWER = "viewer"  # reads
        OPERATOR = "operator"  # also submits, cancels, pauses, resumes, retries, messages
        APPROVER = "approver"  # also approves, rejects and resolves

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant"], name="membership_unique_user_tenant"
            ),
            models.CheckConstraint(
                condition=Q(role__in=["viewer", "operator", "approver"]),
                name="membership_role_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


class RateLimit(models.Model):
    """What the runs of every worker may spend together on something shared (runs.engine.ratelimits).

    ``key`` names it: a model call is limited by ``llm:<provider>:<model>``
    if that limit exists, else by ``llm:<provider>``. Null limits do not
    apply; ``per_tenant_share`` (0 < share <= 1) caps what one tenant may take
    of each. A provider's 429 with Retry-After pauses the key for everyone
    until ``paused_until``.
    """

    key = models.CharField(max_length=200, primary_key=True)
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    per_tenant_share = models.FloatField(null=True, blank=True)
    paused_until = models.DateTimeField(null=True, blank=True, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(per_tenant_share__isnull=True)
                | Q(per_tenant_share__gt=0, per_tenant_share__lte=1),
                name="ratelimit_share_in_range",
            ),
        ]

    def __str__(self) -> str:
        return self.key


class RateReservation(models.Model):
    """One call's capacity under a RateLimit: reserved before it is sent, settled with its usage."""

    id = models.BigAutoField(primary_key=True)
    limit = models.ForeignKey(RateLimit, on_delete=models.CASCADE, db_index=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, null=True, db_index=False)
    run_id = models.UUIDField(null=True)
    at = models.DateTimeField()  # the database's clock
    tokens = models.PositiveIntegerField(default=0)  # reserved, then what the call reported
    settled = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["limit", "at"], name="ratereservation_window_idx")]

    def __str__(self) -> str:
        return f"{self.limit_id} at {self.at:%H:%M:%S}: {self.tokens} tokens"
