"""Finding the cause of a regression: the factors two runs differ in (what a recipe sets, what a
restart cannot bring back), the refusals, the steps (engine actions re-swept with the watch's
load, moved on by the job-finished hook as the worker's reports and the re-sweeps arrive), the
engine back on the recipe in force at the end, and a watch that starts it by itself. The
worker's side is played here as it reports through the services; figures are made up."""

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from domain.launch import flag_value, flags, set_flags
from moeops import jobs, permissions
from moeops.engines import services as engine_services
from moeops.fleet.models import SLOProfile
from moeops.runs import services as run_services
from moeops.runs import snapshots
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, SweepRun
from moeops.watches import bisection, factors, services
from moeops.watches.models import AlertChannel, Bisection, WatchRun
from tests import page_base
from tests.api_base import make_managed_world

QUEUE = "host.rtx-pro-6000"
ARGV = ["vllm", "serve", "/models/glm-5", "--port", "8000", "--max-num-seqs", "8"]
LOAD = {"levels": [8], "input_len": 16, "output_len": 32, "prompts_per_level": 16}
TOPOLOGY = {"fingerprint": "abc", "virtualization": "none", "driver_version": "580.1",
            "cuda_version": "13.0", "gpus": ["RTX PRO 6000"]}  # fmt: skip


@pytest.fixture
def world(db):
    world = make_managed_world()
    world.watch = services.watch_create(
        deployment=world.deployment, name="nightly", parameters=LOAD, cron="0 3 * * *"
    )
    return world


def _recipe(world, argv=ARGV, env=None):
    recipe = engine_services.recipe_create(
        deployment=world.deployment, argv=argv, env=env or {}, author=world.staff
    )
    recipe.applied_at = timezone.now()
    recipe.save(update_fields=["applied_at"])
    return recipe


def _snapshot(recipe, max_num_seqs, topology=TOPOLOGY, version="0.11.0"):
    identity = page_base.vllm_identity(max_num_seqs=max_num_seqs, version=version)
    return {
        "source": "worker",
        "engine": identity,
        "recipe": snapshots.recipe_record(recipe),
        "topology": topology,
        "load": snapshots.load_record(LOAD),
    }


def _levels(run, peak, interval):
    level = LevelResult.objects.create(
        run=run, key=level_key(8, None), concurrency=8, output_throughput=peak
    )
    page_base.rounds_spanning(level, peak, interval)


def _watch_run(world, peak, interval, snapshot):
    """A watch run whose sweep succeeded at `peak` tok/s ± interval, judged."""
    run = page_base.run(
        world.deployment,
        parameters={**LOAD, "rounds": 3, "vocab_size": 151552},
        snapshot=snapshot,
    )
    _levels(run, peak, interval)
    WatchRun.objects.create(watch=world.watch, run=run, status="running")
    return services.watch_run_finished(run)


def _regression(world, env_before=None, env_after=None, argv_after=None, seqs_after=1, **snap):
    """The baseline at 1000 tok/s on recipe v1 (--max-num-seqs 8), then a regression to 300 on
    recipe v2 (--max-num-seqs 1 unless argv_after says otherwise)."""
    before = _recipe(world, env=env_before)
    base = _watch_run(world, 1000.0, [950.0, 1050.0], _snapshot(before, 8))
    after = _recipe(
        world,
        argv=argv_after or set_flags(ARGV, {"--max-num-seqs": "1"}),
        env=env_after,
    )
    regressed = _watch_run(world, 300.0, [280.0, 320.0], _snapshot(after, seqs_after, **snap))
    assert (base.verdict, regressed.verdict) == ("first", "regressed")
    return regressed


def _carry_out(action, on_commit, peak=None, interval=None):
    """Play the worker: the restart comes up; with peak, the re-sweep measures it and ends."""
    engine_services.engine_action_report(action=action, status="running")
    with on_commit(execute=True):
        engine_services.engine_action_report(
            action=action, status="sweeping" if peak is not None else "succeeded"
        )
    if peak is None:
        return
    after = action.after_run
    run_services.run_transition(run=after, status="running")
    _levels(after, peak, interval)
    with on_commit(execute=True):
        run_services.run_transition(run=after, status="succeeded")


def _running_step(found):
    found.refresh_from_db()
    return found.steps.order_by("-number").first()


