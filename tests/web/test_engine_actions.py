"""Launch recipes and engine actions on the web side: who may change them, what an action makes
(a recipe version, a queued re-sweep, the chain on the host's queue), how the worker's reports
and the re-sweep's end move it, and the work failed when its worker is gone."""

import json
import time

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from domain.launch import PROFILER_FLAG, VLLM_PROFILER_CONFIG
from moeops.engines import services
from moeops.engines.models import EngineAction
from moeops.insights import services as insights_services
from moeops.insights.models import Finding, PlanItem
from moeops.kernels.models import KernelConfig
from moeops.runs import services as run_services
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, SweepRun
from moeops.runs.workloads import workload_store
from tests import queues
from tests.api_base import make_managed_world
from tests.fakes import KERNEL_ENTRY

QUEUE = "host.rtx-pro-6000"
ARGV = ["vllm", "serve", "/models/glm-5", "--port", "8000", "--max-num-seqs", "4"]
LOAD = {"levels": [4, 8], "input_len": 32, "output_len": 64, "prompts_per_level": 96}


@pytest.fixture
def world(db):
    world = make_managed_world()
    world.member = User.objects.create_user("member", password="pw")
    return world


def _alive(host):
    host.worker_seen_at = timezone.now()
    host.save(update_fields=["worker_seen_at"])


def _recipe(world, **fields):
    return services.recipe_create(
        deployment=world.deployment, argv=ARGV, author=world.staff, **fields
    )


def _finished_sweep(world):
    return SweepRun.objects.create(
        deployment=world.deployment,
        status="succeeded",
        parameters={**LOAD, "base_url": "http://old:1", "vocab_size": 151552, "seed": 7},
    )


def _in_force(recipe):
    recipe.applied_at = timezone.now()
    recipe.save(update_fields=["applied_at"])
    return recipe


def _restarting(world, max_num_seqs):
    """The panel's restart with --max-num-seqs changed (no plan item), its engine restarting."""
    action = services.engine_action_start(
        deployment=world.deployment,
        kind="restart_with_args",
        user=world.staff,
        changes={"--max-num-seqs": max_num_seqs},
    )
    services.engine_action_report(action=action, status="running")
    return action


def test_only_staff_change_a_recipe_and_each_change_is_a_new_version(world):
    with pytest.raises(PermissionDenied):
        services.recipe_create(deployment=world.deployment, argv=ARGV, author=world.member)
    first = _recipe(world)
    second = _recipe(world, env={"VLLM_SERVER_DEV_MODE": "1"}, reason="report its arguments")

    assert (first.version, second.version) == (1, 2)
    assert second.gpu_indices == [0, 1] and second.author == world.staff
    assert first.env == {}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"argv": "vllm serve /models/glm-5"}, "argv"),
        ({"argv": ["vllm", ""]}, "argv"),
        ({"env": {"PORT": 8000}}, "env"),
        ({"gpu_indices": [0, 7]}, "gpu_indices"),
        ({"ready_timeout_s": 0}, "ready_timeout_s"),
        ({"argv": [*ARGV[:-1], "lots"]}, "argv"),
    ],
)
def test_a_bad_recipe_names_its_field_and_stores_nothing(world, fields, field):
    with pytest.raises(ValidationError) as raised:
        services.recipe_create(
            deployment=world.deployment, author=world.staff, **{"argv": ARGV, **fields}
        )
    assert field in raised.value.message_dict
    assert not world.deployment.launch_recipes.exists()


