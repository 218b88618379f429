"""`workers.telemetry.read_gpus_now`: every GPU read once through NVML, or why not, and the
reading pushed by the worker's client into the host's GPU readings."""

import sys

import pytest

from moeops.fleet.models import GPUReading
from tests.fakes import FakeNVML, busy_h200_sample, h200
from workers.telemetry import DETAIL_LIMIT, read_gpus_now


def test_it_reads_every_gpu_once_in_its_units():
    nvml = FakeNVML([h200(util=97, power_mw=612_345), h200(util=4)])
    reading = read_gpus_now(nvml, clock=lambda: 1_780_000_000.5)
    assert (reading["status"], reading["detail"]) == ("recorded", "")
    assert reading["taken_at"] == 1_780_000_000.5
    first, second = reading["gpus"]
    assert first == busy_h200_sample(1_780_000_000.5)
    assert (second["gpu_index"], second["gpu_util"]) == (1, 4.0)
    assert nvml.inits == nvml.shutdowns == 1


def test_a_reading_nvml_does_not_support_is_none():
    reading = read_gpus_now(FakeNVML([h200()], unsupported={"power_mw", "temperature"}))
    [gpu] = reading["gpus"]
    assert gpu["power_w"] is None and gpu["temperature_c"] is None
    assert gpu["power_limit_w"] == 700.0


def test_without_pynvml_it_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    reading = read_gpus_now()
    assert (reading["status"], reading["gpus"]) == ("unavailable", [])
    assert reading["detail"].startswith("pynvml is not installed")


@pytest.mark.parametrize(
    ("nvml", "detail"),
    [
        (
            FakeNVML([], init_error="Driver Not Loaded"),
            "NVML did not initialise: Driver Not Loaded",
        ),
        (FakeNVML([]), "NVML sees no GPU"),
    ],
)
def test_without_a_driver_or_a_gpu_it_says_why(nvml, detail):
    reading = read_gpus_now(nvml, clock=lambda: 1_780_000_000.0)
    assert reading == {
        "status": "unavailable",
        "detail": detail,
        "taken_at": 1_780_000_000.0,
        "gpus": [],
    }


def test_a_long_reason_is_cut_to_what_the_api_stores():
    reading = read_gpus_now(FakeNVML([], init_error="x" * 1000))
    assert len(reading["detail"]) == DETAIL_LIMIT


def test_the_workers_client_pushes_the_reading_into_the_hosts_history(tune_client):
    host, client = tune_client
    nvml = FakeNVML([h200(util=97, power_mw=612_345), h200(util=3)])
    reading = read_gpus_now(nvml, clock=lambda: 1_780_000_000.0)
    answer = client.post_gpu_reading(host.name, reading)
    assert answer["status"] == "recorded" and answer["host"] == "h200"
    stored = GPUReading.objects.get()
    assert (stored.status, stored.taken_at.timestamp()) == ("recorded", 1_780_000_000.0)
    assert [(g["gpu_index"], g["gpu_util"], g["power_w"]) for g in stored.gpus] == [
        (0, 97.0, 612.345),
        (1, 3.0, 85.0),
    ]
    assert stored.gpus[0]["mem_total_mib"] == 143_771.0

    unavailable = read_gpus_now(FakeNVML([], init_error="Driver Not Loaded"))
    client.post_gpu_reading(host.name, unavailable)
    latest = host.gpu_readings.first()
    assert (latest.status, latest.detail) == ("unavailable", unavailable["detail"])
