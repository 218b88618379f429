import asyncio
import threading

import pytest

from localstack.standin import StandinConfig, start_standin_in_thread
from tests import fakes
from workers import engine_metrics, loadgen
from workers.engine_metrics import EngineMetricsError, EngineMetricsSampler

FIXTURES = fakes.FIXTURES / "engine_metrics"


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_it_reads_sglangs_running_queued_and_token_usage():
    parsed = engine_metrics.parse_engine_metrics(_fixture("sglang_single.txt"))
    assert parsed == {"engine": "sglang", "running": 64.0, "queued": 448.0, "kv_cache_usage": 0.41}


def test_it_sums_data_parallel_ranks_and_counts_tp_copies_once():
    parsed = engine_metrics.parse_engine_metrics(_fixture("sglang_dp_all_schedulers.txt"))
    # dp_rank 0 (100 running, seen on tp_rank 0 and 1) + dp_rank 1 (90, on tp_rank 2 and 3)
    assert parsed["running"] == 190.0
    assert parsed["queued"] == 12.0
    assert parsed["kv_cache_usage"] == pytest.approx(0.4)


def test_it_reads_vllm_v1_summed_over_engines():
    parsed = engine_metrics.parse_engine_metrics(_fixture("vllm_v1.txt"))
    # waiting_by_reason repeats the waiting count and must not be added
    assert parsed == {
        "engine": "vllm",
        "running": 50.0,
        "queued": 142.0,
        "kv_cache_usage": pytest.approx(0.8),
    }


def test_it_reads_vllm_v0_gpu_cache_usage():
    parsed = engine_metrics.parse_engine_metrics(_fixture("vllm_v0.txt"))
    assert parsed == {"engine": "vllm", "running": 12.0, "queued": 3.0, "kv_cache_usage": 0.25}


def test_it_prefers_the_aggregate_over_priority_buckets():
    text = (
        'sglang:num_running_reqs{pp_rank="0",priority="",tp_rank="0"} 14.0\n'
        'sglang:num_running_reqs{pp_rank="0",priority="-1",tp_rank="0"} 4.0\n'
        'sglang:num_running_reqs{pp_rank="0",priority="0",tp_rank="0"} 10.0\n'
    )
    assert engine_metrics.parse_engine_metrics(text)["running"] == 14.0


def test_it_leaves_out_what_the_engine_does_not_export():
    parsed = engine_metrics.parse_engine_metrics('vllm:num_requests_running{engine="0"} 3\n')
    assert parsed == {"engine": "vllm", "running": 3.0, "queued": None, "kv_cache_usage": None}
    assert engine_metrics.parse_engine_metrics("process_cpu_seconds_total 1.5\n")["engine"] is None


def test_it_rejects_text_that_is_not_prometheus():
    with pytest.raises(EngineMetricsError):
        engine_metrics.parse_engine_metrics("<html>\n<body>502 Bad Gateway</body>\n")


@pytest.fixture(scope="module")
def standin():
    url, stop = start_standin_in_thread(
        StandinConfig(max_running_requests=4, step_ms_base=5.0, step_ms_per_req=0.0)
    )
    yield url
    stop()


def test_the_sampler_sees_requests_queued_behind_max_running_requests(standin):
    level = loadgen.LevelConfig(concurrency=12, input_len=8, output_len=30, num_prompts=24)
    client = loadgen.ClientConfig(base_url=standin, model="standin", vocab_size=32000)
    with EngineMetricsSampler(standin, interval_s=0.05) as sampler:
        sampler.level_concurrency = 12
        asyncio.run(loadgen.run_level(client, level))
    assert sampler.engine == "standin"
    loaded = [s for s in sampler.samples if s["running"]]
    assert loaded, sampler.samples
    assert max(s["running"] for s in loaded) == 4
    assert max(s["queued"] for s in loaded) > 0
    assert all(s["level_concurrency"] == 12 for s in sampler.samples)
    assert all(0 <= s["kv_cache_usage"] <= 1 for s in sampler.samples)
    assert all(isinstance(s["ts"], float) for s in sampler.samples)


def test_the_sampler_records_no_sample_when_the_engine_is_down(free_port):
    sampler = EngineMetricsSampler(
        f"http://127.0.0.1:{free_port()}", interval_s=0.05, timeout_s=0.5
    )
    sampler.start()
    threading.Event().wait(0.2)
    samples = sampler.stop()
    assert samples == []
    assert sampler.errors["ConnectError"] >= 2
