"""The whole sweep path really started, for end-to-end tests: `sweep_stack` / `make_sweep_stack`.

A live Django server (pytest-django `live_server`, transactional database), a GPU-host Celery
worker subprocess (`celery -A workers worker -Q host.<name>`) on the real Redis of `redis_url`,
a stand-in engine subprocess, and in the database a host, a token bound to it, the GLM-5 model
and a deployment that points at the stand-in. A test module loads the fixtures with:

    pytest_plugins = ["tests.stack"]

`stack.start_sweep(levels=[8, 16])` goes through the web tier's own `run_start` (run row,
`transaction.on_commit`, `send_host_task` by name); `stack.wait_for_run(run)` waits until the
run finishes.
"""

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil
import pytest
from celery import Celery
from django.contrib.auth.models import User
from django.db import OperationalError

from domain.jobs import FINISHED_STATUSES
from domain.launch import flag_value
from localstack.standin import spawn_standin
from moeops import celery as web_celery
from moeops.api.models import ApiToken
from moeops.engines import services as engine_services
from moeops.engines.models import EngineAction
from moeops.fleet.models import GPU, Deployment, Host, ModelSpec
from moeops.runs import services as run_services
from moeops.runs.models import SweepRun
from workers.engine_supervisor import EngineSupervisor
from workers.telemetry import TelemetrySampler

ROOT = Path(__file__).resolve().parent.parent
GLM5_CONFIG = ROOT / "moeops/examples/glm-5-fp8_config.json"
WORKER_READY_TIMEOUT_S = 60
# the fault suite's marks: whole-stack tests, run once, in make test's SQLite pass (conftest.py)
FAULT_SUITE = [
    pytest.mark.e2e,
    pytest.mark.faults,
    pytest.mark.sqlite_once,
    pytest.mark.timeout(180),
]


class WorkerProcess:
    """`celery -A workers worker -Q host.<name>` in its own process group, logging to a file."""

    def __init__(self, env, queue, log_path):
        self.env = env
        self.queue = queue
        self.log_path = log_path
        self.proc = None

    def start(self, wait_ready=True, **extra_env):
        """Start it; wait_ready: until it logs "ready." (it has reached its broker)."""
        since = len(self.log()) if Path(self.log_path).exists() else 0
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "workers",
                    "worker",
                    "-Q",
                    self.queue,
                    "-n",
                    f"{self.queue}-{uuid.uuid4().hex[:6]}@%h",
                    "--loglevel",
                    "INFO",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                cwd=ROOT,
                env={**self.env, **extra_env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if wait_ready:
            self.wait_for_log("ready.", WORKER_READY_TIMEOUT_S, since=since)
        return self

    def log(self):
        return Path(self.log_path).read_text(errors="replace")

    def wait_for_log(self, text, timeout, since=0):
        """Wait until `text` appears in the log after character `since`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log()[since:]:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"worker log never showed {text!r}:\n{self.log()[-4000:]}")

    def task_pids(self):
        """The pool processes that run tasks (children of the main worker process)."""
        return [child.pid for child in psutil.Process(self.proc.pid).children()]

    def kill(self):
        """SIGKILL the main process and its pool: the machine's worker is gone at once."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        # cold shutdown: a sweep still running is abandoned, not waited for
        os.killpg(self.proc.pid, signal.SIGQUIT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class TogglingProxy:
    """A TCP forwarder (to the web tier, or to Redis) that can be taken down (connections
    refused, as on a closed port) and back."""

    def __init__(self, target_port, port):
        self.target_port = target_port
        self.port = port
        self._listener = None
        self._conns = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._loop, name="web-proxy", daemon=True)
        self.up()
        self._thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def up(self):
        with self._lock:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            listener.setblocking(False)
            self._listener = listener
            self._sel.register(listener, selectors.EVENT_READ, None)

    def down(self):
        """Refuse new connections and cut the open ones, as a stopped web server does."""
        with self._lock:
            if self._listener is not None:
                self._sel.unregister(self._listener)
                self._listener.close()
                self._listener = None
            for sock in list(self._conns):
                self._drop(sock)

    def _drop(self, sock):
        if sock in self._conns:
            self._conns.discard(sock)
            self._sel.unregister(sock)
            sock.close()

    def _loop(self):
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.1):
                with self._lock:
                    if key.data is None:
                        if key.fileobj is not self._listener:
                            continue
                        client, _ = self._listener.accept()
                        server = socket.create_connection(("127.0.0.1", self.target_port))
                        for a, b in ((client, server), (server, client)):
                            a.setblocking(False)
                            self._conns.add(a)
                            self._sel.register(a, selectors.EVENT_READ, b)
                        continue
                    source, sink = key.fileobj, key.data
                    if source not in self._conns:
                        continue
                    try:
                        data = source.recv(65536)
                        if data:
                            sink.setblocking(True)
                            sink.sendall(data)
                            sink.setblocking(False)
                            continue
                    except OSError:
                        pass
                    self._drop(source)
                    self._drop(sink)

    def close(self):
        self.down()
        self._stop.set()
        self._thread.join(5)


