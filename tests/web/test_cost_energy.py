"""Cost per million output tokens and energy per output token at each level: from a known price
and known power samples, the exact figures on the run page and in its CSV; absent with the
reason where the price or the samples are missing; a bad price refused naming the field."""

import csv
import io
from decimal import Decimal

import pytest
from django.contrib.auth.models import User

from moeops.api.models import ApiToken
from moeops.front.columns import ABSENT
from moeops.runs.costs import level_costs
from moeops.runs.samples import TelemetrySample
from tests import page_base as pb
from tests.api_base import ApiClient, make_world

pytestmark = pytest.mark.django_db

T0 = 1_780_000_000.0
# two levels of 60 s each, 30 s apart; the samples between them are of neither
LEVELS = [
    {
        "concurrency": 8,
        "output_throughput": 2000.0,
        "completed": 64,
        "started_at": T0,
        "finished_at": T0 + 60,
    },
    {
        "concurrency": 16,
        "output_throughput": 3000.0,
        "completed": 128,
        "started_at": T0 + 90,
        "finished_at": T0 + 150,
    },
]


def _power(gpu, t):
    """W of one GPU at epoch t: 300 + 10 × index in the first level, 400 + 10 × index in the
    second, 1,000 between them (outside every level)."""
    if t <= T0 + 60:
        return 300.0 + 10 * gpu
    if t >= T0 + 90:
        return 400.0 + 10 * gpu
    return 1000.0


@pytest.fixture
def priced_run():
    host = pb.host(gpus=8)
    host.price_per_gpu_hour, host.currency = Decimal("2.5"), "USD"
    host.save()
    run = pb.run(pb.deployment(host_row=host), levels=LEVELS, telemetry_status="recorded")
    TelemetrySample.objects.bulk_create(
        TelemetrySample(run=run, gpu_index=g, ts=T0 + s, power_w=_power(g, T0 + s))
        for s in range(151)
        for g in range(8)
    )
    pb.samples_summed(run)
    return run


# total W: 8 × 300 + 10 × (0 + … + 7) = 2,680 in the first level, 3,480 in the second
FIRST_J = 2680.0 / 2000.0
SECOND_J = 3480.0 / 3000.0
# 8 GPUs × 2.5 USD/h = 20 USD/h over 2,000 tok/s × 3,600 s = 7.2 M tokens
FIRST_COST = 20 / 7.2
SECOND_COST = 20 / 10.8


def test_it_computes_each_levels_cost_and_energy_from_its_window(priced_run):
    costs = level_costs(priced_run, list(priced_run.levels.all()), 8)
    first, second = costs["c=8,r=inf"], costs["c=16,r=inf"]
    assert first.energy.value == pytest.approx(FIRST_J, rel=1e-12)
    assert second.energy.value == pytest.approx(SECOND_J, rel=1e-12)
    assert first.cost.value == pytest.approx(FIRST_COST, rel=1e-12)
    assert second.cost.value == pytest.approx(SECOND_COST, rel=1e-12)
    assert first.cost.unit == "USD per 1M output tokens"


def test_the_levels_csv_holds_the_exact_figures(client, priced_run):
    pb.sign_in(client)
    body = client.get(f"/runs/{priced_run.uuid}/levels.csv").content.decode()
    rows = list(csv.DictReader(io.StringIO(body)))
    cost = "cost_per_million_output_tokens (USD per 1M output tokens)"
    energy = "energy_per_output_token (J)"
    assert [float(r[cost]) for r in rows] == pytest.approx([FIRST_COST, SECOND_COST])
    assert [float(r[energy]) for r in rows] == pytest.approx([FIRST_J, SECOND_J])
    assert {r["cost_absent_because"] for r in rows} == {""}


def test_the_run_page_shows_the_two_columns(client, priced_run):
    pb.sign_in(client)
    page = client.get(f"/runs/{priced_run.uuid}/").content.decode()
    assert "USD per 1M output tokens" in page and "energy per output token" in page
    assert f"{FIRST_COST:,.2f}" in page and f"{FIRST_J:,.3f}" in page


def test_without_a_price_or_samples_the_figures_are_absent_with_the_reason(client):
    run = pb.run(pb.deployment(), levels=LEVELS[:1], telemetry_status="unavailable")
    run.telemetry_detail = "NVML could not be loaded"
    run.save()
    cost = level_costs(run, list(run.levels.all()), 8)["c=8,r=inf"]
    assert (cost.cost.value, cost.cost.reason) == (None, "the host has no price per GPU-hour")
    assert cost.energy.value is None
    assert cost.energy.reason == "no GPU power samples for this run (NVML could not be loaded)"
    pb.sign_in(client)
    page = client.get(f"/runs/{run.uuid}/").content.decode()
    assert "No cost (n/a): the host has no price per GPU-hour." in page
    assert "No energy per output token (n/a): no GPU power samples for this run" in page
    body = client.get(f"/runs/{run.uuid}/levels.csv").content.decode()
    (row,) = csv.DictReader(io.StringIO(body))
    assert row["cost_per_million_output_tokens (per 1M output tokens)"] == ""
    assert row["cost_absent_because"] == "the host has no price per GPU-hour"
    assert row["energy_absent_because"].startswith("no GPU power samples")
    assert ABSENT not in body


