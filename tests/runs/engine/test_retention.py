"""Retention (issue 14): ``reap`` deletes finished runs older than RUNS_RETENTION_DAYS with all they own.

Batches go leaf first and never touch anything live: a live run, a run
finished recently, a child whose parent is live, a webhook delivery still
being retried. A real commit matters wherever a foreign key is involved (the
database checks its deferred constraints there), so those tests commit.
"""

from __future__ import annotations

import signal
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from runs.artifacts import save_artifact
from runs.engine.retention import prune_finished
from runs.models import (
    Artifact,
    Event,
    Message,
    Run,
    Step,
    StepAttempt,
    StreamWatch,
    WebhookDelivery,
    WebhookEndpoint,
)
from runs.states import LIVE_STATUSES, TERMINAL_STATUSES, RunStatus
from tests.support.waiting import wait_until
from workers.reaper import Reaper

MONTH = timedelta(days=30)

pytestmark = pytest.mark.usefixtures("media_root")  # artifacts' files in the test's own folder


def make_run(
    tenant,
    status: str = RunStatus.DONE,
    *,
    finished_days_ago: float | None = None,
    created_days_ago: float | None = None,
    **fields,
) -> Run:
    """A run written straight to the table: finished that many days ago (terminal ones), created before."""
    now = timezone.now()
    created = now - timedelta(
        days=created_days_ago if created_days_ago is not None else (finished_days_ago or 0) + 1
    )
    if finished_days_ago is not None:
        fields.setdefault("finished_at", now - timedelta(days=finished_days_ago))
    if status == RunStatus.RUNNING:
        fields.update(
            lease_token=1,
            locked_by=uuid.uuid4(),
            locked_until=now + timedelta(minutes=5),
            started_at=now,
        )
    return Run.objects.create(
        tenant=tenant, kind="echo", status=status, created_at=created, updated_at=created, **fields
    )


def old(tenant, status: str = RunStatus.DONE, **fields) -> Run:
    """A run finished 40 days ago: past the default retention of 30 days."""
    return make_run(tenant, status, finished_days_ago=40, **fields)


def with_records(run: Run) -> Step:
    """A step, a failed attempt of it, two events and a message the step consumed."""
    step = Step.objects.create(run=run, seq=1, name="fetch", status="done", output={"ok": True})
    StepAttempt.objects.create(step=step, run=run, attempt=1, error="timeout")
    Event.objects.create(run=run, seq=1, type="run.queued", actor_type="api_key")
    Event.objects.create(run=run, seq=2, type="run.done", actor_type="worker")
    Message.objects.create(run=run, author_type="user", text="go on", consumed_by_step=step)
    return step


def exists(run: Run) -> bool:
    return Run.objects.filter(pk=run.pk).exists()


def left(run_id) -> dict[str, int]:
    """How many rows of each table still belong to the run."""
    return {
        "runs": Run.objects.filter(pk=run_id).count(),
        "steps": Step.objects.filter(run_id=run_id).count(),
        "attempts": StepAttempt.objects.filter(run_id=run_id).count(),
        "events": Event.objects.filter(run_id=run_id).count(),
        "messages": Message.objects.filter(run_id=run_id).count(),
        "artifacts": Artifact.objects.filter(run_id=run_id).count(),
        "deliveries": WebhookDelivery.objects.filter(run_id=run_id).count(),
        "watches": StreamWatch.objects.filter(run_id=run_id).count(),
    }


@pytest.mark.django_db(transaction=True)
def test_an_old_finished_run_is_deleted_with_everything_it_owns_and_its_files(tenant, settings):
    run = old(tenant)
    step = with_records(run)
    artifact = save_artifact(run_id=run.pk, name="report", data=b"x" * 10_000)
    Artifact.objects.filter(pk=artifact.pk).update(step=step)
    path = Path(settings.MEDIA_ROOT) / artifact.file.name
    assert path.is_file()
    endpoint = WebhookEndpoint.objects.create(tenant=tenant, url="https://hooks.example.com/runs")
    done = Event.objects.get(run=run, seq=2)
    for status in ("delivered", "dead"):
        WebhookDelivery.objects.create(
            event=done,
            run=run,
            tenant=tenant,
            endpoint=endpoint,
            url=endpoint.url,
            event_type=done.type,
            webhook_id=f"msg_{status}",
            status=status,
            created_at=timezone.now() - timedelta(days=40),
        )
    StreamWatch.objects.create(run_id=run.pk, server=uuid.uuid4())
    # A neighbour finished yesterday, with records of its own: none of them goes.
    young = make_run(tenant, finished_days_ago=1)
    with_records(young)
    young_artifact = save_artifact(run_id=young.pk, name="report", data=b"y" * 10_000)
    before = left(young.pk)

    pruned = prune_finished(older_than=MONTH, batch=500)

    assert (
        pruned.runs,
        pruned.steps,
        pruned.attempts,
        pruned.events,
        pruned.messages,
        pruned.artifacts,
        pruned.deliveries,
        pruned.watches,
    ) == (1, 1, 1, 2, 1, 1, 2, 1)
    assert pruned.files == [artifact.file.name]
    assert left(run.pk) == dict.fromkeys(before, 0)
    assert not path.exists()
    assert left(young.pk) == before
    assert (Path(settings.MEDIA_ROOT) / young_artifact.file.name).is_file()
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()  # the tenant's, not the run's


