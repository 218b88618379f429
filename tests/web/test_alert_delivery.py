"""Alerts delivered to real servers on 127.0.0.1 that the tests start: a webhook answering 500
then 200 (retried by Celery, delivered once, both attempts recorded) and SMTP servers
(aiosmtpd), one taking the mail and one refusing it."""

from moeops.watches import services
from moeops.watches.models import AlertChannel, WatchRun
from tests import page_base
from tests.alert_servers import Webhook

pytest_plugins = ["tests.alert_servers"]

LOAD = {"levels": [8], "input_len": 16, "output_len": 32}


def _regressed(django_capture_on_commit_callbacks):
    """A watch whose second run regressed beyond the noise; its alerts delivered at commit."""
    deployment = page_base.deployment()
    watch = services.watch_create(
        deployment=deployment, name="nightly", parameters=LOAD, every_hours=6
    )
    for peak, interval in ((1000.0, [950.0, 1050.0]), (600.0, [560.0, 640.0])):
        run = page_base.run(deployment, levels=[{"concurrency": 8, "output_throughput": peak}])
        page_base.rounds_spanning(run.levels.get(), peak, interval)
        WatchRun.objects.create(watch=watch, run=run, status="running")
        with django_capture_on_commit_callbacks(execute=True):
            watch_run = services.watch_run_finished(run)
    return watch_run


def _regressed_to_webhook(answers, django_capture_on_commit_callbacks):
    """_regressed with a webhook channel that answers `answers` (HTTP statuses) in turn;
    returns the watch run and the webhook."""
    hook = Webhook(answers)
    try:
        AlertChannel.objects.create(name="hook", kind="webhook", url=hook.url)
        watch_run = _regressed(django_capture_on_commit_callbacks)
    finally:
        hook.close()
    return watch_run, hook


def test_a_webhook_answering_500_then_200_is_retried_and_delivered_once(
    db, settings, django_capture_on_commit_callbacks
):
    watch_run, hook = _regressed_to_webhook([500, 200], django_capture_on_commit_callbacks)
    (alert,) = watch_run.alerts.all()
    assert alert.status == "delivered"
    attempts = list(alert.attempts.values_list("number", "ok", "status_code", "answer", "error"))
    assert attempts == [
        (1, False, 500, "upstream broke", "the webhook answered HTTP 500"),
        (2, True, 200, "ok", ""),
    ]
    # the same message both times; the one answered 200 is the one delivery
    assert len(hook.bodies) == 2 and hook.bodies[0] == hook.bodies[1]
    body = hook.bodies[1]
    assert body["text"].startswith(f"Regression: {watch_run.watch.deployment.name}")
    assert (body["kind"], body["figure"], body["baseline_figure"]) == ("regression", 600.0, 1000.0)


def test_a_webhook_that_keeps_failing_stays_undelivered_with_its_error(
    db, settings, django_capture_on_commit_callbacks
):
    settings.MOEOPS_ALERT_ATTEMPTS = 3
    watch_run, hook = _regressed_to_webhook([503, 503, 503], django_capture_on_commit_callbacks)
    (alert,) = watch_run.alerts.all()
    assert (alert.status, alert.error) == ("failed", "the webhook answered HTTP 503")
    assert alert.attempts.count() == 3 == len(hook.bodies)


def test_mail_goes_through_a_real_smtp_server(db, smtp, django_capture_on_commit_callbacks):
    mailbox = smtp()
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    watch_run = _regressed(django_capture_on_commit_callbacks)
    (alert,) = watch_run.alerts.all()
    assert alert.status == "delivered"
    ((to, content),) = mailbox.messages
    assert to == ["ops@example.com"]
    assert f"Subject: Regression: {watch_run.watch.deployment.name} (watch nightly)" in content
    assert "peak output tok/s fell 40%" in content


def test_an_smtp_server_that_refuses_leaves_the_alert_undelivered_saying_why(
    db, settings, smtp, django_capture_on_commit_callbacks
):
    settings.MOEOPS_ALERT_ATTEMPTS = 2
    smtp(refuse=True)
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    watch_run = _regressed(django_capture_on_commit_callbacks)
    (alert,) = watch_run.alerts.all()
    assert alert.status == "failed"
    assert alert.error == (
        f"the SMTP server at 127.0.0.1:{settings.EMAIL_PORT} did not take the mail: it refused "
        "ops@example.com (550 5.1.1 mailbox unavailable)"
    )
    assert alert.attempts.count() == 2
