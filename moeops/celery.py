"""The web side's Celery app: tasks that need the database (analysis after a run, housekeeping).

GPU-host tasks belong to the `workers` app; the web side enqueues them by name with
`send_host_task`, so it never imports workers' code.
"""

import os

from celery import Celery, chain
from celery.signals import beat_init

from domain.queues import BROKER_TIMEOUTS, VISIBILITY_TIMEOUT_S

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "moeops.settings")

app = Celery("moeops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_default_queue="web",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    # same Redis as the GPU-host workers: an unacked sweep must not be re-delivered after
    # Redis' default hour
    broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S, **BROKER_TIMEOUTS},
    # one more try after a lost connection (Redis restarted), then the send fails: a request
    # that enqueues waits at most twice BROKER_ANSWER_S for a broker that does not answer
    task_publish_retry_policy={
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.2,
    },
)
app.autodiscover_tasks()


def send_host_task(name, host, *, args=(), kwargs=None, **options):
    """Enqueue the GPU-host task `workers.<name>` on the host's own queue; options go to
    Celery's send_task (e.g. expires, s)."""
    return app.send_task(
        f"workers.{name}", args=args, kwargs=kwargs or {}, queue=host.queue_name, **options
    )


def send_host_chain(host, steps, **options):
    """Enqueue GPU-host tasks as one Celery chain on the host's queue: each runs when the one
    before it returned, none after one that raised. steps: [(name, kwargs)] of `workers.<name>`
    tasks."""
    signatures = [
        app.signature(f"workers.{name}", kwargs=kwargs, queue=host.queue_name, immutable=True)
        for name, kwargs in steps
    ]
    return chain(*signatures).apply_async(**options)


@beat_init.connect
def _drop_schedules_taken_out_of_settings(sender, **kwargs):
    """The database scheduler adds the settings' entries (CELERY_BEAT_SCHEDULE) to the database
    when beat starts but never removes one: health checks turned off (interval 0) stay off."""
    from django.conf import settings
    from django_celery_beat.models import PeriodicTask

    name = settings.MOEOPS_HEALTH_CHECK_SCHEDULE
    if name not in app.conf.beat_schedule:
        PeriodicTask.objects.filter(name=name).delete()
