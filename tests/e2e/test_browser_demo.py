"""The demo `make run` offers a newcomer, on the example data with a real worker of host `local`:
the managed stand-in started from its launch recipe, restarted with a higher cap, re-swept, and
the two runs compared from the action's "Compare before / after" (stand-in runs both)."""

import contextlib
import json
import os
import signal

import httpx
import pytest
from django.contrib.auth.models import User

from domain.jobs import FINISHED_STATUSES
from moeops import celery as web_celery
from moeops import permissions
from moeops.api.models import ApiToken
from moeops.engines.models import EngineAction
from moeops.engines.services import engine_action_start
from moeops.examples import STANDIN_HOST, load_example_data, load_standin_deployment
from moeops.runs.models import SweepRun
from moeops.runs.services import run_start
from tests.browser import PASSWORD, log_in, shot
from tests.stack import SweepStack, WorkerProcess, _producer

pytest_plugins = ["tests.stack", "tests.browser"]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LOAD = {"levels": [16, 128], "input_len": 16, "output_len": 16, "prompts_per_level": 128}


class Demo:
    """The example data, the managed stand-in deployment on a free port and the worker of host
    `local` (its engines' state under tmp, as make run keeps it under var/)."""

    def __init__(self, live_server, redis_url, port, tmp_path):
        load_example_data()
        self.deployment = load_standin_deployment(port)
        self.port = port
        self.engines = tmp_path / "engines"
        _, token = ApiToken.issue(name="demo worker", host=self.deployment.host)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MOEOPS_")},
            "REDIS_URL": redis_url,
            "MOEOPS_HOST": STANDIN_HOST,
            "MOEOPS_URL": live_server.url,
            "MOEOPS_TOKEN": token,
            "MOEOPS_SPOOL_DIR": str(tmp_path / "spool"),
            "MOEOPS_TUNE_DIR": str(tmp_path / "tune"),
            "MOEOPS_CACHE_DIR": str(tmp_path),
            "MOEOPS_HEARTBEAT_S": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.worker = WorkerProcess(env, self.deployment.host.queue_name, tmp_path / "worker.log")
        self.worker.start()
        host = self.deployment.host

        def seen():
            host.refresh_from_db()
            return True if not host.worker_absence() else None

        SweepStack.wait_until(seen, 60, "heartbeat of the worker of host local")

    def engine_pid(self):
        state = json.loads((self.engines / str(self.deployment.pk) / "engine.json").read_text())
        return state["pid"]

    def wait_for_action(self, action, timeout=120):
        def finished():
            found = EngineAction.objects.get(pk=action.pk)
            return found if found.is_finished else None

        done = SweepStack.wait_until(finished, timeout, f"end of {action.title()}")
        assert done.status == "succeeded", f"{done.error}\n{self.worker.log()[-3000:]}"
        return done

    def wait_for_run(self, run, timeout=120):
        def finished():
            found = SweepRun.objects.get(pk=run.pk)
            return found if found.status in FINISHED_STATUSES else None

        done = SweepStack.wait_until(finished, timeout, f"end of run {run.label}")
        assert done.status == "succeeded", done.error
        return done

    def stop(self):
        self.worker.stop()
        # managed engines outlive their worker by design (a restarted worker finds them)
        for state in self.engines.glob("*/engine.json"):
            with contextlib.suppress(ProcessLookupError, ValueError, KeyError):
                os.killpg(json.loads(state.read_text())["pid"], signal.SIGKILL)


@pytest.fixture
def demo(live_server, redis_url, free_port, tmp_path, transactional_db, monkeypatch):
    monkeypatch.setattr(web_celery, "app", _producer(redis_url))
    started = Demo(live_server, redis_url, free_port(), tmp_path)
    yield started
    started.stop()


def _standin(port, path):
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).json()


def test_the_example_recipe_starts_and_restarts_the_standin(demo):
    deployment = demo.deployment
    assert deployment.is_managed
    started = engine_action_start(
        deployment=deployment,
        kind="restart",
        user=permissions.MOEOPS,
        source="make_run",
        resweep=False,
    )
    demo.wait_for_action(started)
    first = demo.engine_pid()
    (model,) = _standin(demo.port, "/v1/models")["data"]
    assert model["id"] == "glm-5-standin"
    assert _standin(demo.port, "/get_server_info")["max_running_requests"] == 64

    raised = engine_action_start(
        deployment=deployment,
        kind="restart_with_args",
        user=permissions.MOEOPS,
        changes={"--max-running-requests": "128"},
        resweep=False,
    )
    raised = demo.wait_for_action(raised)
    assert raised.observed["max_running_requests"] == 128
    assert demo.engine_pid() != first
    assert _standin(demo.port, "/get_server_info")["max_running_requests"] == 128
    # the recipe in force keeps make run's port: a make run started again changes only that
    assert load_standin_deployment(demo.port).recipe_in_force() == raised.recipe


@pytest.mark.browser
def test_a_newcomer_restarts_the_standin_with_a_higher_cap_and_compares(demo, page):
    member = User.objects.create_user("newcomer", password=PASSWORD, is_staff=True)
    deployment = demo.deployment
    log_in(page, member)
    page.goto(page.base + deployment.get_absolute_url())
    page.click("#engine button.primary")
    page.wait_for_url("**/actions/*/")
    demo.wait_for_action(EngineAction.objects.get(deployment=deployment))

    before = demo.wait_for_run(
        run_start(deployment=deployment, parameters=LOAD, label="first sweep")[0]
    )
    page.goto(page.base + deployment.get_absolute_url())
    page.fill("#engine input[name=flag]", "--max-running-requests")
    page.fill("#engine input[name=value]", "128")
    page.click("#engine button:has-text('Restart with this argument')")
    page.wait_for_url("**/actions/*/")
    action = demo.wait_for_action(EngineAction.objects.filter(kind="restart_with_args").get())
    assert action.before_run == before
    after = demo.wait_for_run(action.after_run)
    # the action page refreshes itself every 3 s until the action ends (a reload of our own
    # would race its refresh): the link comes with the refresh that finds it succeeded
    page.locator("#compare-link").wait_for(timeout=30_000)
    page.click("#compare-link")
    page.wait_for_url("**/compare/**")
    shot(page, "demo-compare-before-after")
    assert page.locator("#standin-left-out").count() == 0
    rows = page.locator("#compare-table tbody tr")
    assert rows.count() == 2
    assert rows.filter(has_text=before.display_label()).count() == 1
    # the two runs measured the engine before and after the change, as it reported itself
    caps = [run.observed_engine["max_running_requests"] for run in (before, after)]
    assert caps == [64, 128]
