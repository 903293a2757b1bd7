"""What a run says about itself: ctx.report() stored with the run's exit, replayed, shown by the API."""

from __future__ import annotations

import os
import signal
from collections import Counter
from uuid import uuid4

import pytest
from django.utils import timezone

import tests.support.agents_outcome  # noqa: F401  (registers the kinds in this process)
from examples.crm.models import LeadUpdate
from runs.control import approve_run, reject_run
from runs.engine import claim as claims
from runs.engine.exit import Exit, leave
from runs.models import Event, Run
from runs.services import Actor, submit_run
from runs.states import RunOutcome
from tests.conftest import fresh
from tests.support.agents import executions
from tests.support.factories import make_lead
from tests.support.fake_openai import drive
from tests.support.waiting import wait_until

pytest_plugins = ["tests.support.fake_openai"]  # the offline fixture
pytestmark = pytest.mark.django_db(transaction=True)

PERSON = Actor(type="user", id="42")
MODULES = os.environ.get("AGENT_MODULES", "tests.support.agents") + ",tests.support.agents_outcome"


def done_event(run):
    return Event.objects.filter(run=run, type__in=["run.done", "run.failed", "run.cancelled"]).get()


def test_a_report_is_stored_with_the_run_and_told_in_its_last_event(tenant):
    run = submit_run(
        tenant=tenant, kind="reporter", input={"summary": "Sent 3 invoices", "outcome": "succeeded"}
    )
    [run] = drive(run)
    assert (run.status, run.outcome, run.summary) == ("done", "succeeded", "Sent 3 invoices")
    assert run.get_outcome_display() == "Succeeded"
    payload = done_event(run).payload
    assert (payload["outcome"], payload["summary"]) == ("succeeded", "Sent 3 invoices")


def test_a_run_that_reports_nothing_keeps_a_blank_outcome(tenant):
    run = submit_run(tenant=tenant, kind="silent", input={})
    [run] = drive(run)
    assert (run.status, run.outcome, run.summary) == ("done", "", "")
    assert "outcome" not in done_event(run).payload


def test_the_outcome_may_be_given_by_its_value_and_the_last_report_wins(tenant):
    run = submit_run(
        tenant=tenant,
        kind="reporter",
        input={"summary": "Nothing to do today", "outcome": "unchanged", "report_twice": True},
    )
    [run] = drive(run)
    assert (run.status, run.outcome, run.summary) == (
        "done",
        RunOutcome.UNCHANGED,
        "Nothing to do today",
    )


def test_the_summary_is_made_one_bounded_line(tenant):
    hostile = "Moved\n\tthe lead\x00 to\x07won \u202eevil\ud800 " + "x" * 1000
    run = submit_run(tenant=tenant, kind="reporter", input={"summary": "placeholder"})
    # A lone surrogate cannot even be submitted; the agent's own text can carry one.
    Run.objects.filter(pk=run.pk).update(input={"summary": "placeholder"})
    [claimed] = claims.claim(
        worker_id=uuid4(), queues=["default"], kinds={"reporter": 1}, n=1, lease=60
    )
    assert leave(
        Exit.done(result="{}")
        .of_run(run.id, claimed.lease_token)
        .reporting(outcome="partial", summary=hostile)
    )
    run = fresh(run)
    assert run.summary.startswith("Moved the lead to won evil x")
    assert len(run.summary) == 300 and run.summary.endswith("…")
    assert not any(ch in run.summary for ch in "\n\t\x00\x07\u202e\ud800")


def test_an_unknown_outcome_fails_the_run_with_a_readable_error(tenant):
    run = submit_run(tenant=tenant, kind="reporter", input={"outcome": "great"})
    [run] = drive(run)
    assert (run.status, run.error_kind) == ("failed", "fatal")
    assert "unknown outcome 'great'" in run.error and "'succeeded'" in run.error
    assert run.outcome == ""


