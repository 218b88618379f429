import json

import pytest

from moeops.runs.importers import ResultFileError, parse_results
from tests.fakes import FIXTURES

RESULTS = FIXTURES / "results"
SGLANG_AGG = "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl"
SGLANG_PD = "TonyLi15-sglang-benchmark__pd_1p2d_n100_in512_out128_c64.jsonl"


def _levels(name, fmt):
    return parse_results((RESULTS / name).read_text(), fmt)


def test_it_reads_the_real_sglang_file():
    [level] = _levels(SGLANG_AGG, "sglang")
    assert level["concurrency"] == 8
    assert level["request_rate"] is None
    assert level["input_len"] == 128 and level["output_len"] == 64
    assert level["completed"] == 50
    assert level["duration"] == pytest.approx(1.9711186867207289)
    assert level["total_input_tokens"] == 3019
    assert level["total_output_tokens"] == 1401
    assert level["request_throughput"] == pytest.approx(25.36630611684931)
    assert level["output_throughput"] == pytest.approx(710.7638973941176)
    assert level["total_token_throughput"] == pytest.approx(2242.381460729479)
    assert level["mean_ttft_ms"] == pytest.approx(115.28786353766918)
    assert level["median_ttft_ms"] == pytest.approx(33.528951462358236)
    assert level["p99_ttft_ms"] == pytest.approx(599.2950061988086)
    assert level["median_tpot_ms"] == pytest.approx(6.960440116624038)
    assert level["p95_itl_ms"] == pytest.approx(21.319825435057282)
    assert level["mean_e2el_ms"] == pytest.approx(306.8716875091195)
    assert level["p99_e2el_ms"] == pytest.approx(973.2989947218446)
    assert level.get("p90_ttft_ms") is None


def test_it_keeps_the_whole_sglang_object_with_unknown_keys():
    [level] = _levels(SGLANG_AGG, "sglang")
    raw = level["raw"]
    assert raw["server_info"]["version"] == "0.5.5.post3"
    assert raw["tag"] == "agg_n50_in128_out64_c8"
    assert raw["concurrency"] == pytest.approx(7.784201163950447)
    assert "accept_length" in raw
    # jsonb has no Infinity: the word the file used is kept
    assert raw["request_rate"] == "Infinity"
    json.dumps(raw, allow_nan=False)


def test_it_reads_the_disaggregated_sglang_run():
    [level] = _levels(SGLANG_PD, "sglang")
    assert level["concurrency"] == 64
    assert level["output_throughput"] == pytest.approx(657.7236502614013)
    assert level["mean_ttft_ms"] == pytest.approx(4556.037710709497)
    assert level["median_e2el_ms"] == pytest.approx(6038.302134722471)


def test_it_reads_the_2024_sglang_key_names():
    limited, unlimited = _levels("sglang_bench_serving_2024.jsonl", "sglang")
    assert limited["request_rate"] == 4.0 and unlimited["request_rate"] is None
    assert limited["concurrency"] is None
    assert limited["duration"] == 252.5
    assert limited["output_throughput"] == pytest.approx(131072 / 252.5)
    assert limited["total_input_tokens"] == 524288
    assert limited["total_output_tokens"] == 131072
    assert limited["median_ttft_ms"] == 312.25
    assert limited["median_itl_ms"] == 22.5
    assert limited["mean_e2el_ms"] == 11875.5
    assert limited.get("request_throughput") is None
    assert [level["line"] for level in (limited, unlimited)] == [1, 2]


def test_it_reads_vllm_bench_serve():
    [level] = _levels("vllm_bench_serve_0.11.json", "vllm")
    assert level["concurrency"] == 128
    assert level["request_rate"] is None
    assert level["completed"] == 1276 and level["failed"] == 4
    assert level["output_throughput"] == pytest.approx(164608 / 204.1875)
    assert level["total_token_throughput"] == pytest.approx((1306624 + 164608) / 204.1875)
    assert level["max_output_tokens_per_s"] == 1024.0
    assert level["max_concurrent_requests"] == 128
    assert level["mean_ttft_ms"] == 2875.5
    assert level["p99_tpot_ms"] == pytest.approx(137.75 + 12.5 * 2.6)
    assert level["raw"]["model_id"] == "zai-org/GLM-5-FP8"


