from django.conf import settings
from django.core.management.base import BaseCommand

from runs.metrics.publish import publishing
from workers.reaper import Reaper


class Command(BaseCommand):
    help = "Return runs of dead workers to the queue, reconcile tenant counters and delete runs past retention."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            help="seconds between passes (RUNS_REAP_INTERVAL_SECONDS, 10)",
        )

    def handle(self, *args, **options):
        with publishing(role="reaper"):
            self._reap(Reaper(), options)

    def _reap(self, reaper: Reaper, options) -> None:
        if options["once"]:
            report = reaper.reap_once()
            woken = reaper.wake_timers()
            pruned = reaper.prune()
            self.stdout.write(f"reaped: {report} timers={woken} pruned={pruned}")
            return
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: reaper.stopping.set())
        reaper.run(
            interval=options["interval"] or settings.RUNS_REAP_INTERVAL_SECONDS,
            timer_interval=min(
                settings.RUNS_TIMER_INTERVAL_SECONDS, options["interval"] or float("inf")
            ),
        )
