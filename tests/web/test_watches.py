"""Watches: schedules in beat's tables, firing (wait, skip, start), judging against the
baseline within the rounds' noise, alerts and their messages, the API's refusals, the pages."""

from datetime import time, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from moeops import jobs
from moeops.api.models import ApiToken
from moeops.fleet.models import HealthCheck, SLOProfile
from moeops.runs.models import SweepRun
from moeops.watches import services
from moeops.watches.models import Alert, AlertChannel, WatchRun, last_regressed
from tests import page_base
from tests.api_base import ApiClient

LOAD = page_base.WATCH_LOAD


def _args(max_num_seqs):
    return {
        "engine": {
            "engine": "vllm",
            "version": "0.11.0",
            "args_source": "cli",
            "args": {"--max-num-seqs": max_num_seqs},
        }
    }


@pytest.fixture
def deployment(db):
    return page_base.deployment()


def _finished(watch, peak, interval, snapshot):
    """A watch run whose sweep succeeded with its peak level at `peak` tok/s, four rounds
    spanning `interval`."""
    run = page_base.run(
        watch.deployment,
        levels=[
            {"concurrency": 4, "output_throughput": peak / 2},
            {"concurrency": 8, "output_throughput": peak},
        ],
        snapshot=snapshot,
    )
    page_base.rounds_spanning(run.levels.get(concurrency=8), peak, interval)
    WatchRun.objects.create(watch=watch, run=run, status="running")
    return services.watch_run_finished(run)


def test_a_watch_keeps_its_schedule_in_beats_table_and_runs_four_rounds(watch):
    task = PeriodicTask.objects.get(pk=watch.periodic_task_id)
    assert task.task == "moeops.watches.tasks.fire_watch"
    assert task.kwargs == f'{{"watch_id": {watch.pk}}}'
    assert (task.crontab.minute, task.crontab.hour, task.crontab.day_of_week) == ("0", "3", "*")
    assert watch.parameters["rounds"] == 4
    assert watch.schedule_label() == "cron 0 3 * * *"
    services.watch_update(watch=watch, every_hours=6, enabled=False)
    task.refresh_from_db()
    assert (task.interval.every, task.interval.period, task.crontab, task.enabled) == (
        6,
        "hours",
        None,
        False,
    )


@pytest.mark.parametrize(
    "cron, said",
    [
        ("0 3 * *", "it needs five fields"),
        ("0 25 * * *", "the hour field '25' does not parse"),
        ("fish 3 * * *", "the minute field 'fish' does not parse"),
    ],
)
def test_it_rejects_a_cron_that_does_not_parse_naming_the_field(deployment, cron, said):
    with pytest.raises(ValidationError) as caught:
        services.watch_create(deployment=deployment, name="bad", parameters=LOAD, cron=cron)
    assert said in caught.value.message_dict["schedule.cron"][0]
    assert not PeriodicTask.objects.filter(task=services.FIRE_TASK).exists()


def test_the_quiet_window_runs_over_midnight(watch):
    watch.window_start, watch.window_end = time(22), time(4)
    at = timezone.now().replace(hour=23, minute=0)
    assert watch.in_window(at)
    assert watch.in_window(at.replace(hour=3))
    assert not watch.in_window(at.replace(hour=12))


def test_it_skips_with_the_reason_when_the_engine_is_down(watch):
    HealthCheck.objects.create(
        deployment=watch.deployment,
        checked_at=timezone.now(),
        status="failed",
        up=False,
        detail="connection refused",
    )
    watch_run = services.watch_fire(watch=watch)
    assert watch_run.status == "skipped"
    assert "the engine was down at its latest health check" in watch_run.reason
    assert "connection refused" in watch_run.reason
    assert not SweepRun.objects.filter(deployment=watch.deployment).exists()


def test_it_waits_while_another_sweep_holds_the_host_then_starts(watch):
    other = page_base.run(watch.deployment, label="someone's sweep", status="running")
    watch_run = services.watch_fire(watch=watch)
    assert watch_run.status == "waiting"
    assert (
        watch_run.reason
        == f"waits: sweep someone's sweep is running on host {watch.deployment.host.name}"
    )
    other.status = "succeeded"
    other.save()
    watch_run = services.watch_fire(watch=watch, watch_run=watch_run)
    assert watch_run.status == "running"
    assert watch_run.run.parameters["levels"] == [4, 8]
    assert watch_run.run.parameters["rounds"] == 4
    assert watch_run.run.status == "queued"