def test_what_the_engine_reports_of_a_flag_is_that_flag_and_the_rest_is_named_as_fixed():
    a = _recipe_record(ARGV, {"VLLM_X": "1"})
    b = _recipe_record(set_flags(ARGV, {"--max-num-seqs": "1"}), {})
    before = {"engine": page_base.vllm_identity(max_num_seqs=8, version="0.11.0"), "recipe": a,
              "topology": TOPOLOGY}  # fmt: skip
    after = {"engine": page_base.vllm_identity(max_num_seqs=1, version="0.12.0"), "recipe": b,
             "topology": {**TOPOLOGY, "driver_version": "590.2"}}  # fmt: skip
    found = factors.changed_factors(before, after)
    assert [(f["key"], f["a"], f["b"]) for f in found["revertible"]] == [
        ("--max-num-seqs", "8", "1"),
        ("env VLLM_X", "1", None),
    ]
    assert [f["phrase"] for f in found["revertible"]] == [
        "--max-num-seqs 8 → 1",
        "environment VLLM_X 1 → unset",
    ]
    # the engine's own max_num_seqs and cap follow from the flag; the version and the driver
    # changed with no change of the command: named, with why a restart cannot bring them back
    fixed = {f["phrase"]: f["why"] for f in found["fixed"]}
    assert set(fixed) == {"engine version 0.11.0 → 0.12.0", "topology driver_version 580.1 → 590.2"}
    assert "command did not change" in fixed["engine version 0.11.0 → 0.12.0"]
    assert "cannot change the GPUs" in fixed["topology driver_version 580.1 → 590.2"]


def test_what_the_engine_derives_from_a_changed_flag_moves_with_it_and_the_rest_stays_named():
    argv = [*ARGV, "--max-model-len", "1024"]
    a, b = _recipe_record(argv, {}), _recipe_record(set_flags(argv, {"--max-num-seqs": "1"}), {})
    before = {"engine": page_base.vllm_identity(max_num_seqs=8), "recipe": a}
    after = {"engine": page_base.vllm_identity(max_num_seqs=1), "recipe": b}
    # vLLM derives its compile ranges from --max-num-seqs; the model length has a flag of its
    # own that did not change, so its reported change is not the recipe's doing
    before["engine"]["args"]["compilation_config.compile_ranges_endpoints"] = [2048]
    after["engine"]["args"]["compilation_config.compile_ranges_endpoints"] = [1024]
    after["engine"]["args"]["model_config.max_model_len"] = 512
    found = factors.changed_factors(before, after)
    assert [f["phrase"] for f in found["revertible"]] == ["--max-num-seqs 8 → 1"]
    assert [f["phrase"] for f in found["fixed"]] == ["model_config.max_model_len 4096 → 512"]
    # the same reported changes with the same recipe: nothing of the recipe explains them
    same = factors.changed_factors({**before, "recipe": a}, {**after, "recipe": a})
    assert same["revertible"] == [] and len(same["fixed"]) == 4


def test_the_cap_a_stand_in_reports_moves_with_the_flag_that_set_it():
    argv = ["python", "-m", "localstack.standin", "--max-running-requests", "128"]
    a = _recipe_record(argv, {})
    b = _recipe_record(set_flags(argv, {"--max-running-requests": "16"}), {})
    before = {"engine": _standin_identity(128), "recipe": a}
    after = {"engine": _standin_identity(16), "recipe": b}

    found = factors.changed_factors(before, after)

    assert [f["phrase"] for f in found["revertible"]] == ["--max-running-requests 128 → 16"]
    assert found["fixed"] == []


def _standin_identity(cap):
    from domain import engine as reports

    args = {"max_running_requests": cap}
    return reports.identity("standin", args=args, args_source="/get_server_info")


def _recipe_record(argv, env):
    return {"version": 1, "flags": flags(argv), "env": env, "kernel_configs": []}


@pytest.mark.parametrize(
    ("figure", "interval", "outcome"),
    [
        (990.0, [940.0, 1040.0], "restores"),
        # below the baseline beyond the noise, yet 57 % of the fall won back
        (700.0, [680.0, 720.0], "restores"),
        (450.0, [430.0, 470.0], "partly"),
        (310.0, [290.0, 330.0], "no"),
        # one slow round widened the try's interval across the gap: it says neither
        (650.0, [250.0, 1100.0], "undecided"),
        (990.0, None, "unknown"),
    ],
)
def test_a_try_restores_the_figure_beyond_the_noise_winning_back_half_the_fall(
    figure, interval, outcome
):
    regressed = WatchRun(
        figure=300.0, interval=[280.0, 320.0], baseline_figure=1000.0,
        baseline_interval=[950.0, 1050.0],
    )  # fmt: skip
    assert bisection.step_outcome(figure, interval, regressed) == outcome


