from django.core.management.base import BaseCommand

from moeops.examples import load_example_data
from moeops.examples.conversations import load_example_workload
from moeops.examples.h200_tune import load_h200_tune
from moeops.insights.services import run_analyze
from moeops.runs.models import SweepRun


class Command(BaseCommand):
    help = (
        "Load the example data of the write-up and analyze its runs, and one H200 kernel tune of "
        "moeops' own (idempotent: running it again changes nothing)."
    )

    def handle(self, *args, **options):
        deployment = load_example_data()
        findings = 0
        # The diagnosis reads the write-up's runs like any other run (plateau, queueing, …).
        for run in SweepRun.objects.filter(provenance__startswith="From the write-up"):
            findings += len(run_analyze(run=run))
        tuning = load_h200_tune()
        workload, _ = load_example_workload()
        self.stdout.write(
            f"Example data loaded: {deployment.name} and the write-up's figures "
            f"({findings} findings from the analysis), {tuning} in vLLM's own kernel, and the "
            f"dataset workload {workload} ({workload.item_count} conversations)."
        )
