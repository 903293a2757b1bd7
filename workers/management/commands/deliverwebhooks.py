import signal

from django.core.management.base import BaseCommand

from runs.metrics.publish import publishing
from workers.webhooks import DeliveryLoop


class Command(BaseCommand):
    help = "Send signed webhooks (Standard Webhooks) for finished and waiting runs, with retries for 24 h."

    def add_arguments(self, parser):
        parser.add_argument(
            "--concurrency", type=int, default=8, help="sends in flight at once (default 8)"
        )
        parser.add_argument(
            "--poll", type=float, default=0.5, help="seconds between looks for due deliveries"
        )
        parser.add_argument("--once", action="store_true", help="send what is due, then exit")

    def handle(self, *args, concurrency, poll, once, **options):
        loop = DeliveryLoop(concurrency=concurrency, poll=poll)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: loop.stopping.set())
        with publishing(role="webhooks"):
            attempts = loop.run(once=once)
        if once:
            self.stdout.write(f"attempts: {attempts}")
