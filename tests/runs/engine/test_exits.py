"""Typed exits and checkpoints: the values that leave running or record a step, and the committer that writes them.

An ``Exit`` says what a run asks for (done, a retry, a park...); the exit
statement decides what it reaches, a cancel or pause that landed meanwhile
winning, and answers it as a ``RunStatus``. The worker's committer takes
every such write, and alone decides which go in a batch.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from django.utils import timezone

from runs.engine import claim as claims
from runs.engine import recordset
from runs.engine import steps as checkpoint
from runs.engine.exit import Exit, leave
from runs.models import Event, Message, Run, Step, WebhookDelivery
from runs.queries import queries
from runs.services import submit_run
from runs.states import RunStatus
from tests.conftest import fresh
from tests.support.run_states import force_status
from workers.committer import Committer

WORKER_ID = uuid4()


def claim_runs(tenant, n, *, kind="noop3", **submit):
    runs = [submit_run(tenant=tenant, kind=kind, input={}, **submit) for _ in range(n)]
    claimed = claims.claim(worker_id=WORKER_ID, queues=["default"], kinds={kind: 1}, n=n, lease=60)
    assert len(claimed) == n
    by_id = {c.id: c for c in claimed}
    return [by_id[run.id] for run in runs]


def finished_step(claimed=None, *, seq=1, name="s1", kind="custom", **record):
    return checkpoint.StepRecord(
        run_id=uuid4() if claimed is None else claimed.id,
        token=1 if claimed is None else claimed.lease_token,
        generation=1 if claimed is None else claimed.generation,
        seq=seq,
        name=name,
        kind=kind,
        input=None,
        started_at=datetime.now(UTC),
        **record,
    )


SAMPLE = "SELECT p.* FROM json_to_recordset(%(rows)s::json) AS p(run uuid, n int, note text)"


def sample_row(*fields):
    """A frozen dataclass of ``fields`` (name, type[, field]), checked against ``SAMPLE``'s columns."""
    made = dataclasses.make_dataclass(
        "Sample", fields, bases=(recordset.Row,), frozen=True, kw_only=True
    )
    return recordset.row_of(SAMPLE)(made)


@pytest.fixture
def committer():
    running = Committer(worker_id=WORKER_ID, lease=60)
    running.start()
    yield running
    running.stop()


class TestExitsThatCannotBe:
    def test_a_run_cannot_be_asked_to_fail_on_an_error_that_is_retried_or_waits_for_a_person(self):
        for kind in ("retryable", "ambiguous", ""):
            with pytest.raises(ValueError, match="fails for good"):
                Exit.fail(reason="error", error="boom", error_kind=kind)

    @pytest.mark.parametrize("target", [RunStatus.RUNNING, RunStatus.PAUSED, "finished"])
    def test_an_exit_asks_for_a_status_a_run_can_leave_running_for(self, target):
        with pytest.raises(ValueError):
            Exit(target=target, reason="x")

    def test_a_result_belongs_to_a_done_run_only(self):
        with pytest.raises(ValueError, match="result"):
            dataclasses.replace(Exit.done(result="{}"), target=RunStatus.FAILED)
        with pytest.raises(ValueError, match="result"):
            Exit(target=RunStatus.DONE, reason="finished")

    def test_waiting_and_waking_go_with_the_statuses_that_wait(self):
        with pytest.raises(ValueError, match="time to wake"):
            dataclasses.replace(Exit.sleep(until=timezone.now()), target=RunStatus.WAITING_HUMAN)
        with pytest.raises(ValueError, match="not both"):
            dataclasses.replace(Exit.await_message(), wake_on_children=True)
        with pytest.raises(ValueError, match="negative"):
            Exit.retry(error="503", delay=-1, error_class="HTTPError")
        with pytest.raises(ValueError, match="failed attempt"):
            dataclasses.replace(Exit.done(result="{}"), add_failure=True)
        with pytest.raises(ValueError, match="rollback"):
            Exit.rolled_back(RunStatus.QUEUED, compensation="done")

    def test_an_unknown_outcome_is_refused_before_anything_is_written(self):
        with pytest.raises(ValueError, match="unknown outcome 'great'"):
            Exit.done(result="{}").reporting(outcome="great", summary="")

    def test_an_exit_that_names_no_run_writes_nothing(self):
        with pytest.raises(ValueError, match="names its run"):
            leave(Exit.done(result="{}"))

    def test_untrusted_text_is_made_storable_however_the_exit_is_built(self):
        exit = Exit.fail(reason="error", error="nul\x00 here", error_kind="fatal")
        assert exit.error == "nul\ufffd here"
        reported = exit.reporting(outcome="partial", summary="two\nlines")
        assert reported.summary == "two lines"


