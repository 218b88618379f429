"""A managed real vLLM for the e2e tests (`pytest_plugins = ["tests.stack",
"tests.engine.managed"]`): `make_managed_vllm(max_num_seqs=4)` gives the sweep stack
(tests/stack.py) of a managed vLLM deployment of the tiny MoE on an SM120-named GPU, its first
launch recipe written by a staff member (`stack.staff`), its worker alive and its engines'
supervisor as `stack.engines`; an engine action starts the engine (`act(stack, "restart")`).
Each start of vLLM takes about a minute on 2 cores."""

import json
import time

import pytest
from django.contrib.auth.models import User

from moeops.engines import services
from moeops.engines.models import EngineAction
from moeops.fleet.models import Host, ModelSpec
from tests.browser import PASSWORD
from tests.engine import (
    ENGINE_ENV,
    MODEL_DIR,
    PYTHON,
    SERVED_MODEL,
    TUNED_DEVICE,
    VllmServer,
    ensure_model,
)
from tests.stack import SweepStack, stop_managed_engines
from workers.engine_supervisor import EngineSupervisor

SM120 = {"name": TUNED_DEVICE, "compute_capability": "12.0", "power_limit_w": 600.0}
ACTION_TIMEOUT_S = 600


@pytest.fixture
def make_managed_vllm(make_sweep_stack, free_port, tmp_path):
    stopped = []

    def make(max_num_seqs=4):
        ensure_model()
        config = json.loads((MODEL_DIR / "config.json").read_text())
        model = ModelSpec.objects.create(name="tiny-moe (random weights)", config_json=config)
        port = free_port()
        cache = tmp_path / "cache"
        stack = make_sweep_stack(
            engine_url=f"http://127.0.0.1:{port}",
            model=model,
            gpus=[SM120],
            deployment_fields={
                "engine": "vllm",
                "management": "managed",
                "max_running_requests": None,
                "served_model_name": SERVED_MODEL,
            },
            MOEOPS_VLLM_PYTHON=str(PYTHON),
            MOEOPS_CACHE_DIR=str(cache),
            MOEOPS_HEARTBEAT_S="1",
        )
        staff = User.objects.create_user("ops", password=PASSWORD, is_staff=True)
        server = VllmServer(log_path=tmp_path / "unused.log", port=port, max_num_seqs=max_num_seqs)
        services.recipe_create(
            deployment=stack.deployment,
            argv=server.argv(),
            env=ENGINE_ENV,
            cwd=str(MODEL_DIR.parent),
            ready_timeout_s=ACTION_TIMEOUT_S,
            author=staff,
            reason=f"the tiny MoE with --max-num-seqs {max_num_seqs}",
        )
        wait(lambda: Host.objects.get(pk=stack.host.pk).worker_alive(), "the worker's heartbeat")
        stack.host.refresh_from_db()
        stack.staff = staff
        stack.engines = EngineSupervisor(cache / "engines")
        stopped.append((stack, port))
        return stack

    yield make
    for stack, port in stopped:
        stop_managed_engines(stack, stack.engines, port)


def wait(check, what, timeout=60):
    """Until check() is true, every 0.2 s for timeout s."""
    SweepStack.wait_until(lambda: True if check() else None, timeout, what)


def action_finished(stack, action, timeout=ACTION_TIMEOUT_S):
    """The action once finished; an AssertionError with its steps and the worker's log else."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        action = EngineAction.objects.get(pk=action.pk)
        if action.is_finished:
            return action
        time.sleep(1)
    raise AssertionError(
        f"{action.title()} still {action.status}: {action.steps}\n" + stack.worker.log()[-4000:]
    )


def act(stack, kind, **fields):
    """Start an engine action as the stack's staff member and wait for its end."""
    stack.deployment.refresh_from_db()
    action = services.engine_action_start(
        deployment=stack.deployment, kind=kind, user=stack.staff, **fields
    )
    return action_finished(stack, action)
