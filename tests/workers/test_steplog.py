"""The step log of one execution (workers.steplog): positions, the replay lookup and the one nondeterminism check."""

import pytest

from runs.engine.steplog import RecordedStep
from workers.errors import NonDeterministic, StopRun
from workers.steplog import StepLog


def recorded(seq, name, status="done", output=None, kind="custom"):
    return RecordedStep(seq=seq, name=name, status=status, output=output, kind=kind)


def test_positions_are_taken_one_after_another_from_one():
    log = StepLog()
    assert (log.last_taken, log.next_seq, log.end) == (0, 1, 0)
    assert [log.take(name).seq for name in ("a", "b", "c")] == [1, 2, 3]
    assert (log.last_taken, log.next_seq, log.end) == (3, 4, 3)


def test_replay_finds_the_finished_step_at_its_position_and_nothing_past_the_log():
    log = StepLog(
        {1: recorded(1, "fetch", output={"n": 1}), 2: recorded(2, "pay", status="running")}
    )
    first, second, third = log.take("fetch"), log.take("pay"), log.take("mail")
    assert (first.done, first.recorded.output) == (True, {"n": 1})
    assert (second.done, second.recorded.status) == (
        False,
        "running",
    )  # written ahead, not finished
    assert (third.done, third.recorded) == (False, None)


def test_a_different_name_at_a_recorded_position_is_nondeterministic_naming_both():
    log = StepLog({1: recorded(1, "old_name")})
    with pytest.raises(NonDeterministic) as caught:
        log.take("new_name")
    error = caught.value
    assert (
        isinstance(error, StopRun) and error.error_kind == "nondeterministic"
    )  # the run fails nondeterministic
    assert (error.seq, error.recorded, error.requested) == (1, "old_name", "new_name")
    assert "'old_name'" in str(error) and "'new_name'" in str(error) and "step 1" in str(error)


def test_the_mismatch_says_what_kind_of_operation_asked():
    log = StepLog({1: recorded(1, "deploy", kind="approval")})
    with pytest.raises(NonDeterministic, match="runs approval 'ship'"):
        log.take("ship", what="approval")


def test_a_mismatch_takes_no_position():
    log = StepLog({1: recorded(1, "a")})
    with pytest.raises(NonDeterministic):
        log.take("b")
    assert log.last_taken == 0


def test_peek_checks_the_name_without_taking_the_position():
    log = StepLog({1: recorded(1, "messages", kind="message")})
    peeked = log.peek("messages")
    assert (peeked.seq, log.last_taken, log.next_seq) == (1, 0, 1)
    with pytest.raises(NonDeterministic):
        log.peek("spawn child")
    assert log.commit(peeked) is peeked
    assert (log.last_taken, log.next_seq) == (1, 2)


def test_a_peeked_position_cannot_be_committed_once_another_took_it():
    log = StepLog()
    peeked = log.peek("spawn worker")
    log.take("other")
    with pytest.raises(RuntimeError):
        log.commit(peeked)
    assert log.last_taken == 1


def test_a_taken_position_cannot_be_committed_again():
    log = StepLog()
    taken = log.take("sleep")
    with pytest.raises(RuntimeError):
        log.commit(taken)
    assert log.next_seq == 2


def test_the_end_is_the_last_position_taken_or_recorded():
    log = StepLog({1: recorded(1, "a"), 2: recorded(2, "b"), 3: recorded(3, "c", status="failed")})
    log.take("a")
    assert log.end == 3  # a rollback writes after step 3, which this execution never reached
    log.take("b")
    log.take("c")
    log.take("d")
    assert log.end == 4


def test_a_rollback_takes_positions_after_the_end_forward_only():
    log = StepLog({1: recorded(1, "charge"), 2: recorded(2, "ship", status="failed")})
    log.take("charge")
    plan = log.take_at(log.end + 1, "rollback")
    assert plan.seq == 3
    undo = log.take_at(5, "undo ship")  # position 4 was undone already: skipped
    assert (undo.seq, log.last_taken) == (5, 5)
    with pytest.raises(RuntimeError):
        log.take_at(4, "undo charge")  # never backwards
    assert log.last_taken == 5


def test_a_jump_checks_the_name_recorded_there():
    log = StepLog({4: recorded(4, "undo charge", kind="compensation")})
    with pytest.raises(NonDeterministic):
        log.take_at(4, "undo refund")
    assert log.take_at(4, "undo charge").done


def test_a_noted_checkpoint_is_what_replay_finds_there_next():
    log = StepLog()
    position = log.take("fetch")
    log.note(recorded(position.seq, "fetch", output=[1, 2]))
    assert log.recorded(1).output == [1, 2]
    assert [step.seq for step in log.newest_first()] == [1]
    with pytest.raises(RuntimeError):
        log.note(recorded(2, "not taken yet"))


def test_the_log_does_not_change_the_mapping_it_was_loaded_from():
    loaded = {1: recorded(1, "a")}
    log = StepLog(loaded)
    log.take("a")
    log.take("b")
    log.note(recorded(2, "b"))
    assert list(loaded) == [1]


# Through a real worker: every durable operation, not only ctx.step, goes through the one check.
def _recorded_then_resumed(tenant, kind, input, names):
    from datetime import UTC, datetime
    from uuid import uuid4

    from runs.engine import claim as claims
    from runs.engine import steps as checkpoint
    from runs.engine.exit import Exit, leave
    from runs.services import submit_run
    from tests.conftest import fresh
    from workers.worker import Worker, WorkerOptions

    run = submit_run(tenant=tenant, kind=kind, input=input)
    [claimed] = claims.claim(worker_id=uuid4(), queues=["default"], kinds={kind: 1}, n=1, lease=60)
    for seq, name in enumerate(names, start=1):
        record = checkpoint.StepRecord(
            run_id=claimed.id,
            token=claimed.lease_token,
            generation=claimed.generation,
            seq=seq,
            name=name,
            kind="custom",
            input=None,
            started_at=datetime.now(UTC),
        )
        checkpoint.checkpoint(
            checkpoint.Checkpoint.of(record, output={"n": seq}, steps_total=None),
            worker_id=uuid4(),
            lease=60,
        )
    leave(Exit.release(reason="test").of_run(run.id, claimed.lease_token))
    Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False, concurrency=1)).run()
    return fresh(run)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("kind", "input", "names", "asked"),
    [
        ("wf_sleep", {"log": None, "seconds": 0}, ["before", "renamed"], "sleep 'sleep'"),
        ("approve_then_act", {}, ["draft", "renamed"], "approval 'update_crm'"),
    ],
)
def test_a_durable_operation_meeting_another_recorded_name_fails_the_run_nondeterministic(
    tenant, kind, input, names, asked
):
    run = _recorded_then_resumed(tenant, kind, input, names)
    assert (run.status, run.error_kind) == ("failed", "nondeterministic")
    assert "step 2 was recorded as 'renamed'" in run.error and asked in run.error