class TestDeclaredOnce:
    @pytest.mark.parametrize(
        ("value", "statement"),
        [
            (
                Exit.retry(error="e", delay=1, error_class="E").of_run(uuid4(), 1, parent=uuid4()),
                queries.leave_running,
            ),
            (
                checkpoint.Checkpoint.of(finished_step(), output={"a": 1}, steps_total=3),
                queries.checkpoint,
            ),
        ],
        ids=["exit", "checkpoint"],
    )
    def test_a_value_sends_exactly_the_columns_its_statement_declares_and_the_statement_reads_each(
        self, value, statement
    ):
        declared = [name for name, _ in recordset.columns(statement)]
        [row] = json.loads(recordset.rows([value]))
        assert (
            list(row) == declared
        )  # Python's own fields (a parent, an error's class) are not sent
        assert declared == [f.name for f in dataclasses.fields(value)][: len(declared)]
        unread = [c for c in declared if not re.search(rf"\b(p|cur)\.{c}\b", statement)]
        assert unread == []  # a column nobody reads would be a value that changes nothing

    def test_a_row_mirrors_its_statements_columns_and_sends_those_only(self):
        Sample = sample_row(
            ("run", UUID | None),
            ("n", int),
            ("note", str),
            (
                "parent",
                UUID | None,
                dataclasses.field(default=None, metadata=recordset.PYTHON_ONLY),
            ),
        )
        assert Sample.COLUMNS == ("run", "n", "note")
        run = uuid4()
        value = Sample(run=run, n=1, note="x", parent=uuid4())
        assert json.loads(recordset.rows([value])) == [{"run": str(run), "n": 1, "note": "x"}]

    @pytest.mark.parametrize(
        ("fields", "named"),
        [
            ([("run", UUID | None), ("n", int)], ["no field for the column(s) note"]),
            (
                [("run", UUID | None), ("count", int), ("note", str)],
                ["no field for the column(s) n", "the field(s) count are no column"],
            ),
            (
                [("run", UUID | None), ("n", float), ("note", str)],
                ["the field n is float, its column int (int)"],
            ),
            (
                [("run", UUID | None), ("note", str), ("n", int)],
                ["the fields are in the order run, note, n"],
            ),
            (
                [("run", UUID | None), ("n", int), ("note", str), ("parent", UUID | None)],
                ["the field(s) parent are no column"],
            ),
        ],
        ids=["missing", "renamed", "wrong-type", "wrong-order", "python-only-unmarked"],
    )
    def test_a_row_whose_fields_are_not_its_statements_columns_is_refused_when_made(
        self, fields, named
    ):
        with pytest.raises(TypeError) as refused:
            sample_row(*fields)
        message = str(refused.value)
        assert message.startswith("Sample is not a row of p(run uuid, n int, note text): ")
        assert [part for part in named if part not in message] == []

    @pytest.mark.parametrize(
        "name", ["checkpoint", "checkpoint_consuming_messages", "checkpoint_compensation"]
    )
    def test_every_checkpoint_statement_reads_the_same_columns(self, name):
        assert recordset.columns(getattr(queries, name)) == recordset.columns(queries.checkpoint)


@pytest.mark.django_db(transaction=True)
class TestReachedStatus:
    def test_a_cancel_that_lands_while_a_run_finishes_does_not_take_its_result(self, tenant):
        [claimed] = claim_runs(tenant, 1)
        Run.objects.filter(pk=claimed.id).update(cancel_requested_at=timezone.now())
        exited = leave(Exit.done(result='{"ok": true}').of_run(claimed.id, claimed.lease_token))
        assert exited.status is RunStatus.DONE
        run = fresh(Run.objects.get(pk=claimed.id))
        assert (run.status, run.result) == ("done", {"ok": True})

    def test_a_cancel_that_lands_while_a_run_is_released_wins_and_is_told_by_webhook(
        self, tenant, settings
    ):
        settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = True
        [claimed] = claim_runs(tenant, 1, callback_url="http://127.0.0.1:9/hook")
        Run.objects.filter(pk=claimed.id).update(cancel_requested_at=timezone.now())
        exited = leave(Exit.release(reason="released").of_run(claimed.id, claimed.lease_token))
        assert exited.status is RunStatus.CANCELLED and exited.leaves_orphans
        event = Event.objects.filter(run_id=claimed.id).order_by("seq").last()
        assert (event.type, event.payload["reason"]) == ("run.cancelled", "released")
        assert WebhookDelivery.objects.filter(event=event, url="http://127.0.0.1:9/hook").exists()

    def test_a_retry_that_spends_the_last_attempt_reaches_failed(self, tenant):
        [claimed] = claim_runs(tenant, 1, max_attempts=1)
        exit = Exit.retry(error="503", delay=5, error_class="HTTPError")
        exited = leave(exit.of_run(claimed.id, claimed.lease_token))
        assert exited.status is RunStatus.FAILED
        run = Run.objects.get(pk=claimed.id)
        assert (run.error_kind, run.error, run.failures) == ("retryable", "503", 1)

    def test_a_rescue_leaves_a_lease_that_has_not_expired_alone(self, tenant):
        [claimed] = claim_runs(tenant, 1)
        rescue = Exit.rescue(reason="lease_expired", error="gone").of_run(
            claimed.id, claimed.lease_token
        )
        assert leave(rescue) is None
        assert Run.objects.get(pk=claimed.id).status == "running"
        Run.objects.filter(pk=claimed.id).update(locked_until=timezone.now() - timedelta(seconds=1))
        assert leave(rescue).status is RunStatus.QUEUED
        event = Event.objects.filter(run_id=claimed.id).order_by("seq").last()
        assert (event.type, event.actor_type, event.actor_id) == ("run.queued", "system", "reaper")