def test_the_plan_tries_a_few_factors_alone_and_halves_more():
    assert bisection.plan(["a", "b", "c"]) == [["a"], ["b"], ["c"]]
    assert bisection.plan(["a", "b", "c", "d", "e"]) == [["a", "b", "c"], ["d", "e"]]


def test_one_factor_is_found_in_one_step_and_the_engine_ends_on_the_current_recipe(
    world, broker, django_capture_on_commit_callbacks, client
):
    regressed = _regression(world)
    current = world.deployment.recipe_in_force()
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    assert regressed.changes == ["--max-num-seqs 8 → 1"]

    found = bisection.bisection_start(watch_run=regressed, user=world.staff)
    step = _running_step(found)
    action = step.action
    assert (found.status, step.keys, action.kind) == ("running", ["--max-num-seqs"], "bisect")
    # the step runs the recipe in force with the baseline's value, re-swept at the watch's load
    assert flag_value(action.recipe.argv, "--max-num-seqs") == "8"
    assert action.before_run == regressed.run
    assert action.after_run.parameters["levels"] == [8]
    assert action.changes == {"--max-num-seqs": "8"}

    _carry_out(action, django_capture_on_commit_callbacks, 990.0, [940.0, 1040.0])
    step.refresh_from_db()
    found.refresh_from_db()
    assert (step.outcome, step.figure) == ("restores", 990.0)
    assert (found.status, found.cause) == ("restoring", ["--max-num-seqs"])
    assert found.finding.startswith("The cause is --max-num-seqs 8 → 1: with the baseline's ")
    assert "its peak output tok/s was 990 (940–1,040), against 300 (280–320) now" in found.finding
    restore = found.restore_action
    assert restore.kind == "restore" and restore.after_run is None
    assert restore.recipe.argv == current.argv and restore.recipe.version > action.recipe.version

    _carry_out(restore, django_capture_on_commit_callbacks)
    found.refresh_from_db()
    assert found.status == "finished" and found.finished_at is not None
    assert world.deployment.recipe_in_force() == restore.recipe
    assert found.steps.count() == 1
    # the page offers the fix as the engine panel's restart with that argument
    client.force_login(world.staff)
    page = client.get(found.get_absolute_url()).content.decode()
    assert "Found: --max-num-seqs 8 → 1" in page
    assert "Apply the fix: restart with --max-num-seqs 8" in page


def _measured(run, on_commit, peak, interval):
    """Play the worker's sweep of run (a measurement again): it measures peak ± interval."""
    run_services.run_transition(run=run, status="running")
    _levels(run, peak, interval)
    with on_commit(execute=True):
        run_services.run_transition(run=run, status="succeeded")


def test_a_try_within_the_noise_of_both_ends_is_measured_again_with_more_rounds(
    world, broker, django_capture_on_commit_callbacks, client
):
    regressed = _regression(world)
    found = bisection.bisection_start(watch_run=regressed, user=world.staff)
    step = _running_step(found)
    # the re-sweep's interval spans the gap between 300 (280-320) and 1000 (950-1050)
    _carry_out(step.action, django_capture_on_commit_callbacks, 650.0, [250.0, 1100.0])
    step.refresh_from_db()
    found.refresh_from_db()
    # not judged "no": measured again on the engine as the try left it, twice the rounds
    assert (found.status, step.outcome, step.measures) == ("running", "", 2)
    again = step.run
    assert again != step.action.after_run and again.status == "queued"
    assert again.parameters["rounds"] == 6 and again.parameters["levels"] == [8]
    # prompts of its own: the engine as the try left it holds the re-sweep's in its cache
    assert again.parameters["seed"] != step.action.after_run.parameters["seed"]
    assert again.snapshot["recipe"]["version"] == step.action.recipe.version
    client.force_login(world.staff)
    page = client.get(found.get_absolute_url()).content.decode()
    assert "measuring again, with more rounds (2)" in page
    assert f'href="/runs/{again.uuid}/"' in page

    # the narrower interval lies above half the fall: the cause, from the second measurement
    _measured(again, django_capture_on_commit_callbacks, 960.0, [930.0, 990.0])
    step.refresh_from_db()
    found.refresh_from_db()
    assert (step.outcome, step.figure, step.measures) == ("restores", 960.0, 2)
    assert step.detail.endswith("measured 2 times")
    assert (found.status, found.cause) == ("restoring", ["--max-num-seqs"])
    assert "its peak output tok/s was 960 (930–990)" in found.finding


