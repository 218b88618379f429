"""A watch on the real vLLM catches a regression made by a changed launch argument, alerts by
webhook and mail naming that argument, and finds it by bisection, with no person starting any
of it: Celery beat fires the watch (its schedule a few seconds out in beat's table), the web
side's worker starts its sweeps, the host's worker sweeps the managed vLLM (tests/engine), the
job-finished hook judges each run, sends the alerts to servers on 127.0.0.1 and starts the
bisection, whose steps restart the engine. A person only changes the recipe, as a team does."""

import time

import pytest
from django_celery_beat.models import IntervalSchedule

from moeops.watches import services
from moeops.watches.models import Alert, AlertChannel, Bisection, WatchRun
from tests.alert_servers import Webhook
from tests.engine.managed import ACTION_TIMEOUT_S, act, action_finished
from workers.engine_info import identify_engine

pytest_plugins = ["tests.stack", "tests.webside", "tests.alert_servers", "tests.engine.managed"]
pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.quiet, pytest.mark.timeout(1200)]

# 8 streams of 8 tokens, five rounds: the engine's cap of 8 serves them at once, a cap of 1 one
# by one. The one load that passed here (485 s, load 11-20: 42 → 7 tok/s); on the 2-core machine
# shared with other runs short rounds vary up to 5× from one to the next, and the fall was seen
# "within the noise" with 8 tokens at a load of 7 (a request's fixed costs hid the cap), with 32
# tokens (a cap of 8 gave [19, 478] tok/s) and with 16 → 1 at 16 streams; ten rounds at a cap of
# 1 outlast the wait for the verdict. docs/decisions.md, 32.
# Eight warm-up requests before the level: right after a restart the first rounds ran 2-5× slower
# than the rest (407, 233, 969, 975, 1232 tok/s in a make test run), which hid the fall.
# 64 requests a round (8 waves at a cap of 8): rounds of one wave lasted 0.05 s, and beside two
# busy cores one pause made a cap-8 round read 102 tok/s among 931-1,325 and a cap-1 round 31
# among 176-346, so that five rounds of each could not tell a 5× fall from the noise (make test
# at 257f480); a round of 8 waves outlasts such a pause.
LOAD = {
    "levels": [8],
    "input_len": 16,
    "output_len": 8,
    "prompts_per_level": 64,
    "rounds": 5,
    "warmup": 8,
}
CHANGE = "--max-num-seqs 8 → 1"


def _fire_once(stack, watch):
    """Let beat fire the watch (its schedule every 2 s) until one firing started a sweep, then
    turn it off; the watch run once judged."""
    fired_before = set(WatchRun.objects.filter(watch=watch).values_list("pk", flat=True))
    services.watch_update(watch=watch, enabled=True)

    def fired():
        runs = WatchRun.objects.filter(watch=watch, run__isnull=False).exclude(pk__in=fired_before)
        return runs.order_by("fired_at").first()

    watch_run = stack.wait_until(fired, 60, "a firing of the watch by beat")
    # the firings while its sweep holds the host wait, then see the watch off and skip
    services.watch_update(watch=watch, enabled=False)

    def judged():
        found = WatchRun.objects.get(pk=watch_run.pk)
        return found if found.status in ("finished", "failed") else None

    return stack.wait_until(judged, 180, "the watch run's verdict")


def _rounds(watch_run):
    """Each round's figures of the watch run's level, for a failure's message: (round, tok/s,
    s, completed, failed, output tokens)."""
    keys = ("output_throughput", "duration", "completed", "failed", "total_output_tokens")
    return [
        (r.round, *(r.figures.get(k) for k in keys))
        for level in watch_run.run.levels.all()
        for r in level.rounds.order_by("round")
    ]


def test_a_smaller_max_num_seqs_is_caught_alerted_and_found_by_the_watch_alone(
    make_managed_vllm, web_side, smtp, quiet_turn
):
    started = time.monotonic()
    stack = make_managed_vllm(max_num_seqs=8)
    deployment = stack.deployment
    mailbox = smtp()
    hook = Webhook([200] * 4)
    AlertChannel.objects.create(name="hook", kind="webhook", url=hook.url)
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    up = act(stack, "restart")
    assert up.status == "succeeded", (up.error, up.steps)

    watch = services.watch_create(
        deployment=deployment,
        name="every few seconds",
        parameters=LOAD,
        every_hours=1,
        enabled=False,
        bisect_on_regression=True,
    )
    seconds, _ = IntervalSchedule.objects.get_or_create(every=2, period=IntervalSchedule.SECONDS)
    task = watch.periodic_task
    task.interval = seconds
    task.save()

    # the rounds judged run alone (tests/quiet.py); the engine's restarts beside the others
    with quiet_turn.alone():
        first = _fire_once(stack, watch)
        assert (first.status, first.verdict) == ("finished", "first"), first.reason

    # a person changes the recipe: a smaller cap, no re-sweep
    smaller = act(stack, "restart_with_args", changes={"--max-num-seqs": "1"}, resweep=False)
    assert smaller.status == "succeeded", (smaller.error, smaller.steps)

    with quiet_turn.alone():
        second = _fire_once(stack, watch)
        assert second.verdict == "regressed", f"{_rounds(first)} then {_rounds(second)}"
        assert second.compared_with == first.run
        # the engine's own max_num_seqs and running cap follow from the flag: one factor, named once
        assert second.changes == [CHANGE]

        def delivered():
            alerts = Alert.objects.filter(watch_run=second, kind="regression")
            return list(alerts) if [a.status for a in alerts] == ["delivered"] * 2 else None

        stack.wait_until(delivered, 30, "both alerts delivered")
        (body,) = hook.bodies
        assert body["changes"] == [CHANGE]
        assert f"What changed: {CHANGE}. Compare: " in body["text"]
        ((to, mail),) = mailbox.messages
        assert to == ["ops@example.com"] and f"What changed: {CHANGE}." in mail
        hook.close()

        # the watch started the bisection: one step with the baseline's --max-num-seqs, then back
        found = Bisection.objects.get(watch_run=second)
        assert (found.source, found.requested_by) == ("watch", None)
        (step,) = found.steps.all()
        action = action_finished(stack, step.action)
        assert action.status == "succeeded", (action.error, action.steps)
        assert "the engine reports max_num_seqs = 8" in action.observed["checks"][0]
        assert action.before_run == second.run and action.after_run.status == "succeeded"

    def concluded():
        bisection = Bisection.objects.get(pk=found.pk)
        return bisection if bisection.status in ("finished", "failed") else None

    found = stack.wait_until(concluded, ACTION_TIMEOUT_S, "the bisection's end")
    step.refresh_from_db()
    assert (step.keys, step.outcome) == (["--max-num-seqs"], "restores"), step.detail
    assert found.status == "finished", found.finding
    assert found.cause == ["--max-num-seqs"] and found.steps.count() == 1
    assert found.finding.startswith(f"The cause is {CHANGE}: with the baseline's --max-num-seqs 8")
    # the engine ends on the recipe in force, --max-num-seqs 1, until a person applies the fix
    assert found.restore_action.status == "succeeded"
    reported = identify_engine(deployment.endpoint_url)["args"]
    assert reported["scheduler_config.max_num_seqs"] == 1
    print(
        f"\nwatch on the real vLLM: {first.figure:.0f} → {second.figure:.0f} tok/s, the try "
        f"{step.figure:.0f}; {time.monotonic() - started:.0f} s in all"
    )
