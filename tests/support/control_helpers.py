"""Helpers shared by the human-control tests (test_control*.py)."""

from __future__ import annotations

import json
import threading
from collections import Counter

from django.db import connection, connections, transaction
from django.test import Client

from runs.keys import create_api_key
from runs.models import TERMINAL_STATUSES, Event, Run
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import executions
from tests.support.waiting import wait_until
from workers.worker import Worker, WorkerOptions


def client_for(secret: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {secret}"})


class Person:
    """An API key of the tenant and a client sending it."""

    def __init__(self, tenant, name: str, scopes: list[str] | None = None):
        issued = create_api_key(tenant=tenant, name=name, scopes=scopes)
        self.key = issued.api_key
        self.client = client_for(issued.secret)
        self.actor = f"api_key:{self.key.pk}"

    def did(self, run: Run, event_type: str) -> Event:
        """The run's one Event of this type, which must name this key as its actor."""
        (event,) = Event.objects.filter(run=run, type=event_type)
        assert (event.actor_type, event.actor_id) == ("api_key", str(self.key.pk))
        return event


def act(client: Client, run, action: str, body: dict | None = None):
    """POST /api/runs/{id}/{action}, with a JSON body when one is given, else an empty one (like curl -X POST)."""
    run_id = run if isinstance(run, str) else run.id
    if body is None:
        return client.generic("POST", f"/api/runs/{run_id}/{action}")
    return client.post(
        f"/api/runs/{run_id}/{action}", data=json.dumps(body), content_type="application/json"
    )


def get(client: Client, run) -> dict:
    response = client.get(f"/api/runs/{run.id}")
    assert response.status_code == 200, response.content
    return response.json()


def burst_worker() -> None:
    """A real worker in this process: claims until nothing is claimable (runs that park leave it)."""
    Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False)).run()


def work_until(run: Run, *statuses: str, timeout: float = 20.0) -> Run:
    """Burst workers until ``run`` reaches one of ``statuses`` (retries wait out their short backoff)."""

    def reached() -> Run | None:
        burst_worker()
        current = fresh(run)
        return current if current.status in statuses else None

    return wait_until(
        reached,
        timeout=timeout,
        what=lambda: f"the run to reach {statuses}; it is {fresh(run).status}",
    )


def events(run: Run) -> list[Event]:
    return list(Event.objects.filter(run=run).order_by("seq"))


def event_types(run: Run) -> list[str]:
    return [e.type for e in events(run)]


def reached(event: Event) -> str | None:
    """The status an Event reports the run moved to (None for events that are not transitions)."""
    if "to" in event.payload:
        return event.payload["to"]
    return event.type.removeprefix("run.") if event.type.startswith("run.") else None


def assert_events_consistent(run: Run) -> None:
    """Seqs run 1..last_event_seq without a gap; a terminal run has exactly one terminal Event (since its
    last retry), naming the status it is in."""
    run = fresh(run)
    log = events(run)
    assert [e.seq for e in log] == list(range(1, run.last_event_seq + 1)), [
        (e.seq, e.type) for e in log
    ]
    retries = [i for i, e in enumerate(log) if e.type == "run.retried"]
    since = log[retries[-1] + 1 :] if retries else log
    terminal = [reached(e) for e in since if reached(e) in TERMINAL_STATUSES]
    if run.status in TERMINAL_STATUSES:
        assert terminal == [run.status], [(e.seq, e.type, e.payload) for e in log]
    else:
        assert terminal == [], [(e.seq, e.type, e.payload) for e in log]


def backends_waiting_on_locks(
    application_name: str | None = None,
) -> list[tuple[int, str, list[int]]]:
    """(pid, start of the query, pids blocking it) of this database's sessions waiting for a lock."""
    sql = (
        "SELECT pid, query, pg_blocking_pids(pid) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    )
    params: list = []
    if application_name:
        sql += " AND application_name = %s"
        params.append(application_name)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def terminate_backends(application_name: str) -> None:
    """End the database sessions a killed process left behind: their statements never commit."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [application_name],
        )

    def gone():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
                [application_name],
            )
            return cursor.fetchone()[0] == 0

    wait_until(gone, timeout=10, what=f"the sessions of {application_name} to end")


class OpenTransaction:
    """Runs ``work()`` in a transaction on a thread of its own and keeps it open until ``commit()``.

    Used as a context manager it waits for ``work`` to finish on entry and commits on exit.
    """

    def __init__(self, work):
        self.work = work
        self.pid: int | None = None  # the backend of this transaction
        self.error: BaseException | None = None
        self._started = threading.Event()
        self._worked = threading.Event()
        self._commit = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    self.pid = cursor.fetchone()[0]
                self._started.set()
                self.work()
                self._worked.set()
                self._commit.wait(30)
        except BaseException as exc:  # reported by wait_worked() and commit()
            self.error = exc
        finally:
            self._started.set()
            self._worked.set()
            connections.close_all()

    def start(self) -> OpenTransaction:
        self._thread.start()
        assert self._started.wait(10), "the transaction did not start"
        return self

    def wait_worked(self, timeout: float = 10) -> None:
        assert self._worked.wait(timeout), "the work did not finish"
        assert self.error is None, self.error

    def commit(self) -> None:
        self._commit.set()
        self._thread.join(15)
        assert not self._thread.is_alive(), "the transaction did not end"
        assert self.error is None, self.error

    def release(self) -> None:
        """Let the transaction end (a no-op once committed); for cleanup after a failure."""
        self._commit.set()
        if self._thread.is_alive():
            self._thread.join(15)

    def __enter__(self) -> OpenTransaction:
        self.start().wait_worked()
        return self

    def __exit__(self, *exc) -> None:
        self.commit()


def RowLock(queryset) -> OpenTransaction:  # noqa: N802 - reads as the lock it holds
    """Holds ``SELECT ... FOR UPDATE`` on the rows of ``queryset`` until the with block ends."""
    return OpenTransaction(lambda: list(queryset.select_for_update()))


# --- runs brought to a state by a real worker (in this process) ---


def approval_run(tenant, log) -> Run:
    run = submit_run(tenant=tenant, kind="approve_then_act", input={"log": log})
    burst_worker()
    assert fresh(run).status == "waiting_human"
    return run


def chat_run(tenant) -> Run:
    run = submit_run(tenant=tenant, kind="chat", input={})
    burst_worker()
    assert fresh(run).status == "waiting"
    return run


def ambiguous_run(tenant, log) -> Run:
    run = submit_run(tenant=tenant, kind="uncertain_charge", input={"log": log})
    burst_worker()
    assert fresh(run).status == "waiting_human"
    return run


def steps_of(log, run) -> Counter:
    return Counter(name for run_id, _, name, _ in executions(log) if run_id == str(run.id))
