"""Alerts delivered to real servers on 127.0.0.1 that the tests start: a webhook answering 500
then 200 (retried by Celery, delivered once, both attempts recorded) and SMTP servers
(aiosmtpd), one taking the mail and one refusing it."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller

from moeops.watches import services
from moeops.watches.models import AlertChannel, WatchRun
from tests import page_base

LOAD = {"levels": [8], "input_len": 16, "output_len": 32}


class Webhook:
    """An HTTP server on 127.0.0.1 answering each POST with the next status of `answers`."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.bodies = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers["Content-Length"])
                hook.bodies.append(json.loads(self.rfile.read(length)))
                status = hook.answers.pop(0)
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"upstream broke")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/T0-secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Mailbox:
    def __init__(self, refuse=False):
        self.refuse = refuse
        self.messages = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.refuse:
            return "550 5.1.1 mailbox unavailable"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((envelope.rcpt_tos, envelope.content.decode()))
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp(settings, free_port):
    """smtp(refuse=False) -> a Mailbox behind a real SMTP server that Django's mail uses."""
    controllers = []

    def start(refuse=False):
        mailbox = Mailbox(refuse)
        port = free_port()
        controller = Controller(mailbox, hostname="127.0.0.1", port=port)
        controller.start()
        controllers.append(controller)
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
        return mailbox

    yield start
    for controller in controllers:
        controller.stop()


def _regressed(django_capture_on_commit_callbacks):
    """A watch whose second run regressed beyond the noise; its alerts delivered at commit."""
    deployment = page_base.deployment()
    watch = services.watch_create(
        deployment=deployment, name="nightly", parameters=LOAD, every_hours=6
    )
    for peak, interval in ((1000.0, [950.0, 1050.0]), (600.0, [560.0, 640.0])):
        level = {
            "concurrency": 8,
            "output_throughput": peak,
            "intervals": {"output_throughput": interval},
        }
        run = page_base.run(deployment, levels=[level])
        WatchRun.objects.create(watch=watch, run=run, status="running")
        with django_capture_on_commit_callbacks(execute=True):
            watch_run = services.watch_run_finished(run)
    return watch_run


def test_a_webhook_answering_500_then_200_is_retried_and_delivered_once(
    db, settings, django_capture_on_commit_callbacks
):
    hook = Webhook([500, 200])
    try:
        AlertChannel.objects.create(name="hook", kind="webhook", url=hook.url)
        watch_run = _regressed(django_capture_on_commit_callbacks)
    finally:
        hook.close()
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
    hook = Webhook([503, 503, 503])
    try:
        AlertChannel.objects.create(name="hook", kind="webhook", url=hook.url)
        watch_run = _regressed(django_capture_on_commit_callbacks)
    finally:
        hook.close()
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
