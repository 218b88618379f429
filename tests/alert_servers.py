"""Servers on 127.0.0.1 that alerts go to in the tests: a webhook answering each POST with the
next status it is given, and a mailbox behind a real SMTP server (aiosmtpd) that Django's mail
uses (`pytest_plugins = ["tests.alert_servers"]` for the `smtp` fixture)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller


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
