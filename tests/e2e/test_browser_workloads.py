"""Workloads in the browser (headless Chromium, Playwright, a live server): the sweep form shows
a file's answer lengths in place of its pre-filled output length, and a workload's page draws its
length histograms."""

import pytest
from django.contrib.auth.models import User

from moeops.examples import load_standin_deployment
from moeops.fleet.services import health_check_record
from moeops.runs.workloads import workload_store
from tests.browser import PASSWORD, chart_traces, log_in, shot, sweep_form_opened

pytest_plugins = ["tests.browser"]
pytestmark = pytest.mark.browser
ANSWERED = (
    b'{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "a b c"}]}\n'
    b'{"conversations": [{"from": "human", "value": "Yo"}, {"from": "gpt", "value": "d e f g h"}]}'
)


@pytest.fixture
def member(db):
    return User.objects.create_user("dana", password=PASSWORD)


def test_a_datasets_answers_replace_the_sweep_forms_output_length(page, member):
    deployment = load_standin_deployment()
    health_check_record(
        deployment=deployment, status="healthy", trigger="periodic", engine="standin"
    )
    workload, _ = workload_store(
        name="answered", spec={"kind": "dataset"}, file_name="a.jsonl", data=ANSWERED
    )
    sweep_form_opened(page, member, deployment)
    output = page.locator("#sweep-form input[name=output_len]")
    assert output.input_value() == "128"

    page.select_option("#sweep-form select[name=workload]", str(workload.pk))

    assert output.input_value() == ""
    assert output.get_attribute("placeholder") == "the file's answers: mean 4 words (2 turns)"
    # a preset fills the load but leaves the answers' lengths alone
    page.click("button:has-text('full')")
    assert page.input_value("#sweep-form input[name=levels]") == "32,64,128,256,512,1024"
    assert output.input_value() == ""
    # back to random ids: the field is the sweep's own again
    page.select_option("#sweep-form select[name=workload]", "")
    assert output.get_attribute("placeholder") == ""
    shot(page, "sweep-form-dataset-workload")


TRACE = (
    b'{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}\n'
    b'{"timestamp": 500, "input_length": 1000, "output_length": 40, "hash_ids": [0, 2]}\n'
)


def test_a_trace_replaces_both_lengths_of_the_sweep_form(page, member):
    deployment = load_standin_deployment()
    workload, _ = workload_store(
        name="trace", spec={"kind": "trace"}, file_name="t.jsonl", data=TRACE
    )
    sweep_form_opened(page, member, deployment)
    length = page.locator("#sweep-form input[name=input_len]")
    output = page.locator("#sweep-form input[name=output_len]")

    page.select_option("#sweep-form select[name=workload]", str(workload.pk))

    assert (length.input_value(), output.input_value()) == ("", "")
    assert length.get_attribute("placeholder") == "the trace's: mean 800 tokens (2 requests)"
    assert output.get_attribute("placeholder") == "the trace's: mean 30 tokens (2 requests)"
    page.click("button:has-text('full')")
    assert length.input_value() == "" and output.input_value() == ""
    page.select_option("#sweep-form select[name=workload]", "")
    assert length.get_attribute("placeholder") == ""
    page.click("button:has-text('quick')")
    assert length.input_value() == "128"


def test_a_workloads_page_draws_its_histograms(page, member):
    workload, _ = workload_store(
        name="answered", spec={"kind": "dataset"}, file_name="a.jsonl", data=ANSWERED
    )
    log_in(page, member)

    page.goto(page.base + f"/workloads/{workload.pk}/")

    assert chart_traces(page, "workload-prompt") == [{"name": "answered v1", "n": 1}]
    assert chart_traces(page, "workload-output")[0]["n"] >= 1
    assert "characters" in page.inner_text("#workload-units")
    shot(page, "workload-page")