@pytest.mark.django_db(transaction=True)
class TestTheCommitterTakesEveryWrite:
    def test_exits_through_the_committer_reach_each_run_s_own_status(self, tenant, committer):
        a, b = claim_runs(tenant, 2)
        Run.objects.filter(pk=b.id).update(pause_requested_at=timezone.now())
        release = Exit.release(reason="released")
        reached = [committer.commit(release.of_run(c.id, c.lease_token)).status for c in (a, b)]
        assert reached == [RunStatus.QUEUED, RunStatus.PAUSED]

    def test_a_message_step_s_checkpoint_consumes_its_messages(self, tenant, committer):
        [claimed] = claim_runs(tenant, 1)
        messages = [
            Message.objects.create(run_id=claimed.id, author_type="user", text=t)
            for t in ("a", "b")
        ]
        ids = [m.id for m in messages]
        item = checkpoint.Checkpoint.of(
            finished_step(claimed, name="messages", kind="message"),
            output=[{"id": i} for i in ids],
            steps_total=None,
            consumed_message_ids=ids,
        )
        assert not item.batchable
        answer = committer.commit(item)
        assert answer is not None and json.loads(answer.output) == [{"id": i} for i in ids]
        step = Step.objects.get(run_id=claimed.id, seq=1)
        assert set(Message.objects.values_list("consumed_by_step_id", flat=True)) == {step.id}
        event = Event.objects.get(run_id=claimed.id, type="step.done")
        assert event.payload["messages"] == ids

    def test_a_compensation_s_checkpoint_marks_the_step_it_undid(self, tenant, committer):
        [claimed] = claim_runs(tenant, 1)
        first = committer.commit(
            checkpoint.Checkpoint.of(finished_step(claimed), output=1, steps_total=None)
        )
        assert first is not None
        undo = committer.commit(
            checkpoint.Checkpoint.of(
                finished_step(claimed, seq=2, name="undo s1", kind="compensation", compensates=1),
                output=None,
                steps_total=None,
            )
        )
        assert undo is not None
        assert dict(Step.objects.filter(run_id=claimed.id).values_list("seq", "status")) == {
            1: "compensated",
            2: "done",
        }
        assert Run.objects.get(pk=claimed.id).steps_done == 1  # an undo is not progress

    def test_a_child_s_exit_wakes_its_parent_in_the_same_commit(self, tenant, committer):
        parent = force_status(
            submit_run(tenant=tenant, kind="noop3", input={}), "waiting", children_pending=1
        )
        [child] = claim_runs(tenant, 1, parent=parent)
        Step.objects.create(
            run=parent,
            seq=1,
            name="gather",
            kind="child",
            status="waiting",
            output={"pending": [str(child.id)]},
        )
        exited = committer.commit(
            Exit.done(result="{}").of_run(child.id, child.lease_token, parent=parent.id)
        )
        assert exited.status is RunStatus.DONE and exited.woke_parent == "default"
        assert Run.objects.get(pk=parent.pk).status == "queued"

    def test_a_worker_whose_committer_is_not_running_still_writes_at_once(self, tenant):
        idle = Committer(worker_id=WORKER_ID, lease=60)
        [claimed] = claim_runs(tenant, 1)
        answer = idle.commit(
            checkpoint.Checkpoint.of(finished_step(claimed), output={"x": 1}, steps_total=1)
        )
        assert answer is not None and (answer.cancel, answer.pause) == (False, False)
        exited = idle.commit(Exit.done(result="{}").of_run(claimed.id, claimed.lease_token))
        assert exited.status is RunStatus.DONE
        assert idle.batches == 0  # nothing went through a thread that is not there
