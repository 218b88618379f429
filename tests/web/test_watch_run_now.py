"""A watch's "Run now" (POST /watches/<pk>/run/) and the alert channels chosen in the watch
form of the deployment page."""

from datetime import timedelta

import pytest
from django.utils import timezone

from moeops.runs.models import SweepRun
from moeops.watches import services, tasks
from moeops.watches.models import Alert, AlertChannel, WatchRun
from tests import page_base

LOAD = page_base.WATCH_LOAD


@pytest.fixture
def deployment(db):
    return page_base.deployment()


def test_run_now_starts_a_run_outside_the_window_of_a_watch_turned_off(client, watch):
    page_base.sign_in(client)
    now = timezone.now()
    services.watch_update(
        watch=watch,
        enabled=False,
        window_start=(now + timedelta(hours=2)).time().replace(microsecond=0),
        window_end=(now + timedelta(hours=3)).time().replace(microsecond=0),
    )
    response = client.post(f"/watches/{watch.pk}/run/", follow=True)
    assert response.status_code == 200
    watch_run = WatchRun.objects.get(watch=watch)
    assert watch_run.status == "running"
    assert watch_run.run.status == "queued"
    assert watch_run.run.parameters["levels"] == [4, 8]
    assert "Watch nightly fired: its run is queued." in response.content.decode()


def test_run_now_while_the_host_is_held_waits_and_is_fired_again(
    client, watch, monkeypatch, django_capture_on_commit_callbacks
):
    page_base.sign_in(client)
    page_base.run(watch.deployment, label="a bench", status="running")
    sent = []
    monkeypatch.setattr(tasks.fire_watch, "apply_async", lambda **kwargs: sent.append(kwargs))
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/watches/{watch.pk}/run/", follow=True)
    watch_run = WatchRun.objects.get(watch=watch)
    assert watch_run.status == "waiting"
    assert "it waits: sweep a bench is running" in response.content.decode()
    assert sent == [
        {
            "kwargs": {"watch_id": watch.pk, "watch_run_id": watch_run.pk, "asked": True},
            "countdown": 60,
        }
    ]


def test_the_retry_of_a_run_now_of_a_watch_turned_off_still_fires(watch):
    services.watch_update(watch=watch, enabled=False)
    watch_run = WatchRun.objects.create(watch=watch, status="waiting")
    assert tasks.fire_watch.run(watch.pk, watch_run.pk, asked=True) == watch_run.pk
    watch_run.refresh_from_db()
    assert watch_run.status == "running"
    # beat's own firing of a watch turned off does nothing
    assert tasks.fire_watch.run(watch.pk) is None


def test_run_now_is_a_post_of_a_signed_in_member(client, watch):
    assert client.post(f"/watches/{watch.pk}/run/").status_code == 302
    page_base.sign_in(client)
    assert client.get(f"/watches/{watch.pk}/run/").status_code == 405
    assert not SweepRun.objects.exists()


def test_the_watch_page_has_the_run_now_button(client, watch):
    page_base.sign_in(client)
    html = client.get(watch.get_absolute_url()).content.decode()
    assert f'action="/watches/{watch.pk}/run/"' in html


def _form(**extra):
    return {
        "name": "nightly",
        "schedule": "0 3 * * *",
        "levels": "4, 8",
        "input_len": 16,
        "output_len": 32,
        "prompts_per_level": 8,
        "rounds": 4,
        **extra,
    }


def test_the_watch_form_offers_the_deployments_and_global_channels_and_keeps_the_choice(
    client, deployment
):
    page_base.sign_in(client)
    ops = AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    own = AlertChannel.objects.create(
        name="glm-oncall", kind="email", recipients=["g@example.com"], deployment=deployment
    )
    other = page_base.deployment(
        name="Kimi", host_row=page_base.host("b200"), model_row=deployment.model
    )
    AlertChannel.objects.create(
        name="kimi-oncall", kind="email", recipients=["k@example.com"], deployment=other
    )
    html = page_base.form_html(client, deployment, "watches")
    assert 'id="watch-channels"' in html
    assert "> glm-oncall</label>" in html
    assert "> ops</label>" in html
    assert "kimi-oncall" not in html
    response = client.post(f"/deployments/{deployment.pk}/watches/", _form(channels=[own.pk]))
    assert response.status_code == 302
    watch = deployment.watches.get()
    assert list(watch.channels.all()) == [own]
    assert ops not in services.watch_channels(watch)


def test_the_watch_form_refuses_another_deployments_channel(client, deployment):
    page_base.sign_in(client)
    other = page_base.deployment(
        name="Kimi", host_row=page_base.host("b200"), model_row=deployment.model
    )
    theirs = AlertChannel.objects.create(
        name="kimi-oncall", kind="email", recipients=["k@example.com"], deployment=other
    )
    response = client.post(f"/deployments/{deployment.pk}/watches/", _form(channels=[theirs.pk]))
    assert response.status_code == 400
    assert not deployment.watches.exists()


def test_alerts_go_to_the_chosen_channels_only(watch, django_capture_on_commit_callbacks):
    AlertChannel.objects.create(name="ops", kind="email", recipients=["ops@example.com"])
    chosen = AlertChannel.objects.create(name="perf", kind="email", recipients=["perf@example.com"])
    services.watch_update(watch=watch, channels=[chosen])
    watch_run = WatchRun.objects.create(watch=watch, status="finished", verdict="regressed")
    with django_capture_on_commit_callbacks():
        alerts = services.alerts_raise(watch_run=watch_run, kind="failing")
    assert [alert.channel for alert in alerts] == [chosen]
    assert Alert.objects.count() == 1