def test_a_capacity_watch_searches_against_its_profile_and_is_judged_on_its_range(deployment):
    profile = SLOProfile.objects.create(name="chat", tpot_percentile="p99", tpot_ms=50.0)
    watch = services.watch_create(
        deployment=deployment, name="capacity", kind="capacity", slo_profile=profile,
        parameters={"start": 4, "input_len": 16, "output_len": 32}, cron="0 3 * * *",
    )  # fmt: skip
    fired = services.watch_fire(watch=watch)
    assert fired.status == "running", fired.reason
    parameters = fired.run.parameters
    assert (parameters["kind"], parameters["slo"]["profile"]) == ("capacity", "chat")
    assert parameters["start"] == 4 and parameters["rounds"] == 4
    fired.run.delete()

    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    for load, top in ((16, 24), (4, 6)):
        answer = {"load": load, "load_on_medians": load, "bracket_on_medians": [load, top]}
        run = page_base.run(deployment, parameters={"kind": "capacity"}, capacity=answer)
        WatchRun.objects.create(watch=watch, run=run, status="running")
        judged = services.watch_run_finished(run)
    assert (judged.verdict, judged.figure, judged.interval) == ("regressed", 4, [4, 6])
    (alert,) = Alert.objects.all()
    assert "capacity (the load within its SLO profile) fell 75%, from 16 (16–24) to 4 (4–6)" in (
        alert.text
    )


def test_a_capacity_watch_needs_a_start_load_named_on_its_field(deployment):
    profile = SLOProfile.objects.create(name="chat", tpot_percentile="p99", tpot_ms=50.0)
    with pytest.raises(ValidationError) as refused:
        services.watch_create(
            deployment=deployment, name="capacity", kind="capacity", slo_profile=profile,
            parameters={"input_len": 16, "output_len": 32}, cron="0 3 * * *",
        )  # fmt: skip
    assert "parameters.start" in refused.value.message_dict


def test_it_gives_up_waiting_after_the_limit(watch, settings):
    settings.MOEOPS_WATCH_WAIT_LIMIT_S = 60
    page_base.run(watch.deployment, label="long", status="running")
    watch_run = services.watch_fire(watch=watch)
    later = timezone.now() + timedelta(seconds=61)
    watch_run = services.watch_fire(watch=watch, watch_run=watch_run, now=later)
    assert watch_run.status == "skipped"
    assert watch_run.reason.startswith("the host stayed busy for 0.0 h: sweep long is running")


def test_outside_its_window_it_is_skipped(watch):
    now = timezone.now()
    watch.window_start = (now + timedelta(hours=2)).time().replace(microsecond=0)
    watch.window_end = (now + timedelta(hours=3)).time().replace(microsecond=0)
    watch_run = services.watch_fire(watch=watch, now=now)
    assert watch_run.status == "skipped"
    assert watch_run.reason.startswith("outside its quiet window")


def test_a_regression_beyond_the_noise_alerts_naming_what_changed(
    watch, django_capture_on_commit_callbacks
):
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    first = _finished(watch, 1000.0, [950.0, 1050.0], _args(64))
    assert first.verdict == "first"
    # within the noise: intervals overlap, no alert
    second = _finished(watch, 940.0, [900.0, 980.0], _args(64))
    assert (second.verdict, second.changes) == ("within", [])
    with django_capture_on_commit_callbacks():
        third = _finished(watch, 600.0, [560.0, 640.0], _args(16))
    assert third.verdict == "regressed"
    assert third.compared_with == second.run
    assert third.changes == ["--max-num-seqs 64 → 16"]
    (alert,) = Alert.objects.filter(kind="regression")
    assert alert.subject == f"Regression: {watch.deployment.name} (watch nightly)"
    assert "peak output tok/s fell 36%, from 940 (900–980) to 600 (560–640)" in alert.text
    assert "What changed: --max-num-seqs 64 → 16." in alert.text
    assert f"/compare/?run={second.run.uuid}&run={third.run.uuid}&group=run" in alert.text


def test_the_marked_baseline_is_compared_with_and_recovery_alerts(watch):
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    base = _finished(watch, 1000.0, [950.0, 1050.0], _args(64))
    services.watch_mark_baseline(watch_run=base, user=None)
    down = _finished(watch, 600.0, [560.0, 640.0], _args(16))
    assert (down.verdict, down.compared_with) == ("regressed", base.run)
    # the next run still regressed against the baseline: no second regression alert
    still = _finished(watch, 610.0, [570.0, 650.0], _args(16))
    assert (still.verdict, still.compared_with) == ("regressed", base.run)
    back = _finished(watch, 990.0, [940.0, 1040.0], _args(64))
    assert (back.verdict, back.changes) == ("within", [])
    kinds = list(Alert.objects.order_by("created", "id").values_list("kind", flat=True))
    assert kinds == ["regression", "recovery"]
    recovery = Alert.objects.get(kind="recovery")
    assert "Nothing on record changed between the two runs' snapshots" in recovery.text


