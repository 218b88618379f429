import json
import subprocess
import sys
import time

import pytest

from tests.fakes import FakeNVML, busy_h200_sample, h200
from workers.telemetry import (
    DETAIL_LIMIT,
    MAX_HZ,
    TelemetrySampler,
    TelemetryUnavailable,
    open_gpus,
)


def test_it_reads_every_field_in_its_unit():
    nvml = FakeNVML([h200(util=97, power_mw=612_345)])
    sampler = TelemetrySampler([0], hz=MAX_HZ, nvml=nvml, clock=lambda: 1700000000.5)
    sampler.level_concurrency = 64
    with sampler:
        time.sleep(0.05)
    first = sampler.drain()[0]
    assert sampler.status == "recorded"
    assert first == busy_h200_sample(1700000000.5, level_concurrency=64)
    assert nvml.inits == nvml.shutdowns == 1


def test_it_samples_only_the_deployment_gpus_at_the_rate_asked():
    nvml = FakeNVML([h200(), h200(), h200(util=50), h200(util=60)])
    sampler = TelemetrySampler([2, 3], hz=10, nvml=nvml).start()
    time.sleep(0.55)
    sampler.stop()
    samples = sampler.drain()
    assert {s["gpu_index"] for s in samples} == {2, 3}
    per_gpu = [s for s in samples if s["gpu_index"] == 2]
    # 10 Hz over 0.55 s: ticks at 0, 0.1, ..., 0.5
    assert 5 <= len(per_gpu) <= 7
    gaps = [b["ts"] - a["ts"] for a, b in zip(per_gpu, per_gpu[1:], strict=False)]
    assert all(0.07 < g < 0.2 for g in gaps)


def test_samples_carry_the_level_running_when_taken():
    sampler = TelemetrySampler([0], hz=10, nvml=FakeNVML([h200()])).start()
    sampler.level_concurrency = 8
    time.sleep(0.25)
    sampler.level_concurrency = 16
    time.sleep(0.25)
    sampler.stop()
    levels = [s["level_concurrency"] for s in sampler.drain()]
    assert levels[0] in (None, 8)
    assert levels[-1] == 16
    assert 8 in levels
    # once the next level is on, no sample is tagged with the previous one
    assert levels.index(16) > max(i for i, c in enumerate(levels) if c == 8)


def test_drain_hands_each_sample_over_once():
    sampler = TelemetrySampler([0], hz=10, nvml=FakeNVML([h200()])).start()
    time.sleep(0.15)
    first = sampler.drain()
    time.sleep(0.15)
    sampler.stop()
    second = sampler.drain()
    assert first and second
    assert first[-1]["ts"] < second[0]["ts"]
    assert sampler.drain() == []


def test_unsupported_readings_are_none_not_zero():
    nvml = FakeNVML([h200()], unsupported={"power_mw", "limit_mw", "temperature"})
    with TelemetrySampler(nvml=nvml) as sampler:
        pass
    sample = sampler.drain()[0]
    assert sample["power_w"] is None
    assert sample["power_limit_w"] is None
    assert sample["temperature_c"] is None
    assert sample["gpu_util"] == 0.0


def test_without_nvml_it_records_no_telemetry_and_says_why():
    nvml = FakeNVML([], init_error="NVML Shared Library Not Found")
    with TelemetrySampler([0], nvml=nvml) as sampler:
        time.sleep(0.05)
    assert sampler.status == "unavailable"
    assert "NVML Shared Library Not Found" in sampler.detail
    assert sampler.drain() == []


def test_a_long_reason_is_cut_to_what_the_api_stores():
    message = "Driver/library version mismatch: " + "x" * 1000
    with TelemetrySampler([0], nvml=FakeNVML([], init_error=message)) as sampler:
        pass
    assert sampler.status == "unavailable"
    assert len(sampler.detail) == DETAIL_LIMIT
    assert sampler.detail.startswith("NVML did not initialise: Driver/library version mismatch")


def test_a_gpu_index_the_host_lacks_makes_telemetry_unavailable():
    nvml = FakeNVML([h200()])
    with pytest.raises(TelemetryUnavailable, match=r"\[3\] not present: NVML sees 1"):
        open_gpus(nvml, [0, 3])
    # NVML is released again when the GPUs cannot be opened
    assert nvml.inits == nvml.shutdowns == 1


def test_it_rejects_rates_above_ten_hz():
    with pytest.raises(ValueError, match="hz"):
        TelemetrySampler(hz=20)


def test_the_command_prints_samples_or_why_there_are_none():
    # this machine has no NVIDIA driver: the command must say so rather than print numbers
    proc = subprocess.run(
        [sys.executable, "-m", "workers.telemetry", "--seconds", "1", "--hz", "2"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode == 0:
        samples = [json.loads(line) for line in proc.stdout.splitlines()]
        assert samples and all("power_w" in s for s in samples)
    else:
        assert proc.returncode == 2
        assert proc.stdout == ""
        assert "telemetry unavailable: NVML did not initialise" in proc.stderr
