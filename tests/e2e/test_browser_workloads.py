"""Workloads in the browser (headless Chromium, Playwright, a live server): the sweep form shows
a file's answer lengths in place of its pre-filled output length, and a workload's page draws its
length histograms."""

import pytest
from django.contrib.auth.models import User

from moeops.examples import load_standin_deployment
from moeops.fleet.services import health_check_record
from moeops.runs.workloads import workload_store
from tests.browser import PASSWORD, chart_traces, log_in, shot

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
    log_in(page, member)
    page.goto(page.base + deployment.get_absolute_url())
    page.click("summary:has-text('Run sweep')")
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