def test_one_round_cannot_tell_and_alerts_nothing(watch):
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    _finished(watch, 1000.0, [950.0, 1050.0], _args(64))
    run = page_base.run(watch.deployment, levels=[{"concurrency": 8, "output_throughput": 500.0}])
    WatchRun.objects.create(watch=watch, run=run, status="running")
    assert services.watch_run_finished(run).verdict == "unknown"
    assert not Alert.objects.exists()


def test_failing_twice_in_a_row_alerts_once(watch):
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    for _ in range(3):
        run = page_base.run(watch.deployment, status="failed", error="engine went away")
        WatchRun.objects.create(watch=watch, run=run, status="running")
        watch_run = services.watch_run_finished(run)
        assert (watch_run.status, watch_run.reason) == (
            "failed",
            "the sweep failed: engine went away",
        )
    (alert,) = Alert.objects.all()
    assert alert.kind == "failing"
    assert "failed twice in a row" in alert.text


def test_a_run_that_is_no_watchs_is_left_alone(deployment):
    run = page_base.run(deployment, levels=[{"concurrency": 8, "output_throughput": 5.0}])
    assert services.watch_run_finished(run) is None


def test_the_job_finished_hook_judges_a_watchs_run_after_its_analysis(watch):
    _finished(watch, 1000.0, [950.0, 1050.0], _args(64))
    run = page_base.run(watch.deployment, levels=[{"concurrency": 8, "output_throughput": 500.0}])
    page_base.rounds_spanning(run.levels.get(), 500.0, [480.0, 520.0])
    WatchRun.objects.create(watch=watch, run=run, status="running")
    handled = jobs.job_finished("runs.sweeprun", run.pk)
    watch_run = WatchRun.objects.get(run=run)
    assert watch_run.verdict == "regressed"
    assert handled["moeops.watches.services.on_run_finished"] == watch_run.pk
    names = list(handled)
    assert names.index("moeops.watches.services.on_run_finished") > names.index(
        "moeops.insights.services.on_run_finished"
    )


# -- API -------------------------------------------------------------------------------------


@pytest.fixture
def owner(db):
    _, token = ApiToken.issue(name="owner")
    return ApiClient(token)


def test_the_api_creates_a_watch_and_refuses_a_bad_cron_naming_the_field(owner, deployment):
    body = {
        "deployment": deployment.name,
        "name": "nightly",
        "parameters": LOAD,
        "schedule": {"cron": "0 3 * *"},
    }
    answer = owner.post("/api/v1/watches", body)
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("schedule.cron: '0 3 * *' is not a cron expression")
    answer = owner.post("/api/v1/watches", {**body, "schedule": {"every_hours": 6}})
    assert answer.status_code == 201, answer.content
    created = answer.json()
    assert (created["schedule"], created["parameters"]["rounds"]) == ("every 6 hours", 4)
    assert created["next_run_at"] is not None
    answer = owner.patch(f"/api/v1/watches/{created['id']}", {"schedule": {"cron": "61 * * * *"}})
    assert answer.status_code == 400
    assert "the minute field '61' does not parse" in answer.json()["detail"]


def test_the_api_refuses_a_load_the_runs_service_refuses(owner, deployment):
    body = {"deployment": deployment.name, "name": "n", "parameters": {"levels": [4]}}
    answer = owner.post("/api/v1/watches", {**body, "schedule": {"every_hours": 1}})
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("parameters.input_len:")
    assert not PeriodicTask.objects.filter(task=services.FIRE_TASK).exists()


def test_a_watch_stored_with_a_seed_before_they_were_refused_fires_prompts_of_its_own(watch):
    type(watch).objects.filter(pk=watch.pk).update(parameters={**watch.parameters, "seed": 7})
    watch.refresh_from_db()
    seeds = {services.watch_fire(watch=watch).run.parameters["seed"]}
    SweepRun.objects.update(status="succeeded")
    seeds.add(services.watch_fire(watch=watch).run.parameters["seed"])
    assert len(seeds) == 2 and 7 not in seeds