def test_a_try_still_within_the_noise_after_three_measurements_is_undecided(
    world, broker, django_capture_on_commit_callbacks
):
    regressed = _regression(world)
    found = bisection.bisection_start(watch_run=regressed, user=permissions.MOEOPS)
    step = _running_step(found)
    _carry_out(step.action, django_capture_on_commit_callbacks, 650.0, [250.0, 1100.0])
    rounds = []
    for _ in range(2):
        step.refresh_from_db()
        rounds.append(step.run.parameters["rounds"])
        _measured(step.run, django_capture_on_commit_callbacks, 640.0, [300.0, 960.0])
    step.refresh_from_db()
    found.refresh_from_db()
    assert rounds == [6, 10]  # twice the rounds, no more than a level may run
    assert (step.outcome, step.measures) == ("undecided", 3)
    assert found.status == "restoring" and found.cause == []
    assert found.finding.startswith(
        "No factor alone was shown to restore the baseline's figure beyond the noise."
    )
    assert "cannot tell: its interval overlaps both" in found.finding
    assert "measured 3 times" in found.finding
    # the action's own finish delivered again leaves the judged step alone
    assert bisection.bisection_action_finished(action=step.action) is None


def test_halves_narrow_four_factors_to_the_one_that_restores(
    world, broker, django_capture_on_commit_callbacks
):
    env_before = {"A": "1", "B": "1", "C": "1"}
    env_after = {"A": "2", "B": "2", "C": "2"}
    regressed = _regression(world, env_before=env_before, env_after=env_after)
    found = bisection.bisection_start(watch_run=regressed, user=permissions.API_TOKEN, source="api")
    assert found.candidates == ["--max-num-seqs", "env A", "env B", "env C"]
    # the cause is env B: only a try that holds B at its baseline's value restores
    figures = []
    while found.status == "running":
        step = _running_step(found)
        restores = "env B" in step.keys
        figures.append((step.keys, restores))
        peak, interval = (1000.0, [960.0, 1040.0]) if restores else (305.0, [285.0, 325.0])
        _carry_out(step.action, django_capture_on_commit_callbacks, peak, interval)
        found.refresh_from_db()
    assert figures == [
        (["--max-num-seqs", "env A"], False),
        (["env B", "env C"], True),
        (["env B"], True),
    ]
    assert found.cause == ["env B"]
    assert found.finding.startswith("The cause is environment B 1 → 2")
    tried = list(found.steps.values_list("keys", "outcome"))
    assert tried == [
        (["--max-num-seqs", "env A"], "no"),
        (["env B", "env C"], "restores"),
        (["env B"], "restores"),
    ]
    assert found.steps.first().action.recipe.env == {"A": "1", "B": "2", "C": "2"}


def test_a_try_that_does_not_come_up_is_named_and_the_rest_is_tried(
    world, broker, django_capture_on_commit_callbacks
):
    regressed = _regression(world, env_before={"A": "1"}, env_after={"A": "2"})
    found = bisection.bisection_start(watch_run=regressed, user=permissions.MOEOPS)
    first = _running_step(found).action
    engine_services.engine_action_report(action=first, status="running")
    with django_capture_on_commit_callbacks(execute=True):
        engine_services.engine_action_report(
            action=first, status="failed", error="the engine exited with status 1"
        )
    found.refresh_from_db()
    assert list(found.steps.values_list("outcome", flat=True)) == ["failed", ""]
    second = _running_step(found).action
    _carry_out(second, django_capture_on_commit_callbacks, 310.0, [290.0, 330.0])
    # neither alone: both together, once
    both = _running_step(found)
    assert both.keys == ["--max-num-seqs", "env A"]
    _carry_out(both.action, django_capture_on_commit_callbacks, 305.0, [290.0, 320.0])
    found.refresh_from_db()
    assert found.cause == [] and found.status == "restoring" and found.steps.count() == 3
    assert found.finding.startswith("No factor alone restores the baseline's figure.")
    assert "--max-num-seqs 8 → 1: the engine did not come up or the sweep failed" in found.finding
    assert "(the engine exited with status 1)" in found.finding