def test_restart_with_args_makes_a_version_a_resweep_and_a_chain_on_the_hosts_queue(
    world, broker, django_capture_on_commit_callbacks
):
    in_force = _in_force(_recipe(world))
    before = _finished_sweep(world)
    item = PlanItem.objects.create(deployment=world.deployment, title="Raise --max-num-seqs")

    with django_capture_on_commit_callbacks(execute=True):
        action = services.engine_action_start(
            deployment=world.deployment,
            kind="restart_with_args",
            user=world.staff,
            changes={"--max-num-seqs": "16"},
            plan_item=item,
        )

    recipe = action.recipe
    assert (recipe.version, recipe.based_on, action.previous_recipe) == (2, in_force, in_force)
    assert recipe.argv == [*ARGV[:-1], "16"] and recipe.reason == "restart with --max-num-seqs 16"
    assert action.title() == "Restart with --max-num-seqs 16"
    after = action.after_run
    assert (after.status, action.before_run) == ("queued", before)
    assert {k: after.parameters[k] for k in LOAD} == LOAD
    # the same load with prompts of its own: the engine's prefix cache holds before's
    assert after.parameters["seed"] != before.parameters["seed"]
    assert after.parameters["base_url"] == "http://127.0.0.1:8000"
    assert after.snapshot["recipe"]["flags"]["--max-num-seqs"] == "16"
    item.refresh_from_db()
    assert item.status == "in_progress"

    [sent] = queues.queued(broker, QUEUE)
    assert sent.task == "workers.engine_action"
    assert sent.kwargs["recipe"]["argv"][-1] == "16"
    assert sent.kwargs["previous"]["version"] == 1
    assert (sent.kwargs["host"], sent.kwargs["resweep"]) == ("rtx-pro-6000", True)
    # the re-sweep rides in the chain: it runs only after the restart returned
    [link] = sent.embed["chain"]
    assert (link["task"], link["options"]["queue"]) == ("workers.run_sweep", QUEUE)
    assert link["kwargs"]["run_uuid"] == str(after.uuid)


@pytest.mark.parametrize(
    ("setup", "kind", "changes", "field", "words"),
    [
        ("external", "restart", None, "deployment", "is external"),
        ("no_worker", "restart", None, "host", "No worker of host rtx-pro-6000"),
        ("no_recipe", "restart", None, "recipe", "has no launch recipe"),
        ("recipe", "restart_with_args", {"--max-num-seqs": "4"}, "changes", "already runs"),
        ("recipe", "restart_with_args", {"max-num-seqs": "8"}, "changes", "not a long flag"),
        (
            "recipe",
            "restart_with_args",
            {"--max-num-seqs": "lots"},
            "changes",
            "--max-num-seqs takes a whole number, 1 or more, not “lots”",
        ),
        ("recipe", "revert", None, "kind", "nothing to revert to"),
    ],
)
def test_an_action_that_cannot_start_says_why_and_writes_nothing(
    world, setup, kind, changes, field, words
):
    if setup == "external":
        world.deployment.management = "external"
        world.deployment.save()
    if setup == "no_worker":
        world.host.worker_seen_at = None
        world.host.save()
    if setup != "no_recipe":
        _in_force(_recipe(world))
    recipes = world.deployment.launch_recipes.count()

    with pytest.raises(ValidationError) as raised:
        services.engine_action_start(
            deployment=world.deployment, kind=kind, user=world.staff, changes=changes
        )

    assert words in " ".join(raised.value.message_dict[field])
    assert world.deployment.launch_recipes.count() == recipes
    assert not EngineAction.objects.exists() and not SweepRun.objects.exists()


def test_a_second_action_waits_for_the_first(world, broker):
    _in_force(_recipe(world))
    services.engine_action_start(deployment=world.deployment, kind="restart", user=world.staff)
    with pytest.raises(ValidationError) as raised:
        services.engine_action_start(deployment=world.deployment, kind="restart", user=world.staff)
    assert "is still queued" in raised.value.message_dict["deployment"][0]


def test_a_kernel_config_for_another_shape_is_refused(world):
    _in_force(_recipe(world))
    other = KernelConfig.objects.create(
        device_name="NVIDIA H200", E=256, N=256, dtype="bf16", entries={"1": {}}
    )
    with pytest.raises(ValidationError) as raised:
        services.engine_action_start(
            deployment=world.deployment, kind="apply_config", user=world.staff, kernel_config=other
        )
    message = raised.value.message_dict["kernel_config"][0]
    assert "device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition" in message
    assert "not E=256,N=256,device_name=NVIDIA_H200.json" in message


