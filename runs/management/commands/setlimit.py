from django.core.management.base import BaseCommand, CommandError

from runs.engine.limits import SCOPES, limits, set_max_running


class Command(BaseCommand):
    help = (
        "Set the global max_running of a kind or a queue across every worker and tenant "
        "(idempotent; --clear lifts it). Prints what is now in force."
    )

    def add_arguments(self, parser):
        parser.add_argument("scope", choices=SCOPES, help="kind or queue")
        parser.add_argument("name", help="the kind's or the queue's name")
        parser.add_argument("--max-running", type=int, help="at most this many running at once")
        parser.add_argument("--clear", action="store_true", help="lift the limit")

    def handle(self, *args, **options):
        if options["clear"] == (options["max_running"] is not None):
            raise CommandError("give either --max-running N or --clear")
        try:
            set_max_running(options["scope"], options["name"], options["max_running"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        in_force = limits()
        if not in_force:
            self.stdout.write("no global limits")
        for limit in in_force:
            self.stdout.write(
                f"{limit.scope} {limit.name}: max_running {limit.max_running} "
                f"({limit.running} running now)"
            )