def test_the_api_refuses_a_watch_whose_runs_would_all_send_one_seeds_prompts(owner, deployment):
    body = {"deployment": deployment.name, "name": "n", "schedule": {"every_hours": 1}}
    load = {"levels": [4], "input_len": 16, "output_len": 32, "seed": 7}
    answer = owner.post("/api/v1/watches", {**body, "parameters": load})
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("parameters.seed: a watch's runs each draw")
    assert not PeriodicTask.objects.filter(task=services.FIRE_TASK).exists()


def test_a_webhook_off_the_allow_list_is_refused_and_a_secret_never_shown(owner):
    answer = owner.post(
        "/api/v1/alert-channels",
        {
            "name": "slack",
            "kind": "webhook",
            "url": "https://hooks.slack.com/services/T0/B0/s3cret",
        },
    )
    assert answer.status_code == 400
    assert answer.json()["detail"] == (
        "url: hooks.slack.com is not in MOEOPS_WEBHOOK_ALLOWLIST (localhost, 127.0.0.0/8, ::1)"
    )
    answer = owner.post(
        "/api/v1/alert-channels",
        {"name": "local", "kind": "webhook", "url": "http://127.0.0.1:9/hook/s3cret"},
    )
    assert answer.status_code == 201
    assert answer.json()["url"] == "http://127.0.0.1:9/…"
    listed = owner.get("/api/v1/alert-channels").content.decode()
    assert "s3cret" not in listed


def test_a_host_token_may_not_write_watches(deployment):
    _, token = ApiToken.issue(name="worker", host=deployment.host)
    answer = ApiClient(token).post("/api/v1/alert-channels", {"name": "x", "kind": "email"})
    assert answer.status_code == 403


# -- pages -----------------------------------------------------------------------------------


def test_the_pages_show_watches_regressions_and_an_undelivered_alert(client, watch):
    page_base.sign_in(client)
    channel = AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    _finished(watch, 1000.0, [950.0, 1050.0], _args(64))
    down = _finished(watch, 600.0, [560.0, 640.0], _args(16))
    alert = Alert.objects.get(watch_run=down, channel=channel)
    alert.status, alert.error = "failed", "the SMTP server at localhost:25 did not take the mail"
    alert.save()

    page = client.get(watch.deployment.get_absolute_url()).content.decode()
    assert "cron 0 3 * * *" in page
    assert "03:00 UTC" in page
    timeline = page_base.figure(page, f"watch-timeline-{watch.pk}-data")
    names = [trace["name"] for trace in timeline["data"]]
    assert names == ["95 % interval", "peak output tok/s", "something changed", "alert sent"]

    page = client.get(watch.get_absolute_url()).content.decode()
    assert "Undelivered alerts" in page
    assert "the SMTP server at localhost:25 did not take the mail" in page
    assert "--max-num-seqs 64 → 16" in page

    page = client.get("/").content.decode()
    assert "Regressed at their last watch" in page
    assert "(−40 %)" in page


def test_the_deployment_page_adds_a_watch_every_n_hours_that_finds_its_cause(client, deployment):
    page_base.sign_in(client)
    form = {"name": "every 6 h", "schedule": "6h", "levels": "4, 8", "input_len": 16,
            "output_len": 32, "prompts_per_level": 8, "rounds": 3,
            "bisect_on_regression": "on"}  # fmt: skip
    answer = client.post(f"/deployments/{deployment.pk}/watches/", form)
    watch = deployment.watches.get()
    assert answer.status_code == 302 and answer["Location"] == watch.get_absolute_url()
    assert watch.schedule_label() == "every 6 hours" and watch.bisect_on_regression
    assert (watch.parameters["levels"], watch.parameters["rounds"]) == ([4, 8], 3)


@pytest.mark.parametrize(
    ("change", "field", "said"),
    [
        ({"schedule": "0 3 * *"}, "schedule", "it needs five fields"),
        ({"schedule": "0 99 * * *"}, "schedule", "the hour field '99' does not parse"),
        ({"levels": "8, 8"}, "levels", "give each value once"),
        ({"name": "nightly"}, "name", "has a watch 'nightly'"),
    ],
)
def test_the_watch_form_names_the_field_it_refuses(client, watch, change, field, said):
    page_base.sign_in(client)
    form = {"name": "other", "schedule": "0 3 * * *", "levels": "8", "input_len": 16,
            "output_len": 32, "prompts_per_level": 8, "rounds": 3, **change}  # fmt: skip
    answer = client.post(f"/deployments/{watch.deployment.pk}/watches/", form)
    assert answer.status_code == 400
    errors = answer.context["watch_form"].errors
    assert said in " ".join(errors[field]), errors
    assert watch.deployment.watches.count() == 1