def _apply(world, broker):
    _in_force(_recipe(world))
    _finished_sweep(world)
    config = KernelConfig.objects.create(
        device_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        E=256,
        N=256,
        dtype="bf16",
        triton_version="3.7.1",
        entries={"1": KERNEL_ENTRY},
    )
    item = PlanItem.objects.create(deployment=world.deployment, title="Install a tuned config")
    action = services.engine_action_start(
        deployment=world.deployment,
        kind="apply_config",
        user=world.staff,
        kernel_config=config,
        plan_item=item,
    )
    return action, config, item


def test_the_workers_reports_and_the_resweep_carry_an_action_to_the_end(
    world, broker, django_capture_on_commit_callbacks
):
    action, config, item = _apply(world, broker)
    assert list(action.recipe.kernel_configs.all()) == [config]

    services.engine_action_report(action=action, status="running", steps=[{"name": "stop"}])
    resweep = {"name": "re-sweep", "status": "queued", "detail": "next on this worker"}
    services.engine_action_report(
        action=action, status="sweeping", log_tail="ready", steps=[{"name": "stop"}, resweep]
    )
    action.refresh_from_db()
    action.recipe.refresh_from_db()
    assert action.status == "sweeping" and action.recipe.applied_at is not None
    assert world.deployment.recipe_in_force() == action.recipe

    after = action.after_run
    run_services.run_transition(run=after, status="running")
    with django_capture_on_commit_callbacks(execute=True):
        run_services.run_transition(run=after, status="succeeded")
        action.refresh_from_db()
        # the job-finished hook ends the action once the run's end is committed
        assert action.status == "sweeping"

    action.refresh_from_db()
    item.refresh_from_db()
    assert (action.status, item.status) == ("succeeded", "completed")
    assert action.steps[-1] == {**resweep, "status": "done", "detail": f"{after}: succeeded"}
    assert action.finished_at is not None
    with pytest.raises(services.ActionConflict):
        services.engine_action_report(action=action, status="running")


def test_a_failed_restart_cancels_the_resweep_and_applies_nothing(world, broker):
    action, _, item = _apply(world, broker)
    previous = action.previous_recipe

    services.engine_action_report(action=action, status="running")
    services.engine_action_report(
        action=action, status="failed", error="the engine exited with status 2", log_tail="usage:"
    )

    action.refresh_from_db()
    item.refresh_from_db()
    action.after_run.refresh_from_db()
    assert (action.status, action.error, action.log_tail) == (
        "failed",
        "the engine exited with status 2",
        "usage:",
    )
    assert action.after_run.status == "cancelled"
    assert "the engine action failed" in action.after_run.error
    assert item.status == "pending"
    assert action.recipe.failed_at is not None
    assert world.deployment.recipe_in_force() == previous


def test_revert_brings_back_what_was_in_force_before_as_a_new_version(world, broker):
    first = _in_force(_recipe(world))
    action = _restarting(world, "16")
    services.engine_action_report(action=action, status="succeeded")

    revert = services.engine_action_start(
        deployment=world.deployment, kind="revert", user=world.staff
    )

    assert revert.recipe.argv == first.argv and revert.recipe.version == 3
    assert revert.recipe.based_on == action.recipe == revert.previous_recipe
    assert revert.title() == "Revert to recipe v3" and revert.recipe.reason == "revert to v1"


def test_the_api_starts_actions_for_people_not_for_a_hosts_worker(world, broker):
    _in_force(_recipe(world))
    path = "/api/v1/deployments/glm-5-sglang/actions"
    body = {"kind": "restart_with_args", "changes": {"--max-num-seqs": "64"}}

    refused = world.host_worker.post(path, body)
    assert refused.status_code == 403
    assert "host's worker token" in refused.json()["detail"]
    bad = world.owner.post(path, {"kind": "restart_with_args", "changes": {"max-num-seqs": "1"}})
    assert bad.status_code == 400 and "changes" in bad.json()["detail"]
    lots = world.owner.post(
        path, {"kind": "restart_with_args", "changes": {"--max-num-seqs": "lots"}}
    )
    assert (
        lots.status_code == 400 and "--max-num-seqs takes a whole number" in lots.json()["detail"]
    )

    started = world.owner.post(path, body)
    assert started.status_code == 202, started.json()
    action = started.json()
    assert (action["status"], action["recipe_version"], action["source"]) == ("queued", 2, "api")
    assert action["title"] == "Restart with --max-num-seqs 64"

    report = {"status": "running", "steps": [{"name": "stop", "status": "done"}]}
    assert (
        world.outsider.patch(f"/api/v1/engine-actions/{action['uuid']}", report).status_code == 403
    )
    reported = world.host_worker.patch(f"/api/v1/engine-actions/{action['uuid']}", report)
    assert reported.status_code == 200 and reported.json()["steps"][0]["name"] == "stop"
    backwards = world.host_worker.patch(
        f"/api/v1/engine-actions/{action['uuid']}", {"status": "sweeping"}
    )
    assert backwards.status_code == 409  # no re-sweep: there was no finished sweep to repeat