@pytest.mark.django_db(transaction=True)
def test_an_artifact_whose_file_is_already_gone_does_not_stop_the_batch(tenant, settings):
    run = old(tenant)
    artifact = save_artifact(run_id=run.pk, name="report", data=b"z" * 100)
    (Path(settings.MEDIA_ROOT) / artifact.file.name).unlink()

    assert prune_finished(older_than=MONTH, batch=500).runs == 1
    assert left(run.pk)["artifacts"] == 0


@pytest.mark.django_db
def test_live_runs_of_every_live_status_and_young_finished_runs_stay(tenant):
    live = [make_run(tenant, status, created_days_ago=90) for status in sorted(LIVE_STATUSES)]
    # A queued run that kept an old finished_at (as if retried without clearing it): the status decides.
    live.append(make_run(tenant, RunStatus.QUEUED, finished_days_ago=90))
    young = [
        make_run(tenant, status, finished_days_ago=29, created_days_ago=90)
        for status in sorted(TERMINAL_STATUSES)
    ]
    for run in live + young:
        with_records(run)
    gone = [old(tenant, status) for status in sorted(TERMINAL_STATUSES)]

    assert prune_finished(older_than=MONTH, batch=500).runs == 3

    assert {r.status for r in live} == set(LIVE_STATUSES)
    assert not any(exists(run) for run in gone)
    for run in live + young:
        assert left(run.pk) == {
            "runs": 1,
            "steps": 1,
            "attempts": 1,
            "events": 2,
            "messages": 1,
            "artifacts": 0,
            "deliveries": 0,
            "watches": 0,
        }, run.status


@pytest.mark.django_db(transaction=True)
def test_a_family_goes_leaf_first_one_run_per_batch(tenant):
    # The parent finished first (as if it failed and cancelled its children later): order alone would take it
    # first, but it goes only once it has no children left.
    parent = old(tenant, finished_at=timezone.now() - timedelta(days=60))
    first = old(tenant, parent=parent, finished_at=timezone.now() - timedelta(days=55))
    second = old(tenant, parent=parent, finished_at=timezone.now() - timedelta(days=56))
    grandchild = old(tenant, parent=first, finished_at=timezone.now() - timedelta(days=50))
    for run in (parent, first, second, grandchild):
        with_records(run)
    family = {
        parent.pk: "parent",
        first.pk: "first",
        second.pk: "second",
        grandchild.pk: "grandchild",
    }

    order = []
    for _ in range(4):
        remaining = set(Run.objects.values_list("pk", flat=True))
        assert prune_finished(older_than=MONTH, batch=1).runs == 1
        [deleted] = remaining - set(Run.objects.values_list("pk", flat=True))
        order.append(family[deleted])

    assert order == ["second", "grandchild", "first", "parent"]
    assert prune_finished(older_than=MONTH, batch=1).runs == 0
    assert not Step.objects.exists() and not Event.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_child_stays_while_its_parent_is_live_or_finished_recently(tenant):
    running = make_run(tenant, RunStatus.RUNNING)
    waiting = make_run(tenant, RunStatus.WAITING, created_days_ago=50)
    recent = make_run(tenant, finished_days_ago=2)
    children = [old(tenant, parent=parent) for parent in (running, waiting, recent)]

    assert prune_finished(older_than=MONTH, batch=500).runs == 0
    assert all(exists(child) for child in children)

    # Once its parent is past retention too, the child goes, then the parent.
    Run.objects.filter(pk=recent.pk).update(finished_at=timezone.now() - timedelta(days=31))
    assert prune_finished(older_than=MONTH, batch=500).runs == 1
    assert prune_finished(older_than=MONTH, batch=500).runs == 1
    assert not exists(recent) and not exists(children[2])
    assert exists(children[0]) and exists(children[1])


