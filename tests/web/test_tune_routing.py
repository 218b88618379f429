"""A tune under skewed routing (issue 42, item 4): the deployment page's form and the API take
the routing, the tune stores it and sends it to the worker, and the pages show it beside the
uniform tunes; a routing the worker cannot time under is refused naming the field."""

import pytest

from moeops.kernels.models import TuningRun
from tests import page_base as pb
from tests import queues
from tests.api_base import TUNE_START

QUEUE = "host.rtx-pro-6000"


def test_the_api_queues_a_tune_under_zipf_routing_beside_a_uniform_one(
    worker_world, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        skewed = worker_world.owner.post(TUNE_START, {"batch_sizes": [64], "routing": "zipf:1.2"})
        uniform = worker_world.owner.post(TUNE_START, {"batch_sizes": [64]})

    assert (skewed.status_code, uniform.status_code) == (201, 201)
    assert (skewed.json()["routing"], uniform.json()["routing"]) == ("zipf:1.2", "uniform")
    first, second = queues.queued(broker, QUEUE)
    assert first.kwargs["routing"] == "zipf:1.2"
    # a uniform tune's task is what it was before routings
    assert "routing" not in second.kwargs
    assert sorted(TuningRun.objects.values_list("routing", flat=True)) == ["uniform", "zipf:1.2"]


@pytest.mark.parametrize(
    ("routing", "said"),
    [
        ("zipf:0", "the exponent must be a number in (0, 8]"),
        ("dirichlet:lots", "the concentration must be a number"),
        ("skewed", "a routing is uniform, zipf:S, dirichlet:A"),
        ("ids.npy", "a file of top-k ids is given on the GPU host"),
    ],
)
def test_a_routing_the_worker_cannot_time_under_is_refused_naming_it(
    worker_world, broker, routing, said
):
    response = worker_world.owner.post(TUNE_START, {"routing": routing})

    assert response.status_code == 400
    assert response.json()["detail"].startswith("routing: ") and said in response.json()["detail"]
    assert not TuningRun.objects.exists() and queues.queued(broker, QUEUE) == []


def test_the_deployment_pages_form_takes_the_routing_and_the_pages_show_it(
    worker_world, client, broker, django_capture_on_commit_callbacks
):
    pb.sign_in(client)
    url = f"/deployments/{worker_world.deployment.pk}/tune/"
    form = {"dtype": "bf16", "batch_sizes": "64", "kernel": "builtin"}

    refused = client.post(url, {**form, "routing": "dirichlet:0"})
    assert refused.status_code == 400
    html = refused.content.decode()
    assert "the concentration must be a number in [0.001, 1000]" in html
    with django_capture_on_commit_callbacks(execute=True):
        started = client.post(url, {**form, "routing": "dirichlet:0.3"})

    tuning = TuningRun.objects.get()
    assert started["Location"] == f"/tunes/{tuning.uuid}/"
    assert tuning.routing == "dirichlet:0.3"
    [task] = queues.queued(broker, QUEUE)
    assert task.kwargs["routing"] == "dirichlet:0.3"
    detail = client.get(started["Location"]).content.decode()
    cell = detail.split('class="routing"')[1].split("</dd>")[0]
    assert "Dirichlet α=0.3" in cell and "the file is tuned for that skew" in cell
    page = client.get(worker_world.deployment.get_absolute_url()).content.decode()
    assert "bf16 under Dirichlet α=0.3" in page


def test_a_timing_under_the_other_routing_is_stored_once_and_a_bad_one_refused(worker_world):
    from moeops.kernels.services import tuning_run_create

    tuning, _ = tuning_run_create(
        host=worker_world.host, device_name="NVIDIA H200", E=8, N=64, hidden_size=128, topk=2
    )
    path = f"/api/v1/tuning-runs/{tuning.uuid}/timings"
    under = {"routing": {"kind": "uniform"}, "tuned_us": 109.0, "default_us": 100.0}
    timing = {"batch_size": 64, "tuned_us": 80.0, "default_us": 90.0, "also_under": under}

    first = worker_world.host_worker.post(path, {"timings": [timing]})
    again = worker_world.host_worker.post(path, {"timings": [timing]})
    bad = {**timing, "batch_size": 128, "also_under": {**under, "tuned_us": -1.0}}
    refused = worker_world.host_worker.post(path, {"timings": [bad]})

    assert (first.status_code, again.status_code) == (201, 200)
    stored = tuning.timings.get()
    assert stored.also_under == {**under, "shipped_us": None}
    assert stored.loss_under_other_routing == "loses 9 % at M=64 under uniform"
    assert refused.status_code in (400, 422) and "also_under" in str(refused.json())
    assert tuning.timings.count() == 1


def test_a_uniform_tune_may_be_timed_under_a_skew_too(
    worker_world, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        started = worker_world.owner.post(
            TUNE_START, {"batch_sizes": [64], "also_under": "zipf:1.2"}
        )
    refused = worker_world.owner.post(TUNE_START, {"batch_sizes": [64], "also_under": "zipf:-1"})

    assert started.status_code == 201
    [task] = queues.queued(broker, QUEUE)
    assert task.kwargs["also_under"] == "zipf:1.2" and "routing" not in task.kwargs
    assert refused.status_code == 400
    assert refused.json()["detail"].startswith("also_under: zipf:-1: the exponent")
    assert TuningRun.objects.count() == 1
