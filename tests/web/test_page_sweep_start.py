import html

import pytest
from kombu.exceptions import OperationalError

from moeops.fleet.models import Deployment
from moeops.runs import services as run_services
from moeops.runs.models import SweepRun
from moeops.runs.workloads import workload_store
from tests import page_base as pb

pytestmark = pytest.mark.django_db

FORM = pb.sweep_form(
    "c32-1024", "1024, 32,64", input_len=1024, output_len=256, prompts_per_level=512
)


@pytest.fixture
def deployment(client):
    return pb.deployment_signed_in(client)


def _file_workload(name, kind, file_name, data):
    workload, _ = workload_store(name=name, spec={"kind": kind}, file_name=file_name, data=data)
    return workload


def _option(client, deployment, workload):
    """The attributes of the workload's option in the deployment page's sweep form."""
    form = pb.form_html(client, deployment, "sweep")
    return form.split(f'<option value="{workload.pk}"')[1].split(">")[0]


def _sweep(client, deployment, workload, **fields):
    """The sweep form posted with `workload` chosen and `fields` in place of FORM's."""
    form = {**FORM, **fields, "workload": str(workload.pk)}
    return client.post(f"/deployments/{deployment.pk}/sweep/", form)


def test_it_queues_a_sweep_and_enqueues_it_after_commit(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(f"/deployments/{deployment.pk}/sweep/", FORM)
    run = SweepRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{run.uuid}/"
    assert run.status == "queued" and run.source == "worker"
    assert run.label == "c32-1024"
    assert run.topology_snapshot == deployment.host.current_topology()
    assert run.parameters["levels"] == [32, 64, 1024]
    assert run.parameters["output_len"] == 256
    assert run.parameters["base_url"] == "http://127.0.0.1:30000"
    assert run.parameters["model"] == "glm-5"
    assert run.parameters["gpu_indices"] == list(range(8))
    # nothing reaches the broker before the run is committed
    assert sent == [] and len(callbacks) == 1
    callbacks[0]()
    [(name, host, kwargs)] = sent
    assert name == "run_sweep" and host == deployment.host
    assert kwargs["run_uuid"] == str(run.uuid)
    assert kwargs["levels"] == [32, 64, 1024]
    assert kwargs["prompts_per_level"] == 512 and kwargs["warmup"] == 8


def test_a_broker_that_cannot_be_reached_fails_the_run(
    client, deployment, monkeypatch, django_capture_on_commit_callbacks
):
    def down(name, host, kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(run_services, "send_host_task", down)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/deployments/{deployment.pk}/sweep/", FORM)
    run = SweepRun.objects.get()
    assert run.status == "failed"
    assert "Could not reach the broker" in run.error and "Connection refused" in run.error


def test_it_rejects_bad_levels_on_the_deployment_page(client, deployment, sent):
    response = client.post(f"/deployments/{deployment.pk}/sweep/", {**FORM, "levels": "32,x"})
    assert response.status_code == 400
    assert "levels: whole numbers separated by commas" in response.content.decode()
    assert not SweepRun.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("levels", "99999999999", "levels: Input should be less than or equal to 65536"),
        ("levels", "1,1,1,2", "levels: give each value once (1 is given more than once)"),
        (
            "prompts_per_level",
            "100000000000",
            "prompts_per_level: Input should be less than or equal to 16777216",
        ),
        ("input_len", str(2**24), "a sweep may send at most 21,600,000,000 tokens"),
    ],
)
def test_it_shows_why_a_load_is_refused_and_stores_nothing(
    client, deployment, sent, field, value, shown
):
    form = {**FORM, "prompts_per_level": str(2**20), field: value}
    response = client.post(f"/deployments/{deployment.pk}/sweep/", form)
    assert response.status_code == 400
    assert shown in html.unescape(response.content.decode())
    assert not SweepRun.objects.exists() and sent == []


def test_an_endpoint_the_allow_list_refuses_is_shown_not_a_500(client, deployment, sent):
    Deployment.objects.filter(pk=deployment.pk).update(endpoint_url="http://169.254.169.254")
    response = client.post(f"/deployments/{deployment.pk}/sweep/", FORM)
    assert response.status_code == 400
    assert "169.254.169.254 is neither host" in response.content.decode()
    assert not SweepRun.objects.exists() and sent == []


def test_it_rejects_a_deployment_without_an_endpoint(client, deployment, sent):
    deployment.endpoint_url = ""
    deployment.save()
    response = client.post(f"/deployments/{deployment.pk}/sweep/", FORM)
    assert response.status_code == 400
    assert "no endpoint URL" in response.content.decode()
    assert not SweepRun.objects.exists()


def test_it_needs_post_and_login(client, deployment):
    assert client.get(f"/deployments/{deployment.pk}/sweep/").status_code == 405
    client.logout()
    assert client.post(f"/deployments/{deployment.pk}/sweep/", FORM).status_code == 302
    assert not SweepRun.objects.exists()


