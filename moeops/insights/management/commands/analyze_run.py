import uuid

from django.core.management.base import BaseCommand, CommandError

from domain.jobs import FINISHED_STATUSES
from moeops.insights.services import run_analyze
from moeops.runs.models import SweepRun


class Command(BaseCommand):
    help = "Analyze finished sweep runs now: by run uuid, or every finished run with --all."

    def add_arguments(self, parser):
        parser.add_argument("uuids", nargs="*", metavar="RUN_UUID")
        parser.add_argument("--all", dest="every", action="store_true", help="every finished run")

    def handle(self, *args, uuids, every, **options):
        if every == bool(uuids):
            raise CommandError("name run uuids or pass --all (not both)")
        if every:
            runs = SweepRun.objects.filter(status__in=FINISHED_STATUSES).order_by("created", "id")
        else:
            runs = [_run(value) for value in uuids]
        for run in runs:
            try:
                findings = run_analyze(run=run)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            kinds = ", ".join(sorted({f.kind for f in findings})) or "nothing"
            self.stdout.write(f"{run.uuid} {run.display_label()}: {len(findings)} ({kinds})")


def _run(value):
    try:
        run = SweepRun.objects.filter(uuid=uuid.UUID(value)).first()
    except ValueError:
        run = None
    if run is None:
        raise CommandError(f"no run {value}")
    return run
