"""Writes of bisections: "Find the cause" of a regressed watch run on a managed deployment.

The factors that differ between the baseline's run and the regressed one
(moeops.watches.factors) are tried by restarting the engine with the baseline's value of some
of them: one at a time for up to ONE_BY_ONE_MAX, else halves of the set, narrowing to the half
that restores the figure. Each try is an engine action (kind "bisect") whose re-sweep repeats
the regressed run's load; its peak figure's rounds are judged against both ends' rounds
(watches.services.verdict). A try within the noise of both says neither and is measured
again, on the same engine with twice the rounds, up to MEASURES times in all
(docs/decisions.md, 43). When one factor restores the baseline's figure,
or nothing is left to try, the engine is restarted with the recipe in force when the bisection
began (kind "restore"): a person applies the fix.

`bisection_start` is the one entry point (page, API, and a watch that says so, on regressing);
`on_action_finished` and `on_run_finished` (finished handlers, moeops.jobs) move a bisection on
when its action or a measurement again ends.
"""

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from domain import launch
from domain.intervals import with_interval
from domain.levels import MAX_ROUNDS
from moeops import permissions
from moeops.engines import services as engine_services
from moeops.fleet.models import Host
from moeops.runs import services as run_services
from moeops.watches import factors, services
from moeops.watches.models import Bisection, BisectionStep, WatchRun

# Up to this many factors each is tried alone (one restart each); more are halved, so that
# k factors take about 2·log2(k) restarts instead of k.
ONE_BY_ONE_MAX = 3
# A try restores the figure when it is above the regressed one beyond the noise and wins back
# at least this share of the fall: from 1000 down to 300 tok/s, a try at 700 (57 %) restores it
# though two runs minutes apart may differ beyond their intervals; one at 450 (21 %) partly.
RESTORED_SHARE = 0.5
# A try within the noise of both the regressed run and the baseline cannot say which it is
# nearer (a busy machine's rounds spread across the gap): it is measured
# again with twice the rounds (up to MAX_ROUNDS), up to this many measurements in all, before
# it is called undecided.
MEASURES = 3


def plan(keys):
    """The key sets to try next among the suspected keys: each alone, or the two halves."""
    if len(keys) <= ONE_BY_ONE_MAX:
        return [[key] for key in keys]
    half = (len(keys) + 1) // 2
    return [keys[:half], keys[half:]]


def _refuse(field, sentence):
    raise ValidationError({field: sentence})


def _recipe_version(run):
    return ((run.snapshot or {}).get("recipe") or {}).get("version")


def _asker(bisection):
    """Who a bisection's tries are asked by: the person who started it (on record as their
    author), else moeops carrying on what a token or a watch started."""
    return bisection.requested_by or permissions.MOEOPS


def _fixed_words(fixed):
    return "; ".join(f"{f['phrase']} ({f['why']})" for f in fixed)


