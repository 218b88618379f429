"""`make run`'s steps on a fresh var/ folder: migrate, load the example data, start, log in."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _manage(env, *args):
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def _wait_for_login(proc, deadline):
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line)
        match = re.search(r"login: (\S+) / (\S+)", line)
        if match:
            return match.groups(), lines
    raise AssertionError("no login printed:\n" + "".join(lines))


def test_make_run_steps_bring_the_app_up_with_example_data(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(MOEOPS_VAR_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    _manage(env, "migrate", "--noinput")
    _manage(env, "load_example_data")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runlocal", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        (username, password), lines = _wait_for_login(proc, time.monotonic() + 120)
        assert f"http://127.0.0.1:{port}/" in "".join(lines)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", follow_redirects=True) as web:
            login_page = web.get("/accounts/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text)[1]
            page = web.post(
                "/accounts/login/",
                data={"username": username, "password": password, "csrfmiddlewaretoken": token},
                headers={"Referer": f"http://127.0.0.1:{port}/accounts/login/"},
            )
            assert page.status_code == 200
            assert "GLM-5-NVFP4 on 8× RTX PRO 6000" in page.text
            assert "912" in page.text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
