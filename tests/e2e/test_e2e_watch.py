"""A watch fired by Celery beat itself: beat (django-celery-beat's database scheduler) and the
web side's worker are real processes on the test's database and Redis, beside the sweep stack
(tests/stack.py). The watch's schedule is set a few seconds out in beat's table, as the admin
would; beat fires it, the web worker starts its sweep through the runs service, the host's
worker sweeps the stand-in, and the finished run is judged as the watch's."""

import time

import pytest
from django_celery_beat.models import IntervalSchedule

from moeops.watches import services
from moeops.watches.models import WatchRun

pytest_plugins = ["tests.stack", "tests.webside"]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_beat_fires_a_watch_whose_sweep_is_judged_when_it_finishes(sweep_stack, web_side):
    watch = services.watch_create(
        deployment=sweep_stack.deployment,
        name="every few seconds",
        parameters={"levels": [2, 4], "input_len": 16, "output_len": 16, "prompts_per_level": 4},
        every_hours=1,
    )
    # the schedule a few seconds out, in beat's own table (the admin edits the same row)
    seconds, _ = IntervalSchedule.objects.get_or_create(every=3, period=IntervalSchedule.SECONDS)
    task = watch.periodic_task
    task.interval = seconds
    task.save()

    def fired():
        return WatchRun.objects.filter(watch=watch, run__isnull=False).order_by("fired_at").first()

    try:
        watch_run = sweep_stack.wait_until(fired, 60, "firing of the watch by beat")
    except AssertionError:
        logs = "\n".join((web_side / n).read_text()[-3000:] for n in ("beat.log", "web-worker.log"))
        raise AssertionError(f"beat never fired the watch:\n{logs}") from None
    # one firing is enough: later ones while its sweep runs wait, then see the watch off
    services.watch_update(watch=watch, enabled=False)
    assert watch_run.run.label.startswith("watch every few seconds")
    assert watch_run.run.parameters["rounds"] == 4

    run = sweep_stack.wait_for_run(watch_run.run, timeout=120)
    assert run.status == "succeeded", run.error

    def judged():
        found = WatchRun.objects.get(pk=watch_run.pk)
        return found if found.status == "finished" else None

    watch_run = sweep_stack.wait_until(judged, 30, "the watch run's verdict")
    assert watch_run.verdict == "first"
    peak = max(level.output_throughput for level in run.levels.all())
    assert watch_run.figure == peak
    # four rounds per level (the default): the figure has its 95 % interval
    low, high = watch_run.interval
    assert 0 <= low < high
    # the firings while the sweep held the host waited, saying what held it, and none ran
    time.sleep(2)
    others = WatchRun.objects.filter(watch=watch).exclude(pk=watch_run.pk)
    assert not others.filter(run__isnull=False).exists()
    for other in others:
        assert other.status in ("waiting", "skipped"), (other.status, other.reason)
        if other.reason.startswith("waits:"):
            assert f"on host {sweep_stack.host.name}" in other.reason