def test_the_sweep_form_says_when_the_hosts_worker_is_gone(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    html = pb.form_html(client, deployment, "sweep")
    sentence = html.split('id="sweep-preflight">')[1].split("</p>")[0]
    assert sentence.startswith("No worker of host h200-x8 has been seen: start one with")

    pb.worker_seen(deployment.host)
    html = pb.form_html(client, deployment, "sweep")
    assert "Start sweep" in html and 'id="sweep-preflight"' not in html


def test_it_queues_a_sweep_over_request_rates_under_the_cap(client, deployment, sent):
    form = {**FORM, "levels": "64", "request_rates": "8, 2.5", "burstiness": "0.5"}

    response = client.post(f"/deployments/{deployment.pk}/sweep/", form)

    assert response.status_code == 302
    parameters = SweepRun.objects.get().parameters
    assert parameters["levels"] == [64]
    assert parameters["request_rates"] == [2.5, 8.0]
    assert parameters["burstiness"] == 0.5
    assert "ramp_up_s" not in parameters


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"request_rates": "8,fast"}, "request_rates: numbers of req/s separated by commas"),
        ({"request_rates": "0"}, "request_rates: Input should be greater than 0"),
        ({"request_rates": "4,4"}, "request_rates: each rate once (4 is given more than once)"),
        ({"burstiness": "2"}, "burstiness: shapes the arrivals of a request rate; give one"),
        ({"request_rates": "4", "ramp_up_s": "-1"}, "ramp_up_s: Input should be greater than"),
    ],
)
def test_it_shows_why_the_arrivals_are_refused_and_stores_nothing(
    client, deployment, sent, fields, shown
):
    response = client.post(f"/deployments/{deployment.pk}/sweep/", {**FORM, **fields})

    assert response.status_code == 400
    assert shown in html.unescape(response.content.decode())
    assert not SweepRun.objects.exists() and sent == []


def test_the_form_sends_the_workload_it_names(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    spec = {"kind": "shared_prefix", "groups": 2, "prefix_len": 64, "question_len": 8}
    workload, _ = workload_store(
        name="prefixes", spec={**spec, "output": {"distribution": "fixed", "value": 32}}
    )

    with django_capture_on_commit_callbacks(execute=True):
        response = _sweep(client, deployment, workload)

    assert response.status_code == 302
    run = SweepRun.objects.get()
    assert run.parameters["workload"]["name"] == "prefixes"
    assert run.snapshot["workload"]["kind"] == "shared_prefix"
    [(_, _, kwargs)] = sent
    assert kwargs["workload"]["spec"]["groups"] == 2


def test_a_multi_turn_workload_on_the_completions_endpoint_runs_on_chat_from_the_form(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    spec = {"kind": "multi_turn", "turns": 2, "question_len": 8}
    workload, _ = workload_store(
        name="turns", spec={**spec, "output": {"distribution": "fixed", "value": 32}}
    )

    with django_capture_on_commit_callbacks(execute=True):
        response = _sweep(client, deployment, workload)

    assert response.status_code == 302
    assert SweepRun.objects.get().parameters["endpoint"] == "chat"
    [(_, _, kwargs)] = sent
    assert kwargs["endpoint"] == "chat"


ANSWERED = (
    b'{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "a b c"}]}\n'
    b'{"conversations": [{"from": "human", "value": "Yo"}, {"from": "gpt", "value": "d e f g h"}]}'
)


def test_a_dataset_whose_answers_set_the_output_says_so_and_needs_no_output_length(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    workload = _file_workload("answered", "dataset", "a.jsonl", ANSWERED)
    option = _option(client, deployment, workload)
    assert 'data-output="the file&#x27;s answers: mean 4 words (2 turns)"' in option

    with django_capture_on_commit_callbacks(execute=True):
        response = _sweep(client, deployment, workload, output_len="")

    assert response.status_code == 302
    run = SweepRun.objects.get()
    # the answers' mean bounds the sweep's total; each request sends its own answer's length
    assert run.parameters["output_len"] == 4
    assert run.parameters["workload"]["spec"]["output"] is None


def test_a_file_with_unanswered_turns_still_needs_an_output_length_for_them(client, deployment):
    workload = _file_workload("questions", "dataset", "q.txt", b"first\nsecond\n")

    response = _sweep(client, deployment, workload, output_len="")

    assert response.status_code == 400
    assert "output_len: a sweep needs a token count of at least 1" in html.unescape(
        response.content.decode()
    )
    assert not SweepRun.objects.exists()


TRACE = (
    b'{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}\n'
    b'{"timestamp": 500, "input_length": 1000, "output_length": 40, "hash_ids": [0, 2]}\n'
)


def test_a_trace_needs_no_input_length_and_the_run_records_the_traces_own(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    workload = _file_workload("trace", "trace", "t.jsonl", TRACE)
    option = _option(client, deployment, workload)
    assert 'data-input="the trace&#x27;s: mean 800 tokens (2 requests)"' in option

    with django_capture_on_commit_callbacks(execute=True):
        empty = _sweep(client, deployment, workload, input_len="", output_len="")
        # a number left in the field is not what a trace sends: the trace's mean is recorded
        kept = _sweep(client, deployment, workload, input_len="1024")

    assert (empty.status_code, kept.status_code) == (302, 302)
    first, second = SweepRun.objects.order_by("pk")
    assert first.parameters["input_len"] == second.parameters["input_len"] == 800
    assert first.parameters["output_len"] == 30


def test_without_a_trace_an_empty_input_length_is_refused_naming_it(client, deployment, sent):
    response = client.post(f"/deployments/{deployment.pk}/sweep/", {**FORM, "input_len": ""})

    assert response.status_code == 400
    assert "input_len: a sweep needs a token count of at least 1" in html.unescape(
        response.content.decode()
    )
    assert not SweepRun.objects.exists()