@pytest.mark.parametrize(
    ("price", "words"),
    [
        ("NaN", "price_per_gpu_hour"),
        (-1, "price_per_gpu_hour"),
        ("two dollars", "price_per_gpu_hour"),
        (int("9" * 400), "price_per_gpu_hour"),
    ],
)
def test_the_api_refuses_a_bad_price_naming_the_field(price, words):
    world = make_world()
    response = world.owner.patch(
        f"/api/v1/hosts/{world.host.name}", {"price_per_gpu_hour": price, "currency": "USD"}
    )
    assert 400 <= response.status_code < 500, response.content
    assert words in response.content.decode()
    world.host.refresh_from_db()
    assert world.host.price_per_gpu_hour is None


def test_the_api_sets_a_price_and_refuses_one_without_its_currency():
    world = make_world()
    path = f"/api/v1/hosts/{world.host.name}"
    response = world.owner.patch(path, {"price_per_gpu_hour": 12})
    assert response.status_code == 400 and "currency" in response.json()["detail"]
    response = world.owner.patch(path, {"currency": "usd", "price_per_gpu_hour": 2.5})
    assert response.status_code == 400 and "currency" in response.json()["detail"]
    response = world.owner.patch(path, {"price_per_gpu_hour": "2.5", "currency": "USD"})
    assert response.status_code == 200, response.content
    assert response.json()["price_per_gpu_hour"] == 2.5
    assert world.owner.get(path).json()["currency"] == "USD"
    assert world.host_worker.patch(path, {"currency": "EUR"}).status_code == 200
    assert world.read_only.patch(path, {"currency": "EUR"}).status_code == 403


@pytest.mark.parametrize("price", ["NaN", "-1", "abc", "9" * 400])
def test_the_admin_refuses_a_bad_price_naming_the_field(client, price):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    host = pb.host(gpus=0)
    response = client.post(
        f"/admin/fleet/host/{host.pk}/change/",
        {
            "name": host.name,
            "description": "",
            "provenance": "",
            "worker_status": "{}",
            "price_per_gpu_hour": price,
            "currency": "USD",
            "gpus-TOTAL_FORMS": "0",
            "gpus-INITIAL_FORMS": "0",
            "gpus-MIN_NUM_FORMS": "0",
            "gpus-MAX_NUM_FORMS": "1000",
        },
    )
    assert response.status_code == 200  # the form again, with the error
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["price_per_gpu_hour"], errors
    host.refresh_from_db()
    assert host.price_per_gpu_hour is None


def test_the_api_lists_each_levels_cost_and_energy(priced_run):
    _, token = ApiToken.issue(name="viewer", read_only=True)
    levels = ApiClient(token).get(f"/api/v1/runs/{priced_run.uuid}/levels").json()
    first = levels[0]
    assert first["cost_per_million_output_tokens"]["value"] == pytest.approx(FIRST_COST)
    assert first["cost_per_million_output_tokens"]["unit"] == "USD per 1M output tokens"
    assert first["energy_per_output_token"] == {
        "value": pytest.approx(FIRST_J),
        "unit": "J",
        "absent_because": "",
    }


def test_the_api_says_why_a_levels_figures_are_absent():
    world = make_world()
    run = world.run(status="succeeded", telemetry_status="not_collected")
    pb.LevelResult.objects.create(run=run, key="c=8,r=inf", concurrency=8, output_throughput=9.0)
    (level,) = world.read_only.get(f"/api/v1/runs/{run.uuid}/levels").json()
    assert level["cost_per_million_output_tokens"]["value"] is None
    assert level["cost_per_million_output_tokens"]["absent_because"] == (
        "the host has no price per GPU-hour"
    )
    assert level["energy_per_output_token"]["absent_because"] == (
        "no GPU power samples for this run (not collected)"
    )


def test_the_host_page_shows_the_price_or_that_there_is_none(client):
    host = pb.host(gpus=1)
    pb.sign_in(client)
    assert "no price per GPU-hour" in client.get(f"/hosts/{host.name}/").content.decode()
    host.price_per_gpu_hour, host.currency = Decimal("3.1"), "EUR"
    host.save()
    assert "3.10 EUR per GPU-hour" in client.get(f"/hosts/{host.name}/").content.decode()
