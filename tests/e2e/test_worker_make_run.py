"""`make run` with its workers: web, the web-side Celery worker and beat, the GPU-host worker
and the stand-in engine come up, the stand-in deployment is checked (at once, then every
interval), and a sweep started from the UI finishes."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.fakes import ROOT

pytest_plugins = ["tests.stack"]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _manage(env, *args):
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout


def _wait(what, check, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _csrf(page):
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]


def test_make_run_brings_up_both_workers_and_the_standin_and_a_ui_sweep_finishes(
    tmp_path, nvml_here, free_port
):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        MOEOPS_VAR_DIR=str(tmp_path), MOEOPS_HEALTH_CHECK_INTERVAL_S="2", PYTHONUNBUFFERED="1"
    )
    env.pop("DJANGO_SETTINGS_MODULE", None)
    _manage(env, "migrate", "--noinput")
    _manage(env, "load_example_data")
    token = _manage(env, "create_token", "make-run-test").strip()
    port, standin_port = free_port(), free_port()
    log = open(tmp_path / "runlocal.log", "w")  # noqa: SIM115 (the child writes to it)
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runlocal", "--port", str(port)]
        + ["--standin-port", str(standin_port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    # on a busy machine the web server's first answers may take their time
    api = httpx.Client(
        base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    web = httpx.Client(base_url=base, follow_redirects=True, timeout=30)
    try:
        output = lambda: (tmp_path / "runlocal.log").read_text()  # noqa: E731
        login = _wait("the admin login", lambda: re.search(r"login: (\S+) / (\S+)", output()), 90)
        assert f"stand-in engine: http://127.0.0.1:{standin_port}" in output()

        # the GPU-host worker checks the stand-in deployment as soon as it is up
        def checked():
            found = api.get("/deployments", params={"host": "local"}).json()["items"]
            return found if found and found[0]["status"] == "healthy" else None

        (deployment,) = _wait("the stand-in's health check", checked, 60)
        assert deployment["name"] == "GLM-5 (stand-in)"
        assert deployment["endpoint_url"] == f"http://127.0.0.1:{standin_port}"
        assert deployment["status_detail"] == "stand-in serves glm-5-standin"

        # beat asks for a check every interval too: runlocal's first check and two of beat's
        def periodic():
            checks = api.get(f"/deployments/{deployment['id']}/health-checks").json()["items"]
            return len([c for c in checks if c["trigger"] == "periodic"]) >= 3

        _wait("beat's periodic checks", periodic, 30)

        page = web.get("/accounts/login/")
        web.post(
            "/accounts/login/",
            data={"username": login[1], "password": login[2], "csrfmiddlewaretoken": _csrf(page)},
            headers={"Referer": f"{base}/accounts/login/"},
        )
        # the URL and login it printed work, and the write-up's example data is there
        assert f"moeops is running at {base}/" in output()
        dashboard = web.get("/")
        assert "GLM-5-NVFP4 on 8× RTX PRO 6000" in dashboard.text
        assert "912" in dashboard.text
        page = web.get(f"/deployments/{deployment['id']}/")
        assert "GLM-5 (stand-in)" in page.text
        started = web.post(
            f"/deployments/{deployment['id']}/sweep/",
            data={
                "csrfmiddlewaretoken": _csrf(page),
                "label": "first sweep",
                "levels": "16,64,128",
                "input_len": "64",
                "output_len": "32",
                "prompts_per_level": "256",
                "warmup": "4",
                "endpoint": "completions",
            },
            headers={"Referer": f"{base}/deployments/{deployment['id']}/"},
        )
        run_uuid = re.search(r"/runs/([0-9a-f-]{36})/", str(started.url))[1]

        def finished():
            run = api.get(f"/runs/{run_uuid}").json()
            return run if run["status"] in ("succeeded", "failed", "cancelled") else None

        run = _wait("the sweep to finish", finished, 90)
        assert run["status"] == "succeeded", run["error"]
        assert run["level_count"] == 3
        assert run["telemetry_status"] == ("recorded" if nvml_here else "unavailable")
        levels = {lv["concurrency"]: lv for lv in api.get(f"/runs/{run_uuid}/levels").json()}
        # the stand-in runs at most 64 requests at once: 128 streams gain nothing over 64 (a
        # busy machine may make them lose, which is no sign of a missing cap), and its own
        # samples show the cap: never more than 64 running, the rest queued
        t16, t64, t128 = (levels[c]["output_throughput"] for c in (16, 64, 128))
        assert t64 > 1.6 * t16
        assert t128 < 1.15 * t64
        samples = api.get(f"/runs/{run_uuid}/engine-samples", params={"limit": 1000}).json()
        assert samples["items"], "the worker scraped the stand-in's /metrics"
        assert max(s["running"] for s in samples["items"]) <= 64
        assert max(s["queued"] for s in samples["items"]) > 0
    finally:
        api.close()
        web.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            log.close()
    # SIGTERM stops every child: the stand-in's port is free again (connections the stand-in
    # closed itself may still sit in TIME_WAIT on it, which SO_REUSEADDR lets a new server pass)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", standin_port))
