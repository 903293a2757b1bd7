import os

from django.core.management.base import BaseCommand, CommandError

from config.serving.server import serve


class Command(BaseCommand):
    help = "The production web server (ASGI, uvicorn): the API, the dashboard, the admin and live event streams."

    def add_arguments(self, parser):
        parser.add_argument(
            "addrport",
            nargs="?",
            default="127.0.0.1:8000",
            help="HOST:PORT (default 127.0.0.1:8000)",
        )
        parser.add_argument("--workers", type=int, default=1, help="processes (default 1)")
        parser.add_argument(
            "--graceful",
            type=float,
            default=10.0,
            help="seconds requests get to finish on SIGTERM (streams end at once)",
        )
        parser.add_argument(
            "--forwarded-allow-ips",
            default=os.environ.get("FORWARDED_ALLOW_IPS"),
            help="trust X-Forwarded-* from these proxy addresses (comma-separated, or *)",
        )

    def handle(self, *args, addrport, workers, graceful, forwarded_allow_ips, **options):
        host, _, port = addrport.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CommandError("addrport is HOST:PORT, e.g. 127.0.0.1:8000 or 0.0.0.0:8000")
        if workers < 1:
            raise CommandError("--workers must be at least 1")
        serve(
            host=host.strip("[]"),
            port=int(port),
            workers=workers,
            graceful_seconds=graceful,
            forwarded_allow_ips=forwarded_allow_ips,
        )
