from django.core.management.base import BaseCommand, CommandError

from runs.keys import ALL_SCOPES, create_api_key
from runs.models import Tenant


class Command(BaseCommand):
    help = "Create an API key for a tenant; the secret is printed once, alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="cli")
        parser.add_argument(
            "--scopes",
            default=",".join(ALL_SCOPES),
            help=f"comma-separated, from {', '.join(ALL_SCOPES)}",
        )

    def handle(self, *args, **options):
        tenant = Tenant.objects.filter(slug=options["slug"]).first()
        if tenant is None:
            raise CommandError(f"no tenant {options['slug']!r}; create it with createtenant")
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        try:
            issued = create_api_key(tenant=tenant, name=options["name"], scopes=scopes)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"API key {issued.api_key.prefix} for {tenant.slug} with scopes {','.join(scopes)}:"
        )
        self.stdout.write(issued.secret)