def test_a_heartbeat_marks_the_worker_alive_and_keeps_what_it_says(world, settings):
    world.host.worker_seen_at = None
    world.host.save()
    engine = {"deployment": world.deployment.pk, "version": 3, "pid": 4242, "log_tail": "ready"}
    body = {"worker": {"host": "gpu-1", "pid": 7}, "engines": [engine], "spool": {"waiting": 2}}

    assert world.outsider.post("/api/v1/hosts/rtx-pro-6000/heartbeat", body).status_code == 403
    answer = world.host_worker.post("/api/v1/hosts/rtx-pro-6000/heartbeat", body)

    assert answer.status_code == 200
    world.host.refresh_from_db()
    assert world.host.worker_alive() and world.host.worker_absence() == ""
    assert world.host.managed_engine(world.deployment.pk)["pid"] == 4242
    assert world.owner.get("/api/v1/hosts/rtx-pro-6000").json()["worker_alive"] is True
    settings.MOEOPS_WORKER_STALE_S = 1
    world.host.worker_seen_at = timezone.now() - timezone.timedelta(minutes=3)
    assert "was last seen 3\xa0minutes ago" in world.host.worker_absence()


def test_an_action_whose_worker_is_lost_is_failed_and_the_rest_left_alone(world, settings):
    settings.MOEOPS_RUN_STALE_S = 300
    recipe = _recipe(world)
    long_ago = timezone.now() - timezone.timedelta(seconds=400)
    lost, recent = (
        EngineAction.objects.create(deployment=world.deployment, kind="restart", recipe=recipe)
        for _ in range(2)
    )
    EngineAction.objects.filter(pk=lost.pk).update(created=long_ago)
    world.host.worker_seen_at = long_ago
    world.host.save()

    assert services.engine_action_fail_stale() == 1

    lost.refresh_from_db()
    recent.refresh_from_db()
    assert lost.status == "failed" and lost.finished_at is not None
    assert lost.error == "The worker of host rtx-pro-6000 stopped sending heartbeats 7 min ago."
    # younger than the limit: its worker may not have picked it up yet
    assert recent.status == "queued"
    _alive(world.host)
    EngineAction.objects.filter(pk=recent.pk).update(created=long_ago)
    assert services.engine_action_fail_stale() == 0


def test_cancel_ends_a_run_whose_worker_is_gone_at_once(world, settings):
    settings.MOEOPS_RUN_STALE_S = 60
    lost = world.run(status="running", progress={"heartbeat": time.time() - 120})
    alive = world.run(status="running", progress={"heartbeat": time.time()})

    run_services.run_cancel(run=lost)
    run_services.run_cancel(run=alive)

    lost.refresh_from_db()
    alive.refresh_from_db()
    assert lost.status == "cancelled" and "worker was gone" in lost.error
    assert (alive.status, alive.cancel_requested) == ("running", True)


def test_a_heartbeat_whose_engines_are_not_objects_is_refused(world):
    body = {"worker": {"host": "gpu-1"}, "engines": ["not an engine"]}

    answer = world.host_worker.post("/api/v1/hosts/rtx-pro-6000/heartbeat", body)

    assert answer.status_code == 422 and "engines" in answer.content.decode()


# -- plan items whose change is in force --------------------------------------------------------