def test_the_deployment_page_costs_the_same_queries_for_more_watches(
    client, watch, django_assert_max_num_queries
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    page_base.sign_in(client)
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    _finished(watch, 1000.0, [950.0, 1050.0], _args(64))
    _finished(watch, 600.0, [560.0, 640.0], _args(16))
    with CaptureQueriesContext(connection) as one:
        client.get(watch.deployment.get_absolute_url())
    for name in ("hourly", "weekly"):
        more = services.watch_create(
            deployment=watch.deployment, name=name, parameters=LOAD, every_hours=1
        )
        _finished(more, 1000.0, [950.0, 1050.0], _args(64))
    with django_assert_max_num_queries(len(one)):
        client.get(watch.deployment.get_absolute_url())


# -- admin -----------------------------------------------------------------------------------


def _admin_form(deployment, **fields):
    return {
        "deployment": deployment.pk,
        "name": "nightly",
        "kind": "sweep",
        "parameters": '{"levels": [4], "input_len": 16, "output_len": 32}',
        "cron": "",
        "every_hours": "",
        "enabled": "on",
        **fields,
    }


def test_the_admin_refuses_a_bad_cron_on_its_field_and_saves_through_the_service(
    admin_client, deployment
):
    page = admin_client.post(
        "/admin/watches/watch/add/", _admin_form(deployment, cron="0 3 * * mon-fish")
    )
    assert page.status_code == 200
    assert "the day of week field &#x27;mon-fish&#x27; does not parse" in page.content.decode()
    assert not PeriodicTask.objects.filter(task=services.FIRE_TASK).exists()
    page = admin_client.post(
        "/admin/watches/watch/add/", _admin_form(deployment, cron="30 2 * * *")
    )
    assert page.status_code == 302
    (task,) = PeriodicTask.objects.filter(task=services.FIRE_TASK)
    assert (task.crontab.minute, task.crontab.hour) == ("30", "2")
    assert task.watch.parameters["rounds"] == 4


def test_the_admin_never_shows_a_webhooks_url_back(admin_client):
    channel = AlertChannel.objects.create(
        name="hook", kind="webhook", url="http://127.0.0.1:9/hooks/s3cret"
    )
    page = admin_client.get(f"/admin/watches/alertchannel/{channel.pk}/change/").content.decode()
    assert "s3cret" not in page
    listing = admin_client.get("/admin/watches/alertchannel/").content.decode()
    assert "s3cret" not in listing and "http://127.0.0.1:9/…" in listing


def test_the_api_marks_a_baseline_and_lists_undelivered_alerts(owner, watch):
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    base = _finished(watch, 1000.0, [950.0, 1050.0], _args(64))
    answer = owner.post(f"/api/v1/watch-runs/{base.pk}/baseline")
    assert (answer.status_code, answer.json()["baseline"]) == (200, base.pk)
    down = _finished(watch, 600.0, [560.0, 640.0], _args(16))
    Alert.objects.filter(watch_run=down).update(status="failed", error="refused")
    runs = owner.get(f"/api/v1/watches/{watch.pk}/runs").json()["items"]
    assert [(r["verdict"], r["compared_with"]) for r in runs] == [
        ("regressed", str(base.run.uuid)),
        ("first", None),
    ]
    (alert,) = owner.get("/api/v1/alerts", params={"status": "failed"}).json()["items"]
    assert (alert["kind"], alert["error"], alert["channel"]) == ("regression", "refused", "ops")
    skipped = WatchRun.objects.create(watch=watch, status="skipped", reason="engine down")
    answer = owner.post(f"/api/v1/watch-runs/{skipped.pk}/baseline")
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("watch_run: only a finished watch run")


def test_the_dashboards_regressed_watches_are_those_whose_newest_finished_run_regressed(watch):
    other = services.watch_create(
        deployment=watch.deployment, name="hourly", parameters=LOAD, cron="0 * * * *"
    )
    start = timezone.now() - timedelta(days=1)

    def fired(on, hours, status="finished", verdict=""):
        run = WatchRun.objects.create(watch=on, status=status, verdict=verdict)
        WatchRun.objects.filter(pk=run.pk).update(fired_at=start + timedelta(hours=hours))
        return run

    # "nightly" regressed, then a newer run came back within the noise
    fired(watch, 1, verdict="regressed")
    fired(watch, 2, verdict="within")
    # "hourly" regressed last; a newer run that has not finished changes nothing yet
    fired(other, 1, verdict="within")
    regressed = fired(other, 2, verdict="regressed")
    fired(other, 3, status="running")

    assert [(r.pk, r.watch.name) for r in last_regressed()] == [(regressed.pk, "hourly")]
