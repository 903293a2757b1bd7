"""Execute one claimed run: replay its step log, call the agent, and leave running once.

Runs on a thread of the worker's pool. Between statements it holds no
database connection, so a run waiting on a model or a tool costs none.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError

from runs import payloads
from runs.control import cancel_children
from runs.db import dumps_storable, is_transient, release_connection, with_retries
from runs.engine.exit import Exit, Exited
from runs.engine.steplog import load_step_log
from runs.exceptions import PayloadTooLarge
from runs.metrics import process as metrics
from runs.registry import get_kind
from runs.states import TERMINAL_STATUSES, RunStatus
from workers.classify import classify, interruption
from workers.context import RunContext
from workers.errors import (
    AwaitApproval,
    AwaitCapacity,
    AwaitChildren,
    AwaitMessage,
    LeaseLost,
    ParkForHuman,
    ReleaseRun,
    RunSignal,
    Sleep,
    StopRun,
)
from workers.host import Host, RunControl
from workers.saga import Rollback, recorded_plan
from workers.step_thread import BETWEEN_STEPS
from workers.tracing import observed_run

if TYPE_CHECKING:
    from runs.engine.claim import ClaimedRun
    from runs.registry import AgentKind

logger = logging.getLogger(__name__)

# How long a worker keeps trying to record an exit while the database is
# away (a failover): giving up leaves the run to the reaper, which counts a
# failure. Bounded by the lease, past which the run is not ours anyway.
EXIT_RETRY_SECONDS = 60.0


def backoff_seconds(failures: int, *, base: float, cap: float, retry_after: float | None) -> float:
    """Exponential backoff with full jitter, never shorter than what the callee asked for."""
    delay = random.uniform(0, min(cap, base * (2 ** max(failures - 1, 0))))
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


class RunExecutor:
    def __init__(self, worker: Host, claimed: ClaimedRun, control: RunControl):
        self.worker = worker
        self.claimed = claimed
        self.control = control
        self.log_extra = {
            "run_id": str(claimed.id),
            "tenant": str(claimed.tenant_id),
            "kind": claimed.kind,
        }
        self.ctx: RunContext | None = (
            None  # what the agent reported (ctx.report) goes with the exit
        )
        self.kind: AgentKind | None = None

    def execute(self) -> RunStatus | None:
        """Run to the next exit from running; returns the status reached (None when the lease was lost).

        In a context of its own, gone when it returns (this pool thread runs another run next): every
        line logged meanwhile carries the run's fields, and with OpenTelemetry it is the span
        ``run <kind>`` (workers.tracing).
        """
        try:
            return observed_run(self.claimed, worker_id=self.worker.id, execute=self._execute)
        finally:
            release_connection()

    def _execute(self) -> RunStatus | None:
        claimed = self.claimed
        if claimed.run_after is not None:
            metrics.claimed(
                queue=claimed.queue,
                kind=claimed.kind,
                waited_seconds=(claimed.claimed_at - claimed.run_after).total_seconds(),
            )
        # The database's clock against this host's: as good as the two agree.
        metrics.started(
            kind=claimed.kind,
            after_claim_seconds=(datetime.now(UTC) - claimed.claimed_at).total_seconds(),
        )
        kind = self.kind = get_kind(claimed.kind)
        if kind is None or not kind.can_resume(claimed.kind_version):
            # The claim takes only versions this worker can resume; reached
            # only if the registry changed under it. Hand it back, spending
            # nothing, and let a worker with that version take it.
            logger.warning(
                "cannot resume %s version %s here; releasing",
                claimed.kind,
                claimed.kind_version,
                extra=self.log_extra,
            )
            return self._leave(Exit.release(reason="version", delay=self.worker.poll))
        # A first claim has no step log yet (unless it is a fork: its copied steps count as
        # done, or a rollback requested before it ever ran): skip the read.
        recorded = (
            load_step_log(run_id=claimed.id, generation=claimed.generation)
            if claimed.attempt > 1 or claimed.steps_done or claimed.compensation
            else {}
        )
        ctx = self.ctx = RunContext(
            claimed=claimed, recorded=recorded, worker=self.worker, control=self.control, kind=kind
        )
        try:
            agent_input = kind.agent_input(payloads.resolve(claimed.input, run_id=claimed.id))
        except Exception as exc:  # the stored input no longer validates
            return self._leave(
                Exit.fail(
                    reason="invalid_input",
                    error=f"input does not validate: {exc}",
                    error_kind="fatal",
                )
            )
        if claimed.compensation in ("requested", "running"):
            return self._resume_rollback(ctx, kind, agent_input)

        try:
            result = self._call_agent(kind, ctx, agent_input)
        except LeaseLost as exc:
            logger.warning("abandoning run: %s", exc, extra=self.log_extra)
            return None
        except ReleaseRun as exc:
            # Shutdown, cancel or pause (exc.reason): back to queued; the exit
            # turns a requested cancel or pause into cancelled or paused.
            return self._leave(Exit.release(reason=exc.reason.value))
        except StopRun as exc:
            logger.info("run stopped (%s): %s", exc.error_kind, exc, extra=self.log_extra)
            if self._rolls_back(ctx, kind, exc.error_kind):
                return self._roll_back(
                    ctx, kind, reason=exc.error_kind, error=str(exc), error_kind=exc.error_kind
                )
            return self._leave(
                Exit.fail(reason=exc.error_kind, error=str(exc), error_kind=exc.error_kind)
            )
        except ParkForHuman as exc:
            return self._leave(
                Exit.await_human(reason="ambiguous", error=str(exc), error_kind="ambiguous")
            )
        except AwaitApproval:
            return self._leave(Exit.await_human(reason="approval"))
        except AwaitMessage as exc:
            return self._leave(Exit.await_message(wake_at=exc.wake_at))
        except AwaitChildren as exc:
            return self._leave(Exit.await_children(wake_at=exc.wake_at))
        except Sleep as exc:
            return self._leave(Exit.sleep(until=exc.until))
        except AwaitCapacity as exc:
            # Queued until the limit has room; the call's step was not recorded, so it runs then.
            return self._leave(Exit.await_capacity(until=exc.until))
        except RunSignal:
            raise
        except DatabaseError as exc:
            if ctx.last_failure is not None and ctx.last_failure.exc is exc:
                return self._fail(exc, ctx, kind)  # raised by step code: classified like any error
            if is_transient(exc):
                # The connection broke under an engine statement (a failover,
                # a restart): not the run's fault and no failure of its own,
                # so it goes back to the queue spending nothing. Whatever
                # committed is in the step log; the rest runs again.
                logger.warning(
                    "database connection lost (%s); releasing the run", exc, extra=self.log_extra
                )
                return self._leave(
                    Exit.release(
                        reason="database_error",
                        error=f"{type(exc).__name__}: {exc}",
                        delay=self.worker.poll,
                    )
                )
            # Any other database error of an engine statement (a timeout, a
            # value it refused) would repeat itself: count it, so that the
            # retry budget bounds it.
            logger.warning(
                "engine statement failed (%s); releasing the run", exc, extra=self.log_extra
            )
            return self._leave(
                Exit.retry(
                    reason="database_error",
                    error=f"{type(exc).__name__}: {exc}",
                    delay=self.worker.poll,
                    error_class=type(exc).__name__,
                )
            )
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt... of the run's code end the run only
            return self._fail(exc, ctx, kind)

        try:
            result_json, _ = dumps_storable(result)
            stored = payloads.stored_json(
                result_json, run_id=claimed.id, name="result", what="the run's result"
            )
        except TypeError as exc:
            return self._leave(
                Exit.fail(
                    reason="result",
                    error=f"the agent returned a result that is not JSON-serialisable: {exc}",
                    error_kind="fatal",
                )
            )
        except PayloadTooLarge as exc:
            return self._leave(Exit.fail(reason="result", error=str(exc), error_kind="fatal"))
        return self._leave(Exit.done(result=stored))

    @staticmethod
    def _call_agent(kind: AgentKind, ctx: RunContext, agent_input):
        marked = BETWEEN_STEPS.set(ctx)  # workers.context.current_run()
        try:
            return kind.func(ctx, agent_input)
        finally:
            BETWEEN_STEPS.reset(marked)

    def _fail(self, exc: BaseException, ctx: RunContext, kind: AgentKind) -> RunStatus | None:
        failure = ctx.last_failure
        if failure is not None and failure.exc is exc:
            error_kind, retry_after = failure.error_kind, failure.retry_after
            where, by = f"step {failure.seq} ({failure.name}): ", "the step"
        else:  # raised by agent code between steps
            found = classify(exc)
            error_kind, retry_after = found.kind, found.retry_after
            where, by = "", "the kind's code between steps"
        message = where + (interruption(exc, by=by) or f"{type(exc).__name__}: {exc}")
        if error_kind == "ambiguous":
            logger.warning(
                "side effect of unknown outcome, waiting for a person: %s",
                message,
                extra=self.log_extra,
            )
            return self._leave(
                Exit.await_human(reason="ambiguous", error=message, error_kind="ambiguous")
            )
        if error_kind == "retryable":
            # Consecutive failures as the database now counts them: a step
            # completed in this attempt started the count again.
            failures = 0 if ctx.progressed else self.claimed.failures
            if failures + 1 >= self.claimed.max_attempts and self._rolls_back(
                ctx, kind, "retryable"
            ):
                return self._roll_back(
                    ctx, kind, reason="retry_budget", error=message, error_kind="retryable"
                )
            delay = self._backoff(kind, failures + 1, retry_after)
            logger.info(
                "retryable error, retrying in %.1fs: %s", delay, message, extra=self.log_extra
            )
            return self._leave(
                Exit.retry(error=message, delay=delay, error_class=type(exc).__name__)
            )
        logger.info("run failed (%s): %s", error_kind, message, extra=self.log_extra)
        if self._rolls_back(ctx, kind, error_kind):
            return self._roll_back(ctx, kind, reason="error", error=message, error_kind=error_kind)
        return self._leave(Exit.fail(reason="error", error=message, error_kind=error_kind))

    def _backoff(self, kind: AgentKind, failures: int, retry_after: float | None) -> float:
        return backoff_seconds(
            failures,
            base=kind.backoff_base
            if kind.backoff_base is not None
            else settings.RUNS_BACKOFF_BASE_SECONDS,
            cap=kind.backoff_cap
            if kind.backoff_cap is not None
            else settings.RUNS_BACKOFF_CAP_SECONDS,
            retry_after=retry_after,
        )

    # Sagas (workers.saga).
    def _rolls_back(self, ctx: RunContext, kind: AgentKind, error_kind: str) -> bool:
        """A run that fails for good on an error its kind opts into rolls back what it did, if anything."""
        return error_kind in kind.compensate_on and bool(ctx.compensations)

    def _roll_back(
        self,
        ctx: RunContext,
        kind: AgentKind,
        *,
        reason: str,
        error: str,
        error_kind: str,
        target: RunStatus = RunStatus.FAILED,
    ) -> RunStatus | None:
        logger.info("rolling back (%s): %s", reason, error, extra=self.log_extra)
        rollback = Rollback(ctx)
        try:
            plan = rollback.begin(target=target, reason=reason, error=error, error_kind=error_kind)
        except LeaseLost:
            return None
        return self._compensate(rollback, plan, kind)

    def _resume_rollback(self, ctx: RunContext, kind: AgentKind, agent_input) -> RunStatus | None:
        """Replay the run, no step allowed to run, to learn its compensations; then carry the rollback on."""
        ctx.set_rollback("replay")
        try:
            self._call_agent(kind, ctx, agent_input)
        except LeaseLost:
            return None
        except BaseException:  # noqa: BLE001 - any way out ends the replay
            pass
        ctx.set_rollback(None)
        plan = recorded_plan(ctx.step_log)
        if plan is None:  # a person cancelled the run with compensate: nothing recorded yet
            if not ctx.compensations:
                return self._leave(
                    Exit.rolled_back(RunStatus.CANCELLED, reason="cancelled", compensation="done")
                )
            return self._roll_back(
                ctx, kind, reason="cancel", error="", error_kind="", target=RunStatus.CANCELLED
            )
        return self._compensate(Rollback(ctx), plan, kind)

    def _compensate(self, rollback: Rollback, plan, kind: AgentKind) -> RunStatus | None:
        ctx = rollback.ctx
        try:
            done = rollback.run(plan)
        except LeaseLost:
            return None
        except ReleaseRun as exc:  # a shutdown: the next claim carries the rollback on
            return self._leave(Exit.release(reason=exc.reason.value))
        except (ParkForHuman, StopRun) as exc:
            return self._leave(
                Exit.await_human(reason="compensation", error=str(exc), error_kind="ambiguous")
            )
        except RunSignal:
            raise
        except BaseException as exc:  # noqa: BLE001 - a compensation's SystemExit too (workers.classify)
            failure = (
                ctx.last_failure
                if ctx.last_failure is not None and ctx.last_failure.exc is exc
                else None
            )
            if failure is None:
                # An engine statement failed (the database), not a compensation:
                # released, counted, and carried on by the next claim.
                logger.warning(
                    "rollback interrupted (%s); releasing the run", exc, extra=self.log_extra
                )
                return self._leave(
                    Exit.retry(
                        reason="database_error",
                        error=f"{type(exc).__name__}: {exc}",
                        delay=self.worker.poll,
                        error_class=type(exc).__name__,
                    )
                )
            position = failure.seq - plan.seq - 1  # compensation i is step plan.seq + i
            undoes = (
                plan.plan[position]
                if 0 <= position < len(plan.plan)
                else {"seq": "?", "name": failure.name}
            )
            message = (
                f"the compensation of step {undoes['seq']} ({undoes['name']}) failed, "
                f"at step {failure.seq}: {type(exc).__name__}: {exc}"
            )
            if failure.error_kind == "retryable":
                # Retried with backoff; once the retry budget is spent the run
                # waits for a person instead (the exit decides, runs.engine.exit).
                delay = self._backoff(
                    kind, (0 if ctx.progressed else self.claimed.failures) + 1, failure.retry_after
                )
                logger.info("%s; retrying in %.1fs", message, delay, extra=self.log_extra)
                return self._leave(
                    Exit.retry(
                        reason="compensation_retry",
                        error=message,
                        delay=delay,
                        error_class=type(exc).__name__,
                    )
                )
            logger.warning("%s; a person decides", message, extra=self.log_extra)
            return self._leave(
                Exit.await_human(
                    reason="compensation", error=message, error_kind=failure.error_kind
                )
            )
        logger.info("rolled back: %s", done.error(), extra=self.log_extra)
        return self._leave(
            Exit.rolled_back(
                RunStatus(plan.target),
                error=done.error(),
                error_kind=plan.error_kind or None,
                compensation=done.compensation,
            )
        )

    def _leave(self, exit: Exit) -> RunStatus | None:
        """Leave running as ``exit`` asks (through the worker's committer); returns the status reached."""
        self.control.leaving.set()
        claimed = self.claimed
        exit = exit.of_run(
            claimed.id,
            claimed.lease_token,
            parent=claimed.parent_id,
            thread=claimed.thread_id,
            actor_id=str(self.worker.id),
            give_slot=not self.worker.defers_slot_returns,
        )
        # What the agent reported, stored by the exit only if it ends the run (runs.engine.exit);
        # not after a rollback, which undid what it reported.
        if self.ctx is not None and self.ctx.reported and exit.compensation is None:
            exit = exit.reporting(*self.ctx.reported)
        committer = self.worker.committer
        try:
            exited = with_retries(
                lambda: committer.commit(exit),
                what="exit",
                for_seconds=min(EXIT_RETRY_SECONDS, self.worker.lease / 2),
            )
        except DatabaseError:
            # Still failing: the lease runs out and the reaper returns the run.
            logger.exception(
                "could not leave running (%s); the reaper will rescue the run",
                exit.target,
                extra=self.log_extra,
            )
            return None
        finally:
            release_connection()
        if exited is None:
            logger.warning(
                "lease lost before the run could leave running (%s)",
                exit.target,
                extra=self.log_extra,
            )
            return None
        self._after_leaving(exit, exited)
        return exited.status

    def _after_leaving(self, exit: Exit, exited: Exited) -> None:
        """What follows a committed exit: the slot, the wake-ups, orphaned children, the kind's hook."""
        if self.worker.defers_slot_returns:
            self.worker.slot_returned(self.claimed.tenant_id, exited.at)
        # Back in the queue ready to run (not a sleep, no backoff): wake the workers.
        ready = exit.delay <= 0 and (exit.target != RunStatus.QUEUED or exit.wake_at is None)
        if exited.status == RunStatus.QUEUED and ready:
            self.worker.notify_released(exited.queue)
        if exited.woke_parent:
            self.worker.notify_released(exited.woke_parent)
        if exited.leaves_orphans:
            # Its own exit is committed; its live children, if it has any, are
            # cancelled now (the reaper finishes the job if this process dies first).
            # Looked up here, on the partial index of live children, not in the
            # exit statement: a subquery there cost every exit 0.25 ms of planning.
            try:
                cancel_children(self.claimed.id)
            except DatabaseError:
                logger.exception("could not cancel the children of the run", extra=self.log_extra)
            finally:
                release_connection()
        if (
            exited.status in TERMINAL_STATUSES
            and self.ctx is not None
            and self.kind is not None
            and self.kind.after_exit
        ):
            self._after_exit(self.kind.after_exit, exited.status, exit.result, exited.at)

    def _after_exit(
        self,
        hook: Callable[[Any, str, Any, Any], None],
        status: RunStatus,
        result_json: str | None,
        at: datetime,
    ) -> None:
        """The kind's hook on a run that ended here (runs.registry.AgentKind.after_exit); its errors are logged."""
        try:
            hook(
                self.ctx,
                status,
                None
                if result_json is None
                else payloads.resolve_json(result_json, run_id=self.claimed.id),
                at,
            )
        except Exception:
            logger.exception(
                "the after_exit hook of kind %s failed", self.claimed.kind, extra=self.log_extra
            )
        finally:
            release_connection()
