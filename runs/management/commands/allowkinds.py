from django.core.management.base import BaseCommand, CommandError

from runs.kinds import NotStartable, set_allowed_kinds, startable_kinds
from runs.models import Tenant


class Command(BaseCommand):
    help = (
        "Narrow a tenant to the kinds it may start through the API and the dashboard "
        "(idempotent; --all lifts the list). Prints what is now in force."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("kinds", nargs="?", help="kind names separated by commas")
        parser.add_argument(
            "--all", action="store_true", help="lift the list: every kind a tenant can start"
        )

    def handle(self, *args, **options):
        names = [name.strip() for name in (options["kinds"] or "").split(",") if name.strip()]
        if options["all"] == bool(names):
            raise CommandError("give either a list of kinds (kind,kind) or --all")
        tenant = Tenant.objects.filter(slug=options["slug"]).first()
        if tenant is None:
            raise CommandError(
                f"there is no tenant {options['slug']!r} (manage.py createtenant makes one)"
            )
        try:
            set_allowed_kinds(tenant, None if options["all"] else names)
        except NotStartable as exc:
            raise CommandError(str(exc)) from None
        if tenant.allowed_kinds is None:
            self.stdout.write(f"tenant {tenant.slug}: every kind (no list)")
        else:
            self.stdout.write(f"tenant {tenant.slug}: only {', '.join(tenant.allowed_kinds)}")
        startable = ", ".join(kind.name for kind in startable_kinds(tenant)) or "none"
        self.stdout.write(f"it may start: {startable}")