def bisection_start(*, watch_run, user, source="page"):
    """Start finding the cause of a regressed watch run; returns the running Bisection.

    user: staff, permissions.API_TOKEN or permissions.MOEOPS (the watch itself). Raises
    PermissionDenied for anyone else (None included) and ValidationError with a sentence on its
    field: a run that did not regress, an external deployment, no live worker, nothing a recipe
    sets differs (naming what changed that a restart cannot bring back), the host busy, the
    engine no longer on the regressed run's recipe or the baseline's recipe gone."""
    permissions.require_engine_change(user)
    deployment = watch_run.watch.deployment
    run, baseline = watch_run.run, watch_run.compared_with
    if watch_run.verdict != "regressed" or run is None or baseline is None:
        _refuse("watch_run", "only a watch run that regressed beyond the noise has a cause to find")
    if not deployment.is_managed:
        _refuse(
            "deployment",
            f"{deployment} is external: moeops never restarts its engine, so it cannot try the "
            "baseline's values",
        )
    absence = deployment.host.worker_absence()
    if absence:
        _refuse("host", absence)
    found = factors.changed_factors(baseline.snapshot, run.snapshot)
    if not found["revertible"]:
        if found["fixed"]:
            _refuse(
                "watch_run",
                "nothing a launch recipe sets differs between the baseline and this run; what "
                f"changed cannot be brought back by a restart: {_fixed_words(found['fixed'])}",
            )
        _refuse(
            "watch_run",
            "nothing on record differs between the baseline and this run: there is no factor "
            "to try",
        )
    with transaction.atomic():
        # one bisection or watch at a time per host (watches.services.watch_fire locks the same)
        Host.objects.select_for_update().get(pk=deployment.host_id)
        holder = services.host_holder(deployment)
        if holder:
            _refuse("deployment", f"the host is busy: {holder}")
        in_force = deployment.recipe_in_force()
        measured = _recipe_version(run)
        if in_force is None or in_force.version != measured:
            now = f"v{in_force.version}" if in_force is not None else "no recipe"
            _refuse(
                "watch_run",
                f"the engine runs {now}, not recipe v{measured} that the regressed run measured: "
                "let the watch measure the recipe in force first",
            )
        base_recipe = deployment.launch_recipes.filter(version=_recipe_version(baseline)).first()
        if base_recipe is None:
            _refuse("watch_run", "the baseline's launch recipe is not on record")
        keys = [f["key"] for f in found["revertible"]]
        bisection = Bisection.objects.create(
            watch_run=watch_run,
            deployment=deployment,
            source=source,
            start_recipe=in_force,
            baseline_recipe=base_recipe,
            factors=found["revertible"],
            fixed=found["fixed"],
            candidates=keys,
            queue=plan(keys),
            requested_by=permissions.person(user),
        )
        _next(bisection)
    return bisection


def _with_flag(argv, flag, value):
    """argv with flag at value (None: absent; "": a switch given)."""
    if value == "" and flag not in launch.SWITCHES:
        return [*launch.set_flags(argv, {flag: None}), flag]
    return launch.set_flags(argv, {flag: value})


def _command_len(argv):
    return next((i for i, part in enumerate(argv) if part.startswith("--")), len(argv))


def _step_recipe(bisection, chosen):
    """A new recipe version: the one in force at the start with the chosen factors at the
    baseline's values."""
    current, base = bisection.start_recipe, bisection.baseline_recipe
    argv, env = list(current.argv), dict(current.env)
    configs = list(current.kernel_configs.all())
    for factor in chosen:
        if factor["kind"] == "flag":
            argv = _with_flag(argv, factor["key"], factor["a"])
        elif factor["kind"] == "command":
            argv = base.argv[: _command_len(base.argv)] + argv[_command_len(argv) :]
        elif factor["kind"] == "env":
            env.pop(factor["name"], None)
            if factor["a"] is not None:
                env[factor["name"]] = factor["a"]
        else:
            configs = list(base.kernel_configs.all())
    values = "; ".join(f"{f['name']} {factors.show(f['a'])}" for f in chosen)
    return engine_services.recipe_derive(
        current,
        author=_asker(bisection),
        reason=f"bisection {bisection.pk}: the baseline's {values}"[:300],
        argv=argv,
        env=env,
        kernel_configs=configs,
    )


def _tried(bisection):
    """The key sets the bisection's steps tried, each as a frozenset."""
    return {frozenset(keys) for keys in bisection.steps.values_list("keys", flat=True)}


def _together(bisection):
    """The keys to try all at once when the queue ran out with no try restoring the figure:
    every factor, when there are several and they were not tried together (a regression that
    needs two changes at once is restored by neither alone); else None."""
    keys = [f["key"] for f in bisection.factors]
    if len(keys) < 2 or bisection.steps.filter(outcome="restores").exists():
        return None
    return None if frozenset(keys) in _tried(bisection) else keys