class SweepStack:
    """Handles on the started parts; see the module docstring."""

    def __init__(
        self,
        *,
        live_server_url,
        api_url,
        host,
        token,
        deployment,
        standin_url,
        worker,
        spool_dir,
        proxy,
        broker_proxy,
        standin,
    ):
        self.live_server_url = live_server_url
        self.api_url = api_url
        self.host = host
        self.token = token
        self.deployment = deployment
        self.standin_url = standin_url
        self.worker = worker
        self.spool_dir = spool_dir
        self.proxy = proxy
        self.broker_proxy = broker_proxy
        self.standin = standin

    def start_sweep(self, levels, *, input_len=16, output_len=32, label="e2e sweep", **extra):
        """A run created and enqueued by the web tier's own run_start."""
        parameters = {"levels": list(levels), "input_len": input_len, "output_len": output_len}
        run, _ = run_services.run_start(
            deployment=self.deployment, parameters={**parameters, **extra}, label=label
        )
        return run

    def wait_for_run(self, run, timeout=90, until=None):
        """The run refreshed once `until(run)` holds (default: it finished)."""
        until = until or (lambda r: r.status in FINISHED_STATUSES)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                run = SweepRun.objects.get(pk=run.pk)
                if until(run):
                    return run
            except OperationalError:
                # SQLite's shared-cache test database: a table the server writes is locked
                pass
            time.sleep(0.2)
        raise AssertionError(
            f"run {run.pk} still {run.status} {run.progress} after {timeout} s; worker log:\n"
            + self.worker.log()[-6000:]
        )

    @staticmethod
    def action_end(action, timeout=90):
        """The engine action refreshed once it finished."""

        def done():
            found = EngineAction.objects.get(pk=action.pk)
            return found if found.is_finished else None

        return SweepStack.wait_until(done, timeout, "the engine action's end")

    @staticmethod
    def wait_until(check, timeout, what="answer"):
        """check()'s first answer that is not None, asked every 0.2 s for timeout s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if (found := check()) is not None:
                    return found
            except OperationalError:
                # SQLite's shared-cache test database: a table the server writes is locked
                pass
            time.sleep(0.2)
        raise AssertionError(f"no {what} after {timeout} s")

    def wait_for_findings(self, run, keys, timeout=60):
        """The deployment's findings {(kind, key): Finding} once those of keys exist: the
        analysis runs after the run's final status commits, so a test that saw the status
        may look before the findings are written."""
        from moeops.insights.models import Finding

        def found():
            rows = Finding.objects.filter(deployment_id=run.deployment_id)
            return {(f.kind, f.key): f for f in rows}

        def complete():
            now = found()
            return now if set(keys) <= set(now) else None

        try:
            return self.wait_until(complete, timeout)
        except AssertionError:
            # what there is: the test's own assertion then names the finding that is missing
            return found()

    def api_get(self, path):
        """The JSON answer of GET /api/v1<path>, asked with the host's token."""
        response = httpx.get(
            f"{self.live_server_url}/api/v1{path}",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        response.raise_for_status()
        return response.json()

    def spooled(self):
        """Pushes waiting in the worker's spool folder."""
        return sorted(Path(self.spool_dir).glob("*.json"))

    def wait_for_empty_spool(self, timeout=30):
        deadline = time.monotonic() + timeout
        while self.spooled() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.spooled()


@pytest.fixture(scope="session")
def nvml_here():
    """Whether this machine has NVML (a GPU host): then sweeps record real telemetry."""
    sampler = TelemetrySampler().start()
    sampler.stop()
    return sampler.status == "recorded"


def _producer(redis_url):
    # The web app's broker is fixed when Django's settings load; tests pick theirs later.
    app = Celery("moeops-test-producer", broker=redis_url)
    app.conf.update(task_serializer="json", accept_content=["json"])
    return app


@pytest.fixture
def make_sweep_stack(live_server, redis_url, free_port, tmp_path, transactional_db, monkeypatch):
    """make_sweep_stack(max_running_requests=16, standin_args=(), via_proxy=False,
    broker_via_proxy=False, start_worker=True, engine_url=None, model=None,
    deployment_fields=None, gpus=(), **worker_env).

    standin_args go to `python -m localstack.standin` (e.g. "--drop-rate", "0.05"); via_proxy puts
    a TogglingProxy between the worker and the web tier (stack.proxy.down() / .up()), and
    broker_via_proxy one between the worker and Redis (stack.broker_proxy; the web tier reaches
    Redis directly); start_worker=False leaves stack.worker to the test to start;
    engine_url points the deployment at a running engine instead of a new stand-in, model is its
    ModelSpec (default: GLM-5), deployment_fields override the deployment's, gpus are the host's
    GPU rows (dicts of GPU fields; the deployment uses them all); worker_env adds to the
    worker's environment.
    """
    started = []

    def make(
        max_running_requests=16,
        standin_args=(),
        *,
        via_proxy=False,
        broker_via_proxy=False,
        start_worker=True,
        engine_url=None,
        model=None,
        deployment_fields=None,
        gpus=(),
        **worker_env,
    ):
        name = f"e2e-{uuid.uuid4().hex[:8]}"
        standin = None
        if engine_url is None:
            standin_url, standin = spawn_standin(
                [
                    "--model",
                    "glm-5-standin",
                    "--max-running-requests",
                    str(max_running_requests),
                    *standin_args,
                ]
            )
            started.append(standin.kill)
        if model is None:
            model, _ = ModelSpec.objects.get_or_create(
                name="GLM-5 (e2e)",
                defaults={"config_json": json.loads(GLM5_CONFIG.read_text())},
            )
        host = Host.objects.create(name=name, description="end-to-end test host")
        for index, gpu in enumerate(gpus):
            GPU.objects.create(host=host, index=index, **gpu)
        _, token = ApiToken.issue(name=f"worker {name}", host=host)
        fields = {
            "engine": "sglang",
            "max_running_requests": max_running_requests,
            "endpoint_url": engine_url or standin_url,
            "served_model_name": "glm-5-standin",
            "status": "healthy",
            **(deployment_fields or {}),
        }
        deployment = Deployment.objects.create(
            name=f"{model.name.split(' (')[0]} on {name}", model=model, host=host, **fields
        )
        deployment.gpus.set(host.gpus.all())
        web_port = int(live_server.url.rsplit(":", 1)[1])
        proxy = TogglingProxy(web_port, free_port()) if via_proxy else None
        if proxy is not None:
            started.append(proxy.close)
        api_url = proxy.url if proxy else live_server.url
        broker_url, broker_proxy = redis_url, None
        if broker_via_proxy:
            broker = urlsplit(redis_url)
            broker_proxy = TogglingProxy(broker.port, free_port())
            started.append(broker_proxy.close)
            netloc = broker.netloc.replace(f":{broker.port}", f":{broker_proxy.port}")
            broker_url = urlunsplit(broker._replace(netloc=netloc))
        spool_dir = tmp_path / f"spool-{name}"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MOEOPS_")},
            "REDIS_URL": broker_url,
            "MOEOPS_HOST": name,
            "MOEOPS_URL": api_url,
            "MOEOPS_TOKEN": token,
            "MOEOPS_SPOOL_DIR": str(spool_dir),
            "MOEOPS_TUNE_DIR": str(tmp_path / f"tune-{name}"),
            "PYTHONUNBUFFERED": "1",
            **worker_env,
        }
        worker = WorkerProcess(env, host.queue_name, tmp_path / f"worker-{name}.log")
        started.append(worker.stop)
        if start_worker:
            worker.start()
        return SweepStack(
            live_server_url=live_server.url,
            api_url=api_url,
            host=host,
            token=token,
            deployment=deployment,
            standin_url=None if engine_url else standin_url,
            worker=worker,
            spool_dir=spool_dir,
            proxy=proxy,
            broker_proxy=broker_proxy,
            standin=standin,
        )

    monkeypatch.setattr(web_celery, "app", _producer(redis_url))
    yield make
    for stop in reversed(started):
        stop()


