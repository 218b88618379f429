"""Web-side tasks of the insights app: analysis after a run finishes."""

from django.db import OperationalError

from moeops.celery import app
from moeops.insights import services
from moeops.runs.models import SweepRun
from moeops.watches.services import watch_run_finished


# A database briefly locked or unreachable is worth a retry; a missing run is not.
@app.task(autoretry_for=(OperationalError,), retry_backoff=True, max_retries=5)
def analyze_run(run_id):
    """Analyze one finished run; returns the ids of the findings it proposed."""
    run = SweepRun.objects.filter(pk=run_id).first()
    if run is None:
        return []
    findings = [finding.pk for finding in services.run_analyze(run=run)]
    # TODO(issue 31): the job-finished hook calls this; until it exists the analysis does
    watch_run_finished(run)
    return findings
