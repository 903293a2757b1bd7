from django.core.management.base import BaseCommand, CommandError

from runs.models import Tenant
from runs.webhooks import signing


class Command(BaseCommand):
    help = "Print a tenant's webhook signing secret (whsec_...) alone on the last line; --rotate makes a new one."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="make a new secret; the old one keeps signing for 24 h",
        )

    def handle(self, *args, slug, rotate, **options):
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise CommandError(f"no tenant with slug {slug!r}")
        if rotate:
            secret = signing.rotate(tenant.pk)
            self.stdout.write(
                f"Rotated the webhook secret of {slug}; the previous one also signs for 24 h."
            )
        else:
            secret = signing.current_secret(tenant.pk)
            self.stdout.write(f"Webhook signing secret of {slug}:")
        self.stdout.write(secret)
