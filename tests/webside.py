"""The web side's Celery processes for e2e tests (`pytest_plugins = ["tests.webside"]`): beat
(django-celery-beat's database scheduler) and a worker on the queue web, on the test's database
and Redis, beside the live server of tests/stack.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]


def _database_url():
    """The test database as DATABASE_URL, for processes started beside the live server."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    password = f":{db['PASSWORD']}" if db["PASSWORD"] else ""
    return (
        f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/"
        f"{db['NAME']}"
    )


def _celery(args, env, log_path):
    log = open(log_path, "w")  # noqa: SIM115 (the child writes to it)
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "moeops", *args, "--loglevel", "INFO"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture
def web_side(redis_url, tmp_path):
    """beat and the web worker (queue web) on the test's database and broker."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MOEOPS_")},
        "DATABASE_URL": _database_url(),
        "REDIS_URL": redis_url,
        "MOEOPS_VAR_DIR": str(tmp_path),
        # beat reads its table every second, a waiting watch tries again every second
        "MOEOPS_BEAT_MAX_LOOP_S": "1",
        "MOEOPS_WATCH_WAIT_S": "1",
        "MOEOPS_HEALTH_CHECK_INTERVAL_S": "0",
        "PYTHONUNBUFFERED": "1",
    }
    queue = f"web-e2e-{os.getpid()}"
    procs = [
        _celery(["beat"], env, tmp_path / "beat.log"),
        _celery(
            ["worker", "-Q", "web", "-n", f"{queue}@%h", "-c", "1", "--without-gossip"]
            + ["--without-mingle", "--without-heartbeat"],
            env,
            tmp_path / "web-worker.log",
        ),
    ]
    yield tmp_path
    for proc in procs:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)
