"""`make run` and its children when one of them dies or it is told to stop: Ctrl-C (SIGINT) or
SIGTERM leaves no process it started running (the managed stand-in the host worker started in
a process group of its own included) and frees its ports; a killed worker is started again with
a sentence saying how it died; `python -m tests.engine serve` stops its vLLM on SIGTERM."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.e2e.test_worker_make_run import _manage, _wait
from tests.fakes import ROOT

pytest_plugins = ["tests.stack"]
pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.timeout(240)]


DATABASE = "moeops.sqlite3"  # make run's database in its var/ folder (moeops.settings)


def _env(var_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        MOEOPS_VAR_DIR=str(var_dir),
        MOEOPS_HEALTH_CHECK_INTERVAL_S="2",
        MOEOPS_HEARTBEAT_S="2",
        PYTHONUNBUFFERED="1",
    )
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(var/ folder, token): a clone's var/ after `migrate`, `load_example_data` and
    `create_token`, made once for the module (some 25 s on 2 busy cores); each test runs make
    run on a copy of its database."""
    folder = tmp_path_factory.mktemp("prepared-var")
    env = _env(folder)
    _manage(env, "migrate", "--noinput")
    _manage(env, "load_example_data")
    return folder, _manage(env, "create_token", "make-run-faults").strip()


class RunLocal:
    """`manage.py runlocal` in a session of its own on fresh ports and a var/ folder of tmp,
    holding a copy of `prepared`'s database."""

    def __init__(self, tmp_path, free_port, prepared):
        env = _env(tmp_path)
        folder, self.token = prepared
        shutil.copyfile(folder / DATABASE, tmp_path / DATABASE)
        self.tmp_path = tmp_path
        self.port, self.standin_port = free_port(), free_port()
        self.log_path = tmp_path / "runlocal.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "runlocal", "--port", str(self.port)]
                + ["--standin-port", str(self.standin_port)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}/api/v1",
            headers={"Authorization": f"Bearer {self.token}"},
            # on a busy machine a first answer may take its time
            timeout=30,
        )

    def output(self):
        return self.log_path.read_text(errors="replace")

    def standin_healthy(self):
        """The managed stand-in's deployment once a health check found it healthy, and the
        engine's process as the worker's supervisor records it under var/engines."""

        def healthy():
            try:
                found = self.api.get("/deployments", params={"host": "local"}).json()["items"]
            except httpx.HTTPError:
                return None  # the web server is not up yet
            return found[0] if found and found[0]["status"] == "healthy" else None

        deployment = _wait("the managed stand-in's health check", healthy, 120)
        state = self.tmp_path / "engines" / str(deployment["id"]) / "engine.json"
        assert state.exists(), "the engine's state is not under the clone's var/ (here tmp)"
        pid = int(re.search(r'"pid": (\d+)', state.read_text())[1])
        assert os.getsid(pid) == pid != os.getsid(self.proc.pid)
        return deployment, psutil.Process(pid)

    def redis_port(self):
        """The embedded Redis's port, as make run printed it."""
        return int(re.search(r"broker: redis://127.0.0.1:(\d+)/", self.output())[1])

    def worker(self):
        """The GPU-host worker's main process (a child of runlocal)."""
        for child in psutil.Process(self.proc.pid).children():
            # the worker just killed is a zombie until make run reaps it: no command line
            if "workers worker" in _cmdline(child):
                return child
        return None

    def kill_worker(self):
        """SIGKILL the worker (once it has run long enough to be started again); returns it."""
        worker = self.worker()
        _past_its_start(worker)
        worker.send_signal(signal.SIGKILL)
        _wait("the worker started again", lambda: "starting gpu-worker again" in self.output(), 30)
        return worker

    def redis(self):
        """The embedded Redis's process, or None once it is gone."""
        with contextlib.suppress(TypeError):
            port = f":{self.redis_port()}"
            for proc in psutil.process_iter(["cmdline"]):
                if port in " ".join(proc.info["cmdline"] or []):
                    return proc
        return None

    def close(self):
        self.api.close()
        if self.proc.poll() is None:
            # the embedded Redis daemonizes into a session of its own: the group's SIGKILL,
            # which stops make run without its own clean-up, does not reach it
            redis = self.redis()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            if redis is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    redis.kill()


def _past_its_start(proc):
    """Wait until `proc` has run longer than make run's crash window (CRASH_LOOP_S, 10 s): a
    process dying sooner would only die again, and is neither restarted nor said to have died
    of its own cause."""
    time.sleep(max(0.0, proc.create_time() + 11 - time.time()))