def test_it_reads_appended_vllm_results_as_levels():
    levels = _levels("vllm_bench_serve_append.jsonl", "vllm")
    assert [level["concurrency"] for level in levels] == [32, 64]
    assert levels[1]["output_throughput"] == pytest.approx(81920 / 120.5)


def test_it_reads_vllm_0_6_with_per_request_arrays():
    [level] = _levels("vllm_benchmark_serving_0.6.json", "vllm")
    assert level["request_rate"] == 4.0
    assert level["concurrency"] is None
    assert level["errors"] == {"Response payload is not completed": 1}
    assert level["request_throughput"] == pytest.approx(2.0)
    # the per-request lists become the level's requests, out of its raw
    assert "ttfts" not in level["raw"] and "generated_texts" not in level["raw"]
    requests = level["requests"]
    assert len(requests["status"]) == 8 and requests["ttft"][0] == 0.21
    assert requests["itl"][0] == [0.011, 0.012]
    assert requests["status"].count("failed") == 1 == level["failed"]


def test_it_reads_vllm_0_4_0_misspelled_request_throughput():
    [level] = _levels("vllm_benchmark_serving_0.4.0.json", "vllm")
    assert level["request_throughput"] == pytest.approx(1000 / 151.25)
    assert level["output_throughput"] == pytest.approx(198343 / 151.25)
    assert level["median_tpot_ms"] == 87.25
    assert level.get("total_token_throughput") is None
    assert level["failed"] == 0


def test_it_reads_a_pretty_printed_vllm_file():
    text = json.dumps(json.loads((RESULTS / "vllm_bench_serve_0.11.json").read_text()), indent=4)
    [level] = parse_results(text, "vllm")
    assert level["concurrency"] == 128


def test_it_lists_every_bad_line():
    with pytest.raises(ResultFileError) as caught:
        _levels("sglang_broken.jsonl", "sglang")
    problems = caught.value.problems
    assert len(problems) == 2
    assert problems[0].startswith("line 2: not JSON")
    assert problems[1].startswith("line 3: lacks the throughput keys")


def test_it_rejects_a_repeated_level():
    line = (RESULTS / SGLANG_AGG).read_text().strip()
    with pytest.raises(ResultFileError, match=r"line 2: repeats the level of line 1 \(c=8,r=inf\)"):
        parse_results(f"{line}\n{line}\n", "sglang")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "the file holds no results"),
        ("[1, 2]\n", "line 1: not a JSON object"),
        ('{"output_throughput": "fast"}\n', "line 1: output_throughput is not a number"),
        ('{"output_throughput": 5, "completed": -1}\n', "line 1: completed is not a count"),
        ('{"output_throughput": 5, "max_concurrency": 1.5}\n', "max_concurrency is not an integer"),
        ('{"output_throughput": 5, "tag": "a\\u0000b"}\n', "line 1: tag: must not contain the NUL"),
        ('{"output_throughput": 5, "x": {"\\ud800": 1}}\n', "line 1: x: must be valid Unicode"),
    ],
)
def test_it_rejects_bad_objects(text, problem):
    with pytest.raises(ResultFileError, match=problem):
        parse_results(text, "sglang")


def test_it_rejects_an_unknown_format():
    with pytest.raises(ResultFileError, match="format must be one of sglang, vllm"):
        parse_results("{}", "trtllm")


def test_it_rejects_level_metrics_no_level_can_have():
    [obj] = [json.loads(line) for line in (RESULTS / SGLANG_AGG).read_text().splitlines()]
    bad = [
        {**obj, "output_throughput": -500},
        {**obj, "max_concurrency": 16, "duration": -3},
        {**obj, "max_concurrency": 32, "mean_ttft_ms": 1e308},
    ]
    with pytest.raises(ResultFileError) as caught:
        parse_results("\n".join(json.dumps(o) for o in bad), "sglang")
    assert caught.value.problems == [
        "line 1: output_throughput must be at least 0, got -500.0",
        "line 2: duration must be at least 0, got -3.0",
        "line 3: mean_ttft_ms must be at most 1e+09, got 1e+308",
    ]