def _next(bisection):
    """Start the next try in the queue, or conclude when none is left."""
    if not bisection.queue:
        together = _together(bisection)
        if together is None:
            return _conclude(bisection)
        bisection.queue = [together]
    keys, *rest = bisection.queue
    chosen = [f for f in bisection.factors if f["key"] in keys]
    try:
        recipe = _step_recipe(bisection, chosen)
        action = engine_services.engine_action_start(
            deployment=bisection.deployment,
            kind="bisect",
            user=_asker(bisection),
            source="bisection",
            recipe=recipe,
            before_run=bisection.watch_run.run,
            changes={f["key"]: f["a"] for f in chosen if f["kind"] == "flag"},
        )
    except ValidationError as exc:
        what = "; ".join(bisection.phrases(keys))
        return _conclude(bisection, stopped=f"the try of {what} could not start: {_words(exc)}")
    number = bisection.steps.count() + 1
    BisectionStep.objects.create(
        bisection=bisection, number=number, keys=keys, action=action, run=action.after_run
    )
    bisection.queue = rest
    bisection.save(update_fields=["queue"])
    return bisection


def _words(exc):
    return "; ".join(exc.messages)


def step_outcome(figure, interval, watch_run, rounds=None):
    """What a try's figure (tok/s, its 95 % interval) says against the regressed run's and the
    baseline's: restores (above the regressed figure beyond the noise, and at least
    RESTORED_SHARE of the fall won back, or no longer below the baseline beyond the noise),
    partly (above it beyond the noise, less won back), no, undecided (within the noise of both)
    or unknown (too few rounds). rounds: the try's (services.watched_rounds), judged against
    the regressed run's and the baseline's rounds; None for a capacity search."""
    regressed, baseline = (
        (services.watched_rounds(watch_run.run), services.watched_rounds(watch_run.compared_with))
        if rounds is not None
        else (None, None)
    )
    now = services.verdict(
        figure, interval, watch_run.figure, watch_run.interval, rounds=(rounds, regressed)
    )
    before = services.verdict(
        figure,
        interval,
        watch_run.baseline_figure,
        watch_run.baseline_interval,
        rounds=(rounds, baseline),
    )
    if "unknown" in (now, before):
        return "unknown"
    if now == before == "within":
        return "undecided"
    if now != "improved":
        return "no"
    fall = watch_run.baseline_figure - watch_run.figure
    won_back = (figure - watch_run.figure) / fall if fall > 0 else 1.0
    return "restores" if before != "regressed" or won_back >= RESTORED_SHARE else "partly"


def _judge(step):
    """Write the step's figure and outcome from its action and the sweep it waits for."""
    action, run = step.action, step.judged_run
    if action.status != "succeeded" or run is None or run.status != "succeeded":
        step.outcome = "failed"
        step.detail = action.error or "the re-sweep did not succeed"
        if action.status == "succeeded" and run is not None and step.measures > 1:
            step.detail = f"measuring it again did not succeed: {run.error or run.status}"
    else:
        # the watch's own figure: peak output tok/s, or a capacity search's capacity
        figure, interval, missing = services.watched_figure(run)
        if figure is None:
            step.outcome, step.detail = "failed", missing
        else:
            step.figure, step.interval = figure, interval
            step.outcome = step_outcome(
                figure, interval, step.bisection.watch_run, services.watched_rounds(run)
            )
            name = step.bisection.watch_run.watch.figure_name()
            step.detail = f"{name} {with_interval(figure, interval)}"
            if step.measures > 1:
                step.detail += f", measured {step.measures} times"
    step.save(update_fields=["outcome", "figure", "interval", "detail"])