@pytest.fixture
def runlocal(tmp_path, free_port, prepared):
    started = RunLocal(tmp_path, free_port, prepared)
    under = []
    yield started, under
    started.close()
    # whatever a failed test left running (the engines in their own process groups too)
    for proc in under:
        if not _gone(proc):
            proc.kill()


def _gone(proc):
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _cmdline(proc):
    """The process's command line, "" once it has gone or is a zombie (a killed worker is one
    until make run reaps it)."""
    try:
        return " ".join(proc.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""


def _free(port):
    with socket.socket() as s:
        # connections closed by the server itself may sit in TIME_WAIT; SO_REUSEADDR passes them
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_stopping_make_run_leaves_no_process_and_frees_its_ports(runlocal, sig):
    run, under = runlocal
    _, engine = run.standin_healthy()
    # an engine whose worker died is orphaned: it must still go with make run
    run.kill_worker()
    under.extend({engine, *psutil.Process(run.proc.pid).children(recursive=True)})
    assert any("gunicorn" in _cmdline(p) for p in under)

    run.proc.send_signal(sig)
    run.proc.wait(60)
    left = [f"{p.pid} {_cmdline(p)}" for p in under if not _gone(p)]
    assert left == [], f"still running after make run stopped:\n{run.output()[-3000:]}"
    assert _free(run.port) and _free(run.standin_port)


def test_a_killed_worker_is_started_again_with_a_sentence_and_the_web_tier_stays(runlocal):
    run, under = runlocal
    deployment, engine = run.standin_healthy()
    worker = run.kill_worker()
    said = run.output()
    assert re.search(
        rf"gpu-worker \(pid {worker.pid}\) was killed by signal SIGKILL; its last", said
    )
    assert "stopping everything" not in said
    restarted = _wait("a new worker", run.worker, 10)
    assert restarted.pid != worker.pid
    under.extend(psutil.Process(run.proc.pid).children(recursive=True))

    # the web tier answered throughout, the engine still runs, and the new worker takes work:
    # beat's checks (every 2 s) are answered by it
    checks = f"/deployments/{deployment['id']}/health-checks"
    before = {c["id"] for c in run.api.get(checks).json()["items"]}

    def checked_again():
        items = run.api.get(checks).json()["items"]
        return [c for c in items if c["id"] not in before and c["status"] == "healthy"]

    _wait("a check answered by the restarted worker", checked_again, 60)
    assert engine.is_running()
    assert run.proc.poll() is None


def test_the_web_server_dying_stops_everything_naming_it(runlocal):
    run, under = runlocal
    run.standin_healthy()
    under.extend(psutil.Process(run.proc.pid).children(recursive=True))
    web = next(p for p in psutil.Process(run.proc.pid).children() if "gunicorn" in p.cmdline())
    _past_its_start(web)
    web.send_signal(signal.SIGKILL)
    run.proc.wait(60)
    said = run.output()
    assert f"web (pid {web.pid}) was killed by signal SIGKILL; its last lines:" in said
    assert "web died and is not restarted: stopping everything." in said
    assert [p.pid for p in under if not _gone(p)] == []
    assert _free(run.port) and _free(run.standin_port)


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_sigterm_to_tests_engine_serve_stops_its_vllm(tmp_path, free_port):
    from tests.engine import ensure_model

    ensure_model()
    port = free_port()
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 (the child writes to it)
    serve = subprocess.Popen(
        [sys.executable, "-m", "tests.engine", "serve", "--port", str(port), "--max-num-seqs", "4"],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    vllm = []
    try:
        output = lambda: (tmp_path / "serve.log").read_text()  # noqa: E731
        _wait("vLLM ready", lambda: "ready after" in output() or serve.poll() is not None, 500)
        assert serve.poll() is None, output()
        vllm = psutil.Process(serve.pid).children(recursive=True)
        assert vllm and not _free(port)

        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
        psutil.wait_procs(vllm, timeout=10)
        assert [p.pid for p in vllm if not _gone(p)] == []
        assert _free(port)
    finally:
        log.close()
        serve.kill()
        for proc in vllm:
            with contextlib.suppress(psutil.Error):
                proc.kill()


def test_the_embedded_broker_dying_stops_everything_saying_so(runlocal):
    run, under = runlocal
    run.standin_healthy()
    under.extend(psutil.Process(run.proc.pid).children(recursive=True))
    redis = run.redis()
    redis.kill()
    run.proc.wait(60)
    assert f"the embedded Redis (pid {redis.pid}) is gone: stopping everything." in run.output()
    assert [p.pid for p in under if not _gone(p)] == []