@pytest.mark.django_db(transaction=True)
def test_forks_of_a_deleted_run_survive_without_their_origin(tenant):
    origin = old(tenant)
    with_records(origin)
    live_fork = make_run(tenant, RunStatus.QUEUED, origin=origin, origin_step=2)
    young_fork = make_run(tenant, finished_days_ago=3, origin=origin, origin_step=1)
    old_fork = old(tenant, origin=origin, origin_step=1)  # goes in the same batch as its origin

    pruned = prune_finished(
        older_than=MONTH, batch=500
    )  # commits: the deferred foreign keys are checked

    assert (pruned.runs, pruned.forks_detached) == (2, 2)
    assert not exists(origin) and not exists(old_fork)
    assert Run.objects.get(pk=live_fork.pk).origin_id is None
    assert Run.objects.get(pk=young_fork.pk).origin_id is None
    assert Run.objects.get(pk=live_fork.pk).origin_step == 2


@pytest.mark.django_db(transaction=True)
def test_batches_are_bounded_oldest_first_and_repeated_calls_finish_the_job(tenant):
    runs = [make_run(tenant, finished_days_ago=40 + i) for i in range(7)]
    for run in runs:
        with_records(run)

    counts = []
    while not counts or counts[-1]:
        remaining = set(Run.objects.values_list("pk", flat=True))
        counts.append(prune_finished(older_than=MONTH, batch=3).runs)
        if len(counts) == 1:
            assert remaining - set(Run.objects.values_list("pk", flat=True)) == {
                r.pk for r in runs[-3:]
            }

    assert counts == [3, 3, 1, 0]
    assert not Run.objects.exists() and not Step.objects.exists() and not Event.objects.exists()


@pytest.mark.django_db
def test_a_run_with_a_webhook_still_being_retried_waits_for_it(tenant):
    run = old(tenant)
    with_records(run)
    event = Event.objects.get(run=run, seq=2)
    delivery = WebhookDelivery.objects.create(
        event=event,
        run=run,
        tenant=tenant,
        url="https://hooks.example.com/",
        event_type=event.type,
        webhook_id="msg_1",
        status="pending",
    )

    assert prune_finished(older_than=MONTH, batch=500).runs == 0

    WebhookDelivery.objects.filter(pk=delivery.pk).update(status="dead")
    assert prune_finished(older_than=MONTH, batch=500).runs == 1


@pytest.mark.django_db
def test_an_explicit_cutoff_time_is_honoured(tenant):
    run = make_run(tenant, finished_days_ago=2)

    assert prune_finished(older_than=timezone.now() - timedelta(days=3), batch=10).runs == 0
    assert prune_finished(older_than=timezone.now() - timedelta(days=1), batch=10).runs == 1
    assert not exists(run)


@pytest.mark.django_db(transaction=True)
def test_the_reaper_prunes_batch_after_batch_until_a_short_one(tenant, settings):
    settings.RUNS_RETENTION_BATCH = 2
    settings.RUNS_RETENTION_PAUSE_SECONDS = 0
    runs = [old(tenant) for _ in range(5)]

    assert Reaper().prune() == 5
    assert not any(exists(run) for run in runs)


@pytest.mark.django_db(transaction=True)
def test_a_prune_pass_stops_at_its_time_cap_and_when_the_reaper_stops(tenant, settings):
    settings.RUNS_RETENTION_BATCH = 2
    settings.RUNS_RETENTION_MAX_SECONDS = 0
    for _ in range(5):
        old(tenant)
    reaper = Reaper()

    assert reaper.prune() == 2  # one batch, then the cap

    settings.RUNS_RETENTION_MAX_SECONDS = 60
    reaper.stopping.set()
    assert reaper.prune() == 2  # one batch, then it stops at once instead of pausing
    assert Run.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_retention_days_zero_keeps_everything(tenant, settings):
    settings.RUNS_RETENTION_DAYS = 0
    run = make_run(tenant, finished_days_ago=3650)

    assert Reaper().prune() == 0
    assert exists(run)

    settings.RUNS_RETENTION_DAYS = 30
    assert Reaper().prune() == 1
    assert not exists(run)


@pytest.mark.django_db(transaction=True)
def test_reap_once_prunes_and_says_how_many(tenant, processes):
    run = old(tenant)
    with_records(run)
    young = make_run(tenant, finished_days_ago=1)

    kept = processes.run("reap", "--once", RUNS_RETENTION_DAYS="0")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "pruned=0" in kept.stdout and exists(run)

    reaped = processes.run("reap", "--once")
    assert reaped.returncode == 0, reaped.stdout + reaped.stderr
    assert "pruned=1" in reaped.stdout, reaped.stdout
    assert set(left(run.pk).values()) == {0}
    assert exists(young)


@pytest.mark.django_db(transaction=True)
def test_a_running_reaper_prunes_on_its_own_and_stops_on_sigterm(tenant, processes):
    run = old(tenant)
    with_records(run)

    reaper = processes.manage("reap", "--interval", "0.2", RUNS_RETENTION_DAYS="30")
    wait_until(lambda: not exists(run), timeout=30, what="the reaper to prune the old run")
    reaper.send_signal(signal.SIGTERM)
    assert reaper.wait(15) == 0, processes.output(reaper)
