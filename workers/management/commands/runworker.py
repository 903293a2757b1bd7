from django.core.management.base import BaseCommand, CommandError

from runs.metrics.publish import publishing
from workers.worker import Worker, WorkerOptions


def _queues(value: str) -> list[str]:
    return [q.strip() for q in value.split(",") if q.strip()]


class Command(BaseCommand):
    help = "Claim runs from the PostgreSQL queue and execute them as checkpointed steps."

    def add_arguments(self, parser):
        parser.add_argument(
            "--queues",
            type=_queues,
            default=["default"],
            help="comma-separated queues (default: default)",
        )
        parser.add_argument(
            "--concurrency", type=int, help="runs in flight in this process (RUNS_CONCURRENCY, 5)"
        )
        parser.add_argument("--lease", type=float, help="lease seconds (RUNS_LEASE_SECONDS, 300)")
        parser.add_argument(
            "--heartbeat",
            type=float,
            help="heartbeat seconds, at most lease/3 (RUNS_HEARTBEAT_SECONDS, 30)",
        )
        parser.add_argument(
            "--poll", type=float, help="poll seconds when no NOTIFY comes (RUNS_POLL_SECONDS, 1)"
        )
        parser.add_argument("--burst", action="store_true", help="exit once no run is claimable")

    def handle(self, *args, **options):
        try:
            worker_options = WorkerOptions.from_settings(
                queues=options["queues"],
                concurrency=options["concurrency"],
                lease=options["lease"],
                heartbeat=options["heartbeat"],
                poll=options["poll"],
                burst=options["burst"],
            )
            worker = Worker(worker_options)
            with publishing(role="worker"):
                worker.run(install_signal_handlers=True)
        except (ValueError, RuntimeError) as exc:
            raise CommandError(str(exc)) from exc
        if worker.poisoned:
            raise SystemExit(3)  # a step thread never returned: restart this process
