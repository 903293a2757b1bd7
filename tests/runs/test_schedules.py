"""Schedules (runs.schedules): one run per fire time, however many reapers fire them; catch-up and overlap.

The minute-long test runs real ``reap`` and ``runworker`` processes; the
others call the reaper's pass in the test process with the clock set by
the schedule's own times.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from runs import schedules
from runs.db import db_now
from runs.metrics.process import SCHEDULE_FIRES
from runs.models import Run, Schedule
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until

processes_db = pytest.mark.django_db(transaction=True)


def fire_times(schedule: Schedule) -> list[datetime]:
    keys = Run.objects.filter(schedule=schedule).values_list("idempotency_key", flat=True)
    # schedule:<id>:<fire time>
    return sorted(datetime.fromisoformat(key.split(":", 2)[2]) for key in keys)


def make(tenant, *, every: int, created_ago: float, **fields) -> Schedule:
    now = db_now()
    schedule = Schedule(tenant=tenant, kind="noop3", input={}, every_seconds=every, **fields)
    schedule.created_at = now - timedelta(seconds=created_ago)
    schedule.next_fire_at = schedules.next_fire_after(schedule, schedule.created_at)
    schedule.save()
    return schedule


@processes_db
def test_every_2_s_with_two_reapers_one_run_per_fire_time_none_missed_over_a_minute(processes):
    tenant = TenantFactory(max_running=20)
    schedule = make(tenant, every=2, created_ago=0.5, overlap="allow")
    processes.worker("--concurrency", "4", "--poll", "0.2")
    reapers = [processes.manage("reap", "--interval", "0.5") for _ in range(2)]
    time.sleep(61)  # the test's subject is a minute of fire times
    for reaper in reapers:
        reaper.terminate()
    for reaper in reapers:
        reaper.wait(30)
    wait_until(
        lambda: not Run.objects.filter(schedule=schedule).exclude(status="done").exists(),
        what="the scheduled runs done",
    )
    processes.stop_all()

    schedule.refresh_from_db()
    times = fire_times(schedule)
    print(f"\n{len(times)} runs over 61 s, {schedule.missed} missed")
    assert len(times) == len(set(times)) == schedule.fires  # one run per fire time
    assert len(times) >= 29
    gaps = {(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)}
    assert gaps == {2.0}, gaps  # none missed between the first and the last
    assert schedule.missed == 0
    assert times[0] == schedule.created_at + timedelta(seconds=2)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "catch_up, runs, missed",
    [("one", 1, 5), ("none", 0, 6), ("all", 6, 0)],
)
def test_a_stopped_scheduler_catches_up_per_policy(tenant, processes, catch_up, runs, missed):
    # Every 10 minutes since 65 minutes ago, and no reaper ran: the latest time is 5 minutes late.
    schedule = make(tenant, every=600, created_ago=3900, catch_up=catch_up, overlap="allow")

    reaped = processes.run("reap", "--once")  # the scheduler starts again

    assert reaped.returncode == 0, reaped.stderr
    assert f"scheduled={runs} missed={missed}" in reaped.stdout + reaped.stderr
    schedule.refresh_from_db()
    assert (schedule.fires, schedule.missed) == (runs, missed)
    assert Run.objects.filter(schedule=schedule).count() == runs
    if catch_up == "one":
        assert fire_times(schedule) == [schedule.created_at + timedelta(seconds=3600)]
    assert schedule.next_fire_at == schedule.created_at + timedelta(seconds=4200)
    assert schedules.fire_due().fired == 0  # nothing more is due


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "overlap, second",
    [("skip", None), ("enqueue", "waiting"), ("allow", "queued"), ("cancel_running", "queued")],
)
def test_overlap_is_a_concurrency_key_policy_on_the_schedules_runs(tenant, overlap, second):
    schedule = make(tenant, every=60, created_ago=61, overlap=overlap)
    skipped_before = SCHEDULE_FIRES.labels(outcome="overlap")._value.get()
    assert schedules.fire_due().fired == 1
    first = Run.objects.get(schedule=schedule)
    assert first.status == "queued"  # no worker: it stays live
    Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=timezone.now())
    schedules.fire_due()

    later = Run.objects.filter(schedule=schedule).exclude(pk=first.pk)
    schedule.refresh_from_db()
    if second is None:
        assert not later.exists()
        assert schedule.missed == 1 and "skipped" in schedule.last_error
        assert SCHEDULE_FIRES.labels(outcome="overlap")._value.get() - skipped_before == 1
    else:
        assert later.get().status == second
    if overlap == "cancel_running":
        assert Run.objects.get(pk=first.pk).status == "cancelled"


@pytest.mark.django_db
def test_the_api_creates_lists_changes_and_deletes_schedules(api, tenant):
    def call(method, url, body=None):
        return getattr(api, method)(
            url, json.dumps(body) if body is not None else None, content_type="application/json"
        )

    created = call(
        "post",
        "/api/schedules",
        {"kind": "noop3", "cron": "*/5 * * * *", "timezone": "Europe/Paris"},
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["cron"] == "*/5 * * * *" and body["every_seconds"] is None
    next_fire = datetime.fromisoformat(body["next_fire_at"])
    assert next_fire > timezone.now() and next_fire.minute % 5 == 0

    for bad, word in (
        ({"kind": "noop3", "cron": "every day"}, "cron"),
        ({"kind": "noop3", "cron": "* * * * *", "every_seconds": 5}, "either"),
        ({"kind": "noop3"}, "either"),
        ({"kind": "noop3", "every_seconds": 0}, "every_seconds"),
        ({"kind": "noop3", "every_seconds": 5, "timezone": "Mars/Olympus"}, "timezone"),
        ({"kind": "no_such_kind", "every_seconds": 5}, "kind"),
        ({"kind": "steps", "every_seconds": 5, "input": {"steps": 0}}, "steps"),
        ({"kind": "noop3", "every_seconds": 5, "overlap": "sometimes"}, "overlap"),
    ):
        refused = call("post", "/api/schedules", bad)
        assert refused.status_code == 422, (bad, refused.content)
        assert word in refused.json()["detail"], (bad, refused.json())
    assert Schedule.objects.count() == 1

    url = f"/api/schedules/{body['id']}"
    assert call("get", "/api/schedules").json()["items"][0]["id"] == body["id"]
    assert call("get", url).json()["timezone"] == "Europe/Paris"
    paused = call("patch", url, {"enabled": False})
    assert paused.status_code == 200 and paused.json()["next_fire_at"] is None
    changed = call("patch", url, {"enabled": True, "every_seconds": 30})
    assert changed.json()["cron"] is None and changed.json()["every_seconds"] == 30
    assert changed.json()["next_fire_at"] is not None

    other = TenantFactory()
    theirs = Schedule.objects.create(tenant=other, kind="noop3", every_seconds=60)
    assert call("get", f"/api/schedules/{theirs.pk}").status_code == 404
    assert call("delete", f"/api/schedules/{theirs.pk}").status_code == 404

    schedule = Schedule.objects.get(pk=body["id"])
    schedule.next_fire_at = timezone.now() - timedelta(seconds=1)
    schedule.save()
    schedules.fire_due()
    run = Run.objects.get(schedule=schedule)
    listed = call("get", f"/api/runs?schedule={schedule.pk}").json()["items"]
    assert [r["id"] for r in listed] == [str(run.pk)] and listed[0]["schedule_id"] == str(
        schedule.pk
    )

    assert call("delete", url).status_code == 204
    assert not Schedule.objects.filter(pk=body["id"]).exists()
    assert Run.objects.get(pk=run.pk).schedule_id is None  # its runs stay


@pytest.mark.django_db
def test_an_operator_adds_and_disables_a_schedule_in_the_admin(admin_client, tenant):
    form = {
        "tenant": tenant.pk,
        "name": "nightly",
        "kind": "noop3",
        "input": "{}",
        "cron": "0 3 * * *",
        "timezone": "UTC",
        "overlap": "skip",
        "catch_up": "one",
        "enabled": "on",
    }
    refused = admin_client.post("/admin/runs/schedule/add/", form | {"cron": "at three"})
    assert refused.status_code == 200 and b"not a cron expression" in refused.content
    admin_client.post("/admin/runs/schedule/add/", form)
    schedule = Schedule.objects.get(name="nightly")
    assert schedule.next_fire_at is not None and schedule.next_fire_at.hour == 3
    listed = admin_client.get("/admin/runs/schedule/").content.decode()
    assert "nightly" in listed
    admin_client.post(
        "/admin/runs/schedule/", {"action": "disable", "_selected_action": [schedule.pk]}
    )
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.next_fire_at) == (False, None)