def _measure_again(step):
    """Repeat the step's last sweep on the engine as the try left it, with twice the rounds;
    True when it started (the step waits for it), False when the host refused it."""
    last = step.judged_run
    load = run_services.repeated_load(last.parameters)
    load["rounds"] = min(MAX_ROUNDS, 2 * int(load.get("rounds") or 1))
    try:
        again, _ = run_services.run_start(
            deployment=step.bisection.deployment,
            parameters=load,
            label=f"{step.action.title()}, measured again ({step.measures + 1})"[:200],
            recipe=step.action.recipe,
        )
    except ValidationError as exc:
        step.detail += f"; not measured again: {_words(exc)}"
        step.save(update_fields=["detail"])
        return False
    step.outcome, step.run, step.measures = "", again, step.measures + 1
    step.save(update_fields=["outcome", "run", "measures"])
    return True


def _move_on(step):
    """After a step is judged: measure it again, narrow, try the next set or conclude."""
    bisection = step.bisection
    if step.outcome == "undecided" and step.measures < MEASURES and _measure_again(step):
        return bisection
    if step.outcome == "restores" and len(step.keys) == 1:
        bisection.cause = step.keys
        return _conclude(bisection)
    if step.outcome == "restores":
        # narrowed to the keys of the try that restored it; a set already tried is not again
        # (the parts of all factors tried together after each alone had failed)
        tried = _tried(bisection)
        bisection.candidates = step.keys
        bisection.queue = [keys for keys in plan(step.keys) if frozenset(keys) not in tried]
    return _next(bisection)


def on_action_finished(action):
    """A finished engine action's handler (jobs.Step.BISECT): a bisection's action that ended
    moves it on. Returns the Bisection's id, or None."""
    return _pk(bisection_action_finished(action=action))


def on_run_finished(run):
    """A finished sweep run's handler (jobs.Step.BISECT, after the watch's judgement): a step
    measured again moves its bisection on; a watch run that regressed starts one when its watch
    says so. Returns the Bisection's id, or None."""
    return _pk(measured_again(run=run) or bisection_for_regression(run=run))


def _pk(bisection):
    return bisection.pk if bisection is not None else None


def bisection_action_finished(*, action):
    """A step's action ended: judge it, then narrow, try the next set or conclude; the restore
    action ended: the bisection is finished (failed when the engine did not come back). Returns
    the Bisection, None when the action is none of a bisection's or was handled already."""
    with transaction.atomic():
        step = (
            BisectionStep.objects.select_for_update(of=("self",))
            # a step measured again waits for that sweep, not for its action
            .filter(action=action, outcome="", measures=1)
            .select_related("bisection__watch_run__watch", "action__after_run")
            .first()
        )
        if step is not None:
            _judge(step)
            return _move_on(step)
        bisection = (
            Bisection.objects.select_for_update()
            .filter(restore_action=action, status="restoring")
            .first()
        )
        if bisection is None:
            return None
        if action.status == "succeeded":
            bisection.status = "finished"
        else:
            bisection.status = "failed"
            bisection.finding += (
                f" The engine did not come back on recipe v{bisection.start_recipe.version}: "
                f"{action.error}"
            )
        bisection.finished_at = timezone.now()
        bisection.save(update_fields=["status", "finding", "finished_at"])
        return bisection


def measured_again(*, run):
    """A step's measurement again ended: judge the step on it and move on. Returns the
    Bisection, None when run is no step's measurement again or was handled already."""
    with transaction.atomic():
        step = (
            BisectionStep.objects.select_for_update(of=("self",))
            .filter(run=run, outcome="", measures__gt=1)
            .select_related("bisection__watch_run__watch", "action", "run")
            .first()
        )
        if step is None:
            return None
        _judge(step)
        return _move_on(step)


