"""Web-side tasks of watches: beat fires a watch; each alert is delivered with retries."""

from django.conf import settings
from django.dispatch import receiver

from moeops.celery import app
from moeops.watches import services
from moeops.watches.models import Alert, Watch, WatchRun


@app.task(bind=True, max_retries=None)
def fire_watch(self, watch_id, watch_run_id=None, asked=False):
    """Fire one watch (beat's schedule names it, or a person's "Run now": asked); while another
    job holds its host, try again every MOEOPS_WATCH_WAIT_S under the same WatchRun. Returns the
    WatchRun's id, or None for a watch deleted or turned off."""
    watch = Watch.objects.select_related("deployment__host").filter(pk=watch_id).first()
    watch_run = WatchRun.objects.filter(pk=watch_run_id).first() if watch_run_id else None
    if watch is None or not (watch.enabled or asked):
        if watch_run is not None:
            services.watch_run_end(watch_run, "skipped", "the watch was turned off while it waited")
        return None
    watch_run = services.watch_fire(watch=watch, watch_run=watch_run, asked=asked)
    if watch_run.status == "waiting":
        raise self.retry(
            kwargs={"watch_id": watch_id, "watch_run_id": watch_run.pk, "asked": asked},
            countdown=settings.MOEOPS_WATCH_WAIT_S,
        )
    return watch_run.pk


@app.task(bind=True, max_retries=None)
def deliver_alert(self, alert_id):
    """Try the alert once (each attempt and its answer recorded); a failed try is retried by
    Celery with exponential backoff up to MOEOPS_ALERT_ATTEMPTS tries, then the alert stays
    undelivered with its error."""
    alert = (
        Alert.objects.select_related("channel", "watch_run__watch__deployment")
        .filter(pk=alert_id)
        .first()
    )
    if alert is None or alert.status != "pending":
        return None
    attempt = services.alert_attempt(alert=alert)
    if attempt.ok:
        return attempt.number
    if attempt.number >= settings.MOEOPS_ALERT_ATTEMPTS:
        services.alert_give_up(alert=alert)
        return attempt.number
    raise self.retry(countdown=settings.MOEOPS_ALERT_BACKOFF_S * 2 ** (attempt.number - 1))


@receiver(services.watch_waiting)
def _fire_again_later(sender, kwargs, **_):
    fire_watch.apply_async(kwargs=kwargs, countdown=settings.MOEOPS_WATCH_WAIT_S)


@receiver(services.alert_raised)
def _deliver(sender, alert_id, **_):
    deliver_alert.delay(alert_id)
