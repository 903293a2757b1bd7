from django.core.management.base import BaseCommand, CommandError

from runs.engine.ratelimits import set_limit
from runs.models import RateLimit


class Command(BaseCommand):
    help = (
        "Set a rate limit shared by every worker, such as a model provider's "
        "(llm:<provider>:<model>, llm:<provider> or llm); idempotent, --clear removes it. "
        "Prints every limit in force."
    )

    def add_arguments(self, parser):
        parser.add_argument("key", help="what it limits, e.g. llm:openai or llm:openai:gpt-4o")
        parser.add_argument("--requests-per-minute", type=int)
        parser.add_argument("--tokens-per-minute", type=int)
        parser.add_argument(
            "--per-tenant-share",
            type=float,
            help="at most this share of each limit to one tenant (0 < share <= 1)",
        )
        parser.add_argument("--clear", action="store_true", help="remove the limit")

    def handle(self, *args, **options):
        given = any(
            options[name] is not None
            for name in ("requests_per_minute", "tokens_per_minute", "per_tenant_share")
        )
        if options["clear"]:
            if given:
                raise CommandError("--clear takes no limits")
            RateLimit.objects.filter(key=options["key"]).delete()
        else:
            try:
                set_limit(
                    options["key"],
                    requests_per_minute=options["requests_per_minute"],
                    tokens_per_minute=options["tokens_per_minute"],
                    per_tenant_share=options["per_tenant_share"],
                )
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        limits = RateLimit.objects.order_by("key")
        if not limits:
            self.stdout.write("no rate limits")
        for limit in limits:
            share = (
                f", at most {limit.per_tenant_share:g} of it to one tenant"
                if limit.per_tenant_share is not None
                else ""
            )
            self.stdout.write(
                f"{limit.key}: {limit.requests_per_minute or 'any'} requests and "
                f"{limit.tokens_per_minute or 'any'} tokens per minute{share}"
            )