def test_a_run_that_fails_after_reporting_keeps_what_it_reported(tenant):
    run = submit_run(
        tenant=tenant,
        kind="reporter",
        input={"summary": "Imported 40 of 50 rows", "outcome": "partial", "fail": True},
    )
    [run] = drive(run)
    assert (run.status, run.outcome, run.summary) == ("failed", "partial", "Imported 40 of 50 rows")


def test_a_run_whose_work_was_rolled_back_keeps_no_report(tenant):
    run = submit_run(tenant=tenant, kind="reports_then_rolls_back", input={})
    [run] = drive(run)
    assert (run.status, run.compensation) == ("failed", "done")
    assert (run.outcome, run.summary) == ("", "")


def test_the_report_costs_no_statement_of_its_own(tenant, django_assert_num_queries):
    run = submit_run(tenant=tenant, kind="silent", input={})
    [claimed] = claims.claim(
        worker_id=uuid4(), queues=["default"], kinds={"silent": 1}, n=1, lease=60
    )
    with django_assert_num_queries(
        1
    ):  # the exit, as a worker writes it (its next claim gives the slot back)
        leave(
            Exit.done(result="{}")
            .of_run(run.id, claimed.lease_token, give_slot=False)
            .reporting(outcome="succeeded", summary="All good")
        )
    assert fresh(run).summary == "All good"


def test_a_parked_run_stores_no_report_until_it_ends(tenant):
    run = submit_run(tenant=tenant, kind="silent", input={})
    [claimed] = claims.claim(
        worker_id=uuid4(), queues=["default"], kinds={"silent": 1}, n=1, lease=60
    )
    leave(
        Exit.release(reason="retry")
        .of_run(run.id, claimed.lease_token)
        .reporting(outcome="succeeded", summary="too early")
    )
    assert (fresh(run).status, fresh(run).outcome, fresh(run).summary) == ("queued", "", "")


def test_a_replayed_run_reports_again_without_running_its_steps_again(tenant, tmp_path):
    log = str(tmp_path / "exec.log")
    run = submit_run(
        tenant=tenant,
        kind="reporter",
        input={
            "summary": "Synced the calendar",
            "log": log,
            "flaky_marker": str(tmp_path / "failed-once"),
        },
    )
    [run] = drive(run)
    assert (run.status, run.attempt) == ("done", 2)  # the step after the report failed once
    assert (run.outcome, run.summary) == ("succeeded", "Synced the calendar")
    assert Counter(name for _, _, name, _ in executions(log)) == {"before": 1, "after": 2}


