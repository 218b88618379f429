import json
import re

import pytest
from django.contrib.auth.models import User

from moeops.examples import load_example_data
from moeops.insights.services import run_analyze

pytestmark = pytest.mark.django_db


@pytest.fixture
def member(client):
    user = User.objects.create_user("alice", password="pw-alice-123")
    client.force_login(user)
    return user


def _figure(html, element_id):
    match = re.search(
        rf'<script id="{element_id}" type="application/json">(.*?)</script>', html, re.S
    )
    return json.loads(match.group(1))


def test_it_requires_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_it_lists_deployments_with_peak_throughput(client, member):
    load_example_data()
    html = client.get("/").content.decode()
    assert "GLM-5-NVFP4 on 8× RTX PRO 6000" in html
    assert "912" in html  # peak of the write-up's sweep
    assert "5,800" in html  # Kimi K2 after tuning, its latest run


def test_deployment_page_charts_each_run(client, member):
    deployment = load_example_data()
    run_analyze(run=deployment.runs.get(label="Concurrency sweep (write-up)"))
    response = client.get(f"/deployments/{deployment.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    fig = _figure(html, "throughput-figure")
    assert [trace["x"] for trace in fig["data"]] == [[128, 256, 512]]
    assert fig["data"][0]["y"] == [806.0, 879.0, 912.0]
    # plotly (4.8 MB) and the scripts drawing with it are deferred: the page shows before they
    # load, and they run in order once it is parsed
    scripts = re.findall(r"<script[^>]*\bsrc=[^>]*>", html)
    assert any("plotly/plotly.min.js" in tag for tag in scripts)
    assert scripts and all(tag.startswith("<script defer src=") for tag in scripts), scripts
    assert "SGLang 0.5.23 runs no all-reduce + RMSNorm fusion on compute capability 12.0" in html
    assert "E=256, N=256" in html  # per-rank shape at TP8


def test_plotly_is_served_from_the_installed_package(client, member):
    response = client.get("/static/plotly/plotly.min.js")
    assert response.status_code == 200
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert b"plotly" in body[:2000].lower()


def test_unknown_deployment_is_404(client, member):
    assert client.get("/deployments/999999/").status_code == 404
