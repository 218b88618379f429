"""The GPU-host Celery app `workers`: its configuration, and that it stays free of Django."""

import json
import os
import subprocess
import sys

from tests.fakes import ROOT


def _in_fresh_python(code, **env):
    """Run code in a new interpreter (the app reads its environment at import) and parse JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(proc.stdout)


def test_the_app_listens_on_its_hosts_queue_with_the_broker_from_redis_url():
    conf = _in_fresh_python(
        "import json; from workers.celery import app; c = app.conf; print(json.dumps({"
        "'broker': c.broker_url, 'queue': c.task_default_queue, 'ser': c.task_serializer, "
        "'accept': c.accept_content, 'prefetch': c.worker_prefetch_multiplier, "
        "'ignore': c.task_ignore_result, 'acks_late': c.task_acks_late, "
        "'lost': c.task_reject_on_worker_lost, 'vt': c.broker_transport_options"
        "['visibility_timeout'], 'backend': c.result_backend}))",
        REDIS_URL="redis://10.0.0.7:6379/2",
        MOEOPS_HOST="h200-a",
    )
    assert conf["broker"] == "redis://10.0.0.7:6379/2"
    assert conf["queue"] == "host.h200-a"
    assert (conf["ser"], conf["accept"]) == ("json", ["json"])
    assert conf["prefetch"] == 1
    assert conf["ignore"] is True and conf["backend"] is None
    assert conf["acks_late"] is True and conf["lost"] is True


def test_every_task_has_its_stable_name_and_time_limits():
    tasks = _in_fresh_python(
        "import json; from workers.celery import app; app.loader.import_default_modules(); "
        "print(json.dumps({n: [t.soft_time_limit, t.time_limit, t.acks_late] "
        "for n, t in app.tasks.items() if n.startswith('workers.')}))"
    )
    assert set(tasks) == {
        "workers.run_sweep",
        "workers.tune_kernel",
        "workers.check_deployment",
        "workers.gpus_now",
        "workers.probe_host",
        "workers.replay_spool",
        "workers.engine_action",
    }
    for name in (
        "workers.run_sweep",
        "workers.tune_kernel",
        "workers.check_deployment",
        "workers.gpus_now",
        "workers.engine_action",
    ):
        soft, hard, acks_late = tasks[name]
        assert 0 < soft < hard
        assert acks_late is True


def test_no_task_outlives_the_visibility_timeout():
    # Redis would hand a task still running to a second worker once this timeout passed
    from domain.queues import SWEEP_SOFT_LIMIT_S, VISIBILITY_TIMEOUT_S
    from moeops.celery import app as web_app
    from workers.celery import app as worker_app

    worker_app.loader.import_default_modules()
    limits = {n: t.time_limit for n, t in worker_app.tasks.items() if n.startswith("workers.")}
    assert limits["workers.run_sweep"] > SWEEP_SOFT_LIMIT_S
    # replay_spool, a few pushes, is the one task without a hard limit
    assert [n for n, limit in limits.items() if limit is None] == ["workers.replay_spool"]
    assert all(limit < VISIBILITY_TIMEOUT_S for limit in limits.values() if limit)
    # the web side shares the Redis: its timeout applies to the host tasks there too
    for app in (web_app, worker_app):
        assert app.conf.broker_transport_options["visibility_timeout"] == VISIBILITY_TIMEOUT_S


def test_the_worker_sets_up_no_django_even_with_django_settings_in_its_environment():
    loaded = _in_fresh_python(
        "import json, sys; from workers.celery import app; app.loader.import_default_modules(); "
        "app.finalize(); print(json.dumps(sorted(sys.modules)))",
        DJANGO_SETTINGS_MODULE="moeops.settings",
    )
    # kombu's JSON encoder imports django.utils.functional when Django is installed; nothing
    # may load settings, apps, models or the moeops project
    assert not [m for m in loaded if m.startswith(("moeops", "django.conf", "django.db"))]
    assert "django.apps" not in loaded
