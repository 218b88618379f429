"""Web-side tasks of managed engines: failing the work whose worker is gone (Celery beat)."""

from moeops.celery import app
from moeops.engines import services


@app.task
def fail_stale_work():
    """Fail running sweeps, tunes and engine actions whose worker stopped sending heartbeats;
    returns how many of each."""
    return services.stale_work_fail()
