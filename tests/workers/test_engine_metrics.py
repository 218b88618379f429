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


# -- counters read at a level's start and end


def test_it_reads_vllms_own_token_prefix_cache_and_preemption_counters():
    before = engine_metrics.parse_engine_counters(_fixture("vllm_0.32_cpu_fresh.txt"))
    after = engine_metrics.parse_engine_counters(
        _fixture("vllm_0.32_cpu_after_repeated_prompts.txt")
    )

    assert before["prompt_tokens"] == 0 and before["prefix_cache_queries"] == 0
    assert engine_metrics.counter_deltas(before, after) == {
        "engine": "vllm",
        "prompt_tokens": 640.0,
        "generation_tokens": 32.0,
        "prefix_cache_queries": 640.0,
        "prefix_cache_hits": 384.0,
        "preemptions": 0.0,
    }


def test_it_sums_vllms_spec_decode_counters_over_engines():
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
            "# TYPE vllm:spec_decode_num_draft_tokens counter",
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0',
            'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 100.0',
            "# TYPE vllm:spec_decode_num_accepted_tokens counter",
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 210.0',
            'vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 50.0',
            "",
        ]
    )
    counters = engine_metrics.parse_engine_counters(text)

    assert counters["spec_draft_tokens"] == 400.0
    assert counters["spec_accepted_tokens"] == 260.0


def test_it_reads_sglangs_cached_tokens_retractions_and_ratio_gauges():
    counters = engine_metrics.parse_engine_counters(_fixture("sglang_radix_spec.txt"))

    assert counters == {
        "engine": "sglang",
        "prompt_tokens": 40000.0,
        "generation_tokens": 9000.0,
        "cached_tokens": 24000.0,
        "preemptions": 3.0,
        # one scheduler seen on two tp ranks counts once
        "cache_hit_rate": 0.62,
        "spec_accept_length": 2.75,
    }


def test_a_counter_that_went_back_or_a_failed_read_gives_no_figure():
    before = {"engine": "vllm", "prompt_tokens": 900.0, "generation_tokens": 10.0}
    after = {"engine": "vllm", "prompt_tokens": 100.0, "generation_tokens": 40.0}

    # the engine restarted between the reads: its prompt count started again from 0
    assert engine_metrics.counter_deltas(before, after) == {
        "engine": "vllm",
        "generation_tokens": 30.0,
    }
    assert engine_metrics.counter_deltas(None, after) == {"engine": "vllm"}


def test_an_engine_without_metrics_gives_no_counters(free_port):
    assert engine_metrics.read_engine_counters(f"http://127.0.0.1:{free_port()}") is None