def _finding(bisection, stopped=""):
    """What the bisection found, in sentences."""
    watch_run = bisection.watch_run
    steps = list(bisection.steps.all())
    now = with_interval(watch_run.figure, watch_run.interval)
    before = with_interval(watch_run.baseline_figure, watch_run.baseline_interval)
    parts = []
    if bisection.cause:
        step = next(s for s in steps if s.keys == bisection.cause and s.outcome == "restores")
        figures = (
            f"its {watch_run.watch.figure_name()} was "
            f"{with_interval(step.figure, step.interval)}, against {now} now and {before} at "
            "the baseline"
        )
        if len(bisection.cause) == 1:
            (factor,) = [f for f in bisection.factors if f["key"] in bisection.cause]
            parts.append(
                f"The cause is {factor['phrase']}: with the baseline's {factor['name']} "
                f"{factors.show(factor['a'])} {figures}. To keep the fix, restart the engine "
                "with it."
            )
        else:
            together = " and ".join(bisection.phrases(bisection.cause))
            parts.append(
                f"The cause is {together} together: with the baseline's values of all of them "
                f"{figures}, and no smaller set tried restores it. To keep the fix, restart the "
                "engine with all of them."
            )
    else:
        undecided = any(step.outcome == "undecided" for step in steps)
        parts.append(
            stopped
            or (
                "No factor alone was shown to restore the baseline's figure beyond the noise."
                if undecided
                else "No factor alone restores the baseline's figure."
            )
        )
        for step in steps:
            what = "; ".join(bisection.phrases(step.keys))
            parts.append(f"With the baseline's {what}: {step.get_outcome_display().lower()}"
                         + (f" ({step.detail})" if step.detail else "") + ".")  # fmt: skip
    if bisection.fixed:
        parts.append(f"Not tried, a restart cannot bring it back: {_fixed_words(bisection.fixed)}.")
    return " ".join(parts)


def _conclude(bisection, stopped=""):
    """Write the finding, and restart the engine with the recipe in force at the start when a
    try changed it (restoring); finished at once when none did. With no single factor found,
    the smallest set of factors whose try restored the figure is the cause, together."""
    bisection.queue = []
    if not bisection.cause and not stopped:
        restoring = [s for s in bisection.steps.all() if s.outcome == "restores"]
        if restoring:
            bisection.cause = min(restoring, key=lambda s: len(s.keys)).keys
    bisection.finding = _finding(bisection, stopped)
    bisection.status = "finished" if not stopped else "failed"
    if bisection.steps.exists():
        start = bisection.start_recipe
        try:
            recipe = engine_services.recipe_create(
                deployment=bisection.deployment,
                author=_asker(bisection),
                reason=f"bisection {bisection.pk} ends: back to recipe v{start.version}",
                based_on=bisection.deployment.recipe_in_force(),
                **engine_services.recipe_content(start),
            )
            bisection.restore_action = engine_services.engine_action_start(
                deployment=bisection.deployment,
                kind="restore",
                user=_asker(bisection),
                source="bisection",
                recipe=recipe,
                resweep=False,
            )
            bisection.status = "restoring"
        except ValidationError as exc:
            bisection.status = "failed"
            bisection.finding += f" The engine could not be restored: {_words(exc)}"
    if bisection.status != "restoring":
        bisection.finished_at = timezone.now()
    bisection.save()
    return bisection


def bisection_for_regression(*, run):
    """A watch run that regressed (the first of a streak) on a watch with bisect_on_regression
    starts a bisection with no person; a start refused is kept as a refused Bisection with its
    sentence. Returns the Bisection (the one started already when called again), or None."""
    watch_run = (
        WatchRun.objects.filter(
            run=run, status="finished", verdict="regressed", watch__bisect_on_regression=True
        )
        .select_related("watch__deployment__host", "run", "compared_with")
        .first()
    )
    if watch_run is None:
        return None
    started = watch_run.bisections.first()
    if started is not None:
        return started
    previous = services.previous_finished(watch_run)
    if previous is not None and previous.verdict == "regressed":
        return None
    try:
        return bisection_start(watch_run=watch_run, user=permissions.MOEOPS, source="watch")
    except ValidationError as exc:
        return Bisection.objects.create(
            watch_run=watch_run,
            deployment=watch_run.watch.deployment,
            source="watch",
            status="refused",
            finding=_words(exc),
            finished_at=timezone.now(),
        )