@pytest.fixture
def sweep_stack(make_sweep_stack):
    """The default stack: stand-in with --max-running-requests 16, worker straight to the web."""
    return make_sweep_stack()


def stop_managed_engines(stack, supervisor, port):
    """Stop every engine a test's worker started, even one its state file no longer names: the
    worker first (it could start another), then what supervisor's state files name, then any
    process started to serve port (`--port <port>`), by its process group."""
    stack.worker.stop()
    for folder in supervisor.root.glob("*/engine.json"):
        supervisor.stop(int(folder.parent.name), grace_s=5)
    for process in psutil.process_iter(["cmdline"]):
        if flag_value(process.info["cmdline"] or [], "--port") == str(port):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(process.pid)
                if group != os.getpgrp():
                    os.killpg(group, signal.SIGKILL)


@pytest.fixture
def managed_standin(make_sweep_stack, free_port, tmp_path):
    """A stack whose deployment is a managed stand-in: recipe v1 (--max-running-requests 16 on
    a port of its own) started by a first restart through the worker. Adds to the stack: staff
    (a staff user), port, engines (the worker's EngineSupervisor) and act(kind, **fields) (an
    engine action without re-sweep, its end waited for); every engine it started is stopped."""
    port = free_port()
    cache = tmp_path / "cache"
    stack = make_sweep_stack(
        engine_url=f"http://127.0.0.1:{port}",
        deployment_fields={"management": "managed"},
        MOEOPS_CACHE_DIR=str(cache),
        MOEOPS_HEARTBEAT_S="1",
    )
    stack.staff = User.objects.create_user("ops", is_staff=True)
    stack.port = port
    stack.engines = EngineSupervisor(cache / "engines")
    SweepStack.wait_until(
        lambda: True if Host.objects.get(pk=stack.host.pk).worker_alive() else None,
        WORKER_READY_TIMEOUT_S,
        "the worker's heartbeat",
    )

    def act(kind, wait=True, **fields):
        stack.deployment.refresh_from_db()
        action = engine_services.engine_action_start(
            deployment=stack.deployment, kind=kind, user=stack.staff, resweep=False, **fields
        )
        return stack.action_end(action) if wait else action

    stack.act = act
    engine_services.recipe_create(
        deployment=stack.deployment,
        argv=[sys.executable, "-m", "localstack.standin", "--port", str(port)]
        + ["--max-running-requests", "16"],
        ready_timeout_s=60,
        author=stack.staff,
    )
    first = act("restart")
    assert first.status == "succeeded", (first.error, first.steps)
    yield stack
    stop_managed_engines(stack, stack.engines, port)
