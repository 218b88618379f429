from django.core.management.base import BaseCommand, CommandError

from moeops.api.models import ApiToken
from moeops.fleet.models import Host


class Command(BaseCommand):
    help = "Create an API token and print it once (only its hash is stored)."

    def add_arguments(self, parser):
        parser.add_argument("name", help="who or what uses the token, e.g. ci or worker-h200")
        parser.add_argument("--host", help="bind the token to this host: it writes only its data")
        parser.add_argument("--read-only", action="store_true", help="a token that only reads")

    def handle(self, *args, name, host, read_only, **options):
        bound = None
        if host:
            bound = Host.objects.filter(name=host).first()
            if bound is None:
                raise CommandError(f"no host named {host!r}")
        _, plaintext = ApiToken.issue(name=name, host=bound, read_only=read_only)
        self.stdout.write(plaintext)