def _cap_item(world, cap=4):
    """The queue-cap finding's plan item, as the analysis proposes it."""
    finding = Finding.objects.create(
        deployment=world.deployment,
        kind="queueing",
        key="running-cap",
        title=f"Requests queue behind --max-num-seqs {cap}",
        evidence={"cap": cap, "flag": "--max-num-seqs", "tested_concurrency": 8},
    )
    return PlanItem.objects.create(
        deployment=world.deployment,
        finding=finding,
        title=f"Raise --max-num-seqs above {cap} and re-sweep",
    )


def test_a_cap_raised_by_another_action_marks_the_plan_item_done_by_that_action(world, broker):
    _in_force(_recipe(world))
    _finished_sweep(world)
    item = _cap_item(world)

    # the panel's restart, not the item's button: the action carries out no plan item
    action = _restarting(world, "32")
    item.refresh_from_db()
    assert item.status == "pending"  # the engine does not run it yet
    services.engine_action_report(
        action=action, status="sweeping", observed={"engine": "vllm", "max_running_requests": 32}
    )

    item.refresh_from_db()
    assert (item.status, item.done_by) == ("completed", action)
    [listed] = world.read_only.get("/api/v1/plan-items").json()["items"]
    assert (listed["status"], listed["done_by"]) == ("completed", str(action.uuid))


def test_a_recipe_edit_brought_up_by_a_restart_marks_the_plan_item_done(world, broker):
    _in_force(_recipe(world))
    item = _cap_item(world)
    services.recipe_create(deployment=world.deployment, argv=[*ARGV[:-1], "16"], author=world.staff)
    item.refresh_from_db()
    assert item.status == "pending"  # a recipe not brought up is not in force

    action = services.engine_action_start(
        deployment=world.deployment, kind="restart", user=world.staff
    )
    services.engine_action_report(action=action, status="running")
    # the engine said nothing of its cap: the recipe in force decides
    services.engine_action_report(action=action, status="succeeded", observed={})

    item.refresh_from_db()
    assert (item.status, item.done_by) == ("completed", action)


def test_a_cap_the_engine_reports_below_the_change_leaves_the_plan_item_to_do(world, broker):
    _in_force(_recipe(world))
    item = _cap_item(world)
    services.recipe_create(deployment=world.deployment, argv=[*ARGV[:-1], "16"], author=world.staff)
    action = services.engine_action_start(
        deployment=world.deployment, kind="restart", user=world.staff
    )
    services.engine_action_report(action=action, status="running")
    services.engine_action_report(
        action=action, status="succeeded", observed={"max_running_requests": 4}
    )

    item.refresh_from_db()
    assert (item.status, item.done_by) == ("pending", None)


def test_the_analysis_re_proposing_a_change_in_force_marks_it_done_once(world, broker):
    _in_force(_recipe(world))
    action = _restarting(world, "32")
    services.engine_action_report(action=action, status="succeeded", observed={})
    title = "Raise --max-num-seqs above 4 and re-sweep"

    # two older runs at a cap of 4, analysed after the change (a late or repeated analysis)
    for _ in range(2):
        run = _finished_sweep(world)
        run.snapshot = {"engine": {"engine": "vllm", "max_running_requests": 4}}
        run.save()
        for concurrency in (4, 8):
            LevelResult.objects.create(
                run=run, key=level_key(concurrency, None), concurrency=concurrency,
                output_throughput=100.0 * concurrency,
            )  # fmt: skip
        insights_services.run_analyze(run=run)

    [item] = PlanItem.objects.filter(title=title)
    assert (item.status, item.done_by) == ("completed", action)


# -- the names of re-sweeps -----------------------------------------------------------------------


def _act(world, on_commit, **fields):
    """An action carried to its end: restarted, re-swept, succeeded (on_commit:
    django_capture_on_commit_callbacks, which runs the job-finished hook)."""
    action = services.engine_action_start(deployment=world.deployment, user=world.staff, **fields)
    services.engine_action_report(action=action, status="running")
    services.engine_action_report(action=action, status="sweeping")
    run_services.run_transition(run=action.after_run, status="running")
    with on_commit(execute=True):
        run_services.run_transition(run=action.after_run, status="succeeded")
    action.refresh_from_db()
    return action


