from django.core.management.base import BaseCommand, CommandError

from runs.tenants import ensure_tenant


class Command(BaseCommand):
    help = "Create a tenant (idempotent: an existing slug is updated with the options given)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name")
        parser.add_argument("--max-running", type=int)
        parser.add_argument("--max-queued", type=int)
        parser.add_argument(
            "--weight",
            type=int,
            help="its share of free worker slots against other busy tenants (default 1)",
        )

    def handle(self, *args, **options):
        try:
            tenant, created = ensure_tenant(
                slug=options["slug"],
                name=options["name"],
                max_running=options["max_running"],
                max_queued=options["max_queued"],
                weight=options["weight"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        verb = "created" if created else "exists"
        self.stdout.write(
            f"tenant {tenant.slug} {verb} (id {tenant.id}, max_running {tenant.max_running}, max_queued {tenant.max_queued}, weight {tenant.weight})"
        )
