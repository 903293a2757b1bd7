from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from runs.seed import seed_demo
from workers.supervisor import DevStack


class Command(BaseCommand):
    help = "Development in one command: migrate, seed a demo tenant, then web (uvicorn) + worker + reaper + webhook delivery (Ctrl-C stops all)."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument("--concurrency", type=int, default=None)

    def handle(self, *args, **options):
        call_command("migrate", interactive=False, verbosity=0)
        demo = seed_demo()
        addr = options["addrport"]
        self.stdout.write(
            self.style.SUCCESS(
                f"Dashboard: http://{addr}/  (log in as {demo.username} / {demo.password})"
            )
        )
        self.stdout.write(f"API docs:  http://{addr}/api/docs")
        if settings.RUNS_EXAMPLES:
            self.stdout.write(
                f"Try:       curl -s -X POST http://{addr}/api/runs -H 'Authorization: Bearer {demo.api_key}'"
                ' -H \'Content-Type: application/json\' -d \'{"kind": "research_brief", "input": {"topic": "Acme Corp"}}\''
            )
            self.stdout.write(
                'A saga that rolls back: the same with -d \'{"kind": "deploy_app", "input": '
                '{"app": "shop", "fail_at": "monitoring"}}\''
            )
        else:
            self.stdout.write(
                "Kinds:     only your own (the example kinds and demo apps are off: RUNS_EXAMPLES=1 turns "
                "them on, as `make run` does)"
            )
        self.stdout.write(f"API key for tenant {demo.tenant_slug}:")
        self.stdout.write(demo.api_key)
        worker_args = (
            ["--concurrency", str(options["concurrency"])] if options["concurrency"] else []
        )
        stack = DevStack(addr=addr, worker_args=worker_args)
        stack.start()
        raise SystemExit(stack.wait())