def test_a_re_sweep_is_named_once_after_the_change_it_measures(
    world, broker, django_capture_on_commit_callbacks
):
    _in_force(_recipe(world))
    _finished_sweep(world)

    first = _act(
        world,
        django_capture_on_commit_callbacks,
        kind="restart_with_args",
        changes={"--max-num-seqs": "16"},
    )
    second = _act(
        world,
        django_capture_on_commit_callbacks,
        kind="restart_with_args",
        changes={"--max-num-seqs": "32"},
    )

    # the second re-sweeps after the first's re-sweep: its name carries none of that history
    assert second.before_run == first.after_run
    assert first.after_run.label == "Restart with --max-num-seqs 16 (recipe v2)"
    assert second.after_run.label == "Restart with --max-num-seqs 32 (recipe v3)"


def test_two_re_sweeps_of_the_same_recipe_get_two_names(
    world, broker, django_capture_on_commit_callbacks
):
    _in_force(_recipe(world))
    _finished_sweep(world)

    labels = [
        _act(world, django_capture_on_commit_callbacks, kind="restart").after_run.label
        for _ in range(3)
    ]

    assert labels == [
        "Restart with recipe v1",
        "Restart with recipe v1 #2",
        "Restart with recipe v1 #3",
    ]


def test_a_re_sweep_sends_the_dataset_workload_of_the_sweep_it_repeats(
    world, broker, django_capture_on_commit_callbacks
):
    _in_force(_recipe(world))
    data = b'{"conversations": [{"from": "human", "value": "hello"}]}\n'
    workload, _ = workload_store(
        name="chats", spec={"kind": "dataset"}, file_name="chats.jsonl", data=data
    )
    before = _finished_sweep(world)
    before.parameters["workload"] = workload.run_parameter()
    before.save(update_fields=["parameters"])

    with django_capture_on_commit_callbacks(execute=True):
        action = services.engine_action_start(
            deployment=world.deployment, kind="restart", user=world.staff
        )

    assert action.after_run.snapshot["workload"]["sha256"] == workload.sha256
    [sent] = queues.queued(broker, QUEUE)
    [link] = sent.embed["chain"]
    assert link["kwargs"]["workload_items"] == [{"prompt": "hello", "answer": None}]
    assert "workload_items" not in action.after_run.parameters


def test_restart_with_profiling_available_gives_vllm_its_profiler_and_server_info(
    world, broker, django_capture_on_commit_callbacks
):
    in_force = _in_force(_recipe(world, env={"VLLM_USE_V1": "1"}))

    with django_capture_on_commit_callbacks(execute=True):
        action = services.engine_action_start(
            deployment=world.deployment, kind="restart_with_profiler", user=world.staff
        )

    recipe = action.recipe
    assert (recipe.version, recipe.based_on) == (2, in_force)
    flag = recipe.argv.index(PROFILER_FLAG)
    assert json.loads(recipe.argv[flag + 1]) == VLLM_PROFILER_CONFIG
    assert recipe.env == {"VLLM_USE_V1": "1", "VLLM_SERVER_DEV_MODE": "1"}
    assert recipe.reason == "restart with profiling available"
    assert action.title() == "Restart with profiling available"
    [sent] = queues.queued(broker, QUEUE)
    assert sent.kwargs["recipe"]["env"]["VLLM_SERVER_DEV_MODE"] == "1"

    # once it runs with the profiler, asking again changes nothing
    _in_force(recipe)
    action.status = "succeeded"
    action.save(update_fields=["status"])
    with pytest.raises(ValidationError, match="already runs with the profiler"):
        services.engine_action_start(
            deployment=world.deployment, kind="restart_with_profiler", user=world.staff
        )


def test_restart_with_profiling_available_is_for_vllm_only(world):
    _in_force(_recipe(world))
    world.deployment.engine = "sglang"
    world.deployment.save(update_fields=["engine"])

    with pytest.raises(ValidationError, match="moeops profiles vLLM's steps"):
        services.engine_action_start(
            deployment=world.deployment, kind="restart_with_profiler", user=world.staff
        )
    assert world.deployment.launch_recipes.count() == 1