def test_a_cause_that_needs_two_changes_together_is_found_as_the_pair(
    world, broker, django_capture_on_commit_callbacks, client
):
    # the same --max-num-seqs on both sides: only the environment differs, in A and B
    regressed = _regression(
        world, env_before={"A": "1", "B": "1"}, env_after={"A": "2", "B": "2"},
        argv_after=ARGV, seqs_after=8,
    )  # fmt: skip
    found = bisection.bisection_start(watch_run=regressed, user=permissions.MOEOPS)
    assert found.candidates == ["env A", "env B"]
    tried = []
    while found.status == "running":
        step = _running_step(found)
        both = len(step.keys) == 2
        tried.append(step.keys)
        peak, interval = (995.0, [960.0, 1030.0]) if both else (310.0, [290.0, 330.0])
        _carry_out(step.action, django_capture_on_commit_callbacks, peak, interval)
        found.refresh_from_db()
    assert tried == [["env A"], ["env B"], ["env A", "env B"]]
    assert found.cause == ["env A", "env B"] and found.status == "restoring"
    assert found.finding.startswith(
        "The cause is environment A 1 → 2 and environment B 1 → 2 together: with the baseline's "
        "values of all of them its peak output tok/s was 995 (960–1,030)"
    )
    assert found.steps.last().action.recipe.env == {"A": "1", "B": "1"}
    # no one-flag fix is offered for a pair
    _carry_out(found.restore_action, django_capture_on_commit_callbacks)
    client.force_login(world.staff)
    page = client.get(found.get_absolute_url()).content.decode()
    assert "Found: environment A 1 → 2; environment B 1 → 2" in page
    assert 'id="apply-fix"' not in page


def test_a_capacity_watchs_try_is_judged_on_its_capacity(
    world, broker, django_capture_on_commit_callbacks
):
    profile = SLOProfile.objects.create(name="chat", tpot_percentile="p99", tpot_ms=50.0)
    watch = services.watch_create(
        deployment=world.deployment, name="capacity", kind="capacity", slo_profile=profile,
        parameters={"start": 4, "input_len": 16, "output_len": 32}, cron="0 3 * * *",
    )  # fmt: skip
    # what a firing asks the runs service for
    load = services.run_load(watch.kind, watch.parameters, profile)
    parameters = run_services.sweep_parameters(deployment=world.deployment, load=load)
    judged = []
    for recipe, seqs, load, top in ((_recipe(world), 8, 16, 24), (None, 1, 4, 6)):
        recipe = recipe or _recipe(world, argv=set_flags(ARGV, {"--max-num-seqs": "1"}))
        answer = {"load": load, "load_on_medians": load, "bracket_on_medians": [load, top]}
        run = page_base.run(
            world.deployment, parameters=parameters, capacity=answer,
            snapshot=_snapshot(recipe, seqs),
        )  # fmt: skip
        WatchRun.objects.create(watch=watch, run=run, status="running")
        judged.append(services.watch_run_finished(run))
    assert judged[1].verdict == "regressed"
    found = bisection.bisection_start(watch_run=judged[1], user=permissions.MOEOPS)
    assert found.status == "running", found.finding
    action = _running_step(found).action
    assert action.after_run.parameters["kind"] == "capacity"
    engine_services.engine_action_report(action=action, status="running")
    with django_capture_on_commit_callbacks(execute=True):
        engine_services.engine_action_report(action=action, status="sweeping")
    after = action.after_run
    run_services.run_transition(run=after, status="running")
    # a search whose levels peak high in tok/s but whose capacity is the regressed one
    _levels(after, 5000.0, [4900.0, 5100.0])
    SweepRun.objects.filter(pk=after.pk).update(
        capacity={"load": 4, "load_on_medians": 4, "bracket_on_medians": [4, 6]}
    )
    with django_capture_on_commit_callbacks(execute=True):
        run_services.run_transition(run=after, status="succeeded")
    step = found.steps.get()
    assert (step.outcome, step.figure, step.interval) == ("no", 4, [4, 6])
    assert step.detail == "capacity (the load within its SLO profile) 4 (4–6)"