def test_a_report_survives_a_killed_worker(tenant, processes, tmp_path):
    log = str(tmp_path / "exec.log")
    block = tmp_path / "block"
    block.touch()
    run = submit_run(
        tenant=tenant,
        kind="reporter",
        input={
            "summary": "Renewed the certificate",
            "log": log,
            "block_file": str(block),
        },
    )
    first = processes.worker(
        "--lease", "3", "--heartbeat", "1", "--poll", "0.2", AGENT_MODULES=MODULES
    )
    # It reported (in memory) and is blocked in the step after: kill it there.
    wait_until(
        lambda: any(name == "after" for _, _, name, _ in executions(log)),
        what="the step after the report",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    block.unlink()
    assert (fresh(run).outcome, fresh(run).summary) == ("", "")
    wait_until(
        lambda: fresh(run).locked_until < timezone.now(), timeout=10, what="the lease to expire"
    )
    reaped = processes.run("reap", "--once", AGENT_MODULES=MODULES)
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr

    second = processes.worker("--burst", AGENT_MODULES=MODULES)
    assert second.wait(60) == 0, processes.output(second)
    run = fresh(run)
    assert (run.status, run.attempt) == ("done", 2)
    assert (run.outcome, run.summary) == ("succeeded", "Renewed the certificate")
    assert Counter(name for _, _, name, _ in executions(log)) == {"before": 1, "after": 2}


def test_the_api_shows_title_outcome_and_summary(tenant, api):
    run = submit_run(
        tenant=tenant, kind="reporter", input={"summary": "Closed 2 tickets", "outcome": "partial"}
    )
    [run] = drive(run)
    body = api.get(f"/api/runs/{run.id}").json()
    assert (body["title"], body["outcome"], body["summary"]) == (
        "Closed 2 tickets",
        "partial",
        "Closed 2 tickets",
    )
    [listed] = api.get("/api/runs").json()["items"]
    assert (listed["title"], listed["outcome"], listed["summary"]) == (
        "Closed 2 tickets",
        "partial",
        "Closed 2 tickets",
    )
    queued = submit_run(tenant=tenant, kind="silent", input={})
    body = api.get(f"/api/runs/{queued.id}").json()
    assert (body["title"], body["outcome"], body["summary"]) == ("", "", "")


# The built-in kinds.


def crm_until_approval(tenant, lead):
    run = submit_run(
        tenant=tenant,
        kind="crm_update",
        input={"lead_id": lead.pk, "instruction": "They signed the contract today"},
    )
    [run] = drive(run)
    assert run.status == "waiting_human", run.error
    assert (run.outcome, run.summary) == ("", "")
    return run


def test_an_approved_crm_update_succeeded_and_says_what_moved(tenant, offline):
    lead = make_lead(tenant)
    run = crm_until_approval(tenant, lead)
    assert run.title == f"Lead {lead.pk}: They signed the contract today"
    approve_run(run=run, actor=PERSON, comment="yes")
    [run] = drive(run)
    assert (run.status, run.outcome) == ("done", "succeeded")
    assert run.summary == "Moved Kim Lee (Acme) to won and added a note"


def test_a_rejected_crm_update_is_done_but_changed_nothing(tenant, offline):
    lead = make_lead(tenant)
    run = crm_until_approval(tenant, lead)
    reject_run(run=run, actor=PERSON, comment="not yet")
    [run] = drive(run)
    assert (run.status, run.outcome) == ("done", "unchanged")
    assert run.get_outcome_display() == "Nothing changed"
    assert (
        run.summary == "The update of Kim Lee (Acme) was rejected by a person: nothing was written"
    )
    assert not LeadUpdate.objects.exists()


def test_a_crm_update_of_a_missing_lead_changed_nothing(tenant, offline):
    run = submit_run(
        tenant=tenant,
        kind="crm_update",
        input={"lead_id": 999999, "instruction": "They called back"},
    )
    [run] = drive(run)
    assert (run.status, run.outcome) == ("done", "unchanged")
    assert run.summary == "Lead 999999 was not found: nothing was written"


def test_the_other_built_in_kinds_report_what_they_did(tenant, offline):
    brief = submit_run(
        tenant=tenant, kind="research_brief", input={"topic": "Acme Robotics", "depth": 2}
    )
    deploy = submit_run(
        tenant=tenant, kind="deploy_app", input={"app": "shop", "region": "eu-west"}
    )
    research = submit_run(
        tenant=tenant,
        kind="research",
        input={"question": "How does a worker avoid running a step twice after a crash?"},
    )
    brief, deploy, research = drive(brief, deploy, research)
    assert brief.outcome == "succeeded"
    assert (
        brief.summary.startswith("Wrote a brief on Acme Robotics:")
        and "from 2 sources" in brief.summary
    )
    assert (deploy.title, deploy.outcome) == ("Deploy shop to eu-west", "succeeded")
    assert (
        deploy.summary
        == "Deployed shop to eu-west at https://shop.eu-west.example.test (4 resources)"
    )
    assert research.outcome == "succeeded" and research.summary.startswith("Answered from ")


def test_a_failed_deploy_that_rolled_back_reports_nothing(tenant, offline):
    run = submit_run(
        tenant=tenant, kind="deploy_app", input={"app": "shop", "fail_at": "container"}
    )
    [run] = drive(run)
    assert (run.status, run.compensation, run.outcome, run.summary) == ("failed", "done", "", "")
