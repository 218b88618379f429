from django.core.management.base import BaseCommand

from moeops.examples import load_example_data


class Command(BaseCommand):
    help = "Load the example data of the write-up (idempotent: running it again changes nothing)."

    def handle(self, *args, **options):
        deployment = load_example_data()
        self.stdout.write(f"Example data loaded: {deployment.name} and the write-up's figures.")