@pytest.mark.parametrize("case", ["not regressed", "external", "only topology", "busy", "moved"])
def test_it_refuses_with_a_sentence_naming_why(world, broker, case):
    if case == "only topology":
        recipe = _recipe(world)
        _watch_run(world, 1000.0, [950.0, 1050.0], _snapshot(recipe, 8))
        regressed = _watch_run(
            world, 300.0, [280.0, 320.0],
            _snapshot(recipe, 8, topology={**TOPOLOGY, "fingerprint": "def"}),
        )  # fmt: skip
    else:
        regressed = _regression(world)
    field, words = {
        "not regressed": ("watch_run", "only a watch run that regressed beyond the noise"),
        "external": ("deployment", "is external: moeops never restarts its engine"),
        "only topology": ("watch_run", "nothing a launch recipe sets differs"),
        "busy": ("deployment", "the host is busy: sweep"),
        "moved": ("watch_run", "that the regressed run measured"),
    }[case]
    if case == "not regressed":
        WatchRun.objects.filter(pk=regressed.pk).update(verdict="within")
        regressed.refresh_from_db()
    elif case == "external":
        world.deployment.management = "external"
        world.deployment.save()
        regressed = WatchRun.objects.get(pk=regressed.pk)
    elif case == "busy":
        SweepRun.objects.create(deployment=world.deployment, status="running")
    elif case == "moved":
        _recipe(world, argv=set_flags(ARGV, {"--max-num-seqs": "2"}))
    with pytest.raises(ValidationError) as refused:
        bisection.bisection_start(watch_run=regressed, user=world.staff)
    assert words in refused.value.message_dict[field][0]
    if case == "only topology":
        assert "topology fingerprint abc → def (a restart cannot change the GPUs" in str(
            refused.value
        )
    assert not Bisection.objects.exists()


def test_a_watch_that_says_so_starts_it_when_it_regresses_and_a_watch_waits_for_it(
    world, broker, django_capture_on_commit_callbacks
):
    services.watch_update(watch=world.watch, bisect_on_regression=True)
    regressed = _regression(world)
    handled = jobs.job_finished("runs.sweeprun", regressed.run.pk)
    found = Bisection.objects.get()
    assert handled["moeops.watches.bisection.on_run_finished"] == found.pk
    assert (found.source, found.status, found.watch_run) == ("watch", "running", regressed)
    # delivered again: the same bisection
    assert (
        jobs.job_finished("runs.sweeprun", regressed.run.pk)[
            "moeops.watches.bisection.on_run_finished"
        ]
        == found.pk
    )
    # between two steps no action is in flight: a firing still waits for the bisection
    step = _running_step(found)
    _carry_out(step.action, django_capture_on_commit_callbacks, 310.0, [290.0, 330.0])
    found.refresh_from_db()
    assert found.status == "restoring"
    waiting = services.watch_fire(watch=world.watch)
    assert waiting.status == "waiting"
    assert waiting.reason.startswith("waits: ")


def test_a_watch_on_an_external_deployment_keeps_the_refusal(world, broker):
    services.watch_update(watch=world.watch, bisect_on_regression=True)
    regressed = _regression(world)
    world.deployment.management = "external"
    world.deployment.save()
    jobs.job_finished("runs.sweeprun", regressed.run.pk)
    found = Bisection.objects.get()
    assert found.status == "refused"
    assert "is external" in found.finding


def test_the_api_and_the_page_start_it_and_show_the_steps(world, broker, client):
    regressed = _regression(world)
    answer = world.owner.post(f"/api/v1/watch-runs/{regressed.pk}/bisection", {})
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["status"] == "running"
    assert [s["tried"] for s in body["steps"]] == [["--max-num-seqs 8 → 1"]]
    listed = world.owner.get(f"/api/v1/watches/{world.watch.pk}/runs").json()["items"]
    assert [r["bisections"] for r in listed] == [[body["id"]], []]
    assert world.owner.get(f"/api/v1/bisections/{body['id']}").json()["status"] == "running"
    again = world.owner.post(f"/api/v1/watch-runs/{regressed.pk}/bisection", {})
    assert again.status_code == 400
    assert "the host is busy" in again.content.decode()
    assert world.host_worker.post(
        f"/api/v1/watch-runs/{regressed.pk}/bisection", {}
    ).status_code in (
        401,
        403,
    )

    client.force_login(world.staff)
    page = client.get(f"/bisections/{body['id']}/").content.decode()
    assert "--max-num-seqs 8 → 1" in page and 'id="bisection-steps"' in page
    watch_page = client.get(world.watch.get_absolute_url()).content.decode()
    assert "Find the cause" in watch_page and "bisection: trying the baseline" in watch_page
    # from the page, while the first is running: back to the watch with the sentence
    answer = client.post(f"/watch-runs/{regressed.pk}/bisection/", follow=True)
    assert "Cannot find the cause: the host is busy" in answer.content.decode()
