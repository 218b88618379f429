"""The load generator against a scripted SSE server whose timing and faults the test controls."""

import asyncio
import json
import math
import re
import threading
import time

import pytest
from aiohttp import web
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from domain import request_log
from localstack.standin import StandinConfig, start_standin_in_thread
from workers import loadgen
from workers.loadgen import ClientConfig, LevelConfig, RequestRecord, SweepConfig
from workers.loadgen import cli as loadgen_cli
from workers.loadgen.metrics import request_columns

# The scripted stream: first content chunk after TTFT_S, then one every GAP_S.
TTFT_S = 0.150
GAP_S = 0.040
CHUNKS = 5


def _event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _text_chunk(text: str) -> bytes:
    return _event({"object": "text_completion", "choices": [{"index": 0, "text": text}]})


def _usage(prompt: int, completion: int) -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return _event({"object": "text_completion", "choices": [], "usage": usage})


class ScriptedServer:
    """aiohttp server in a thread; the first path segment picks the script."""

    def __init__(self):
        self.requests = 0
        self.bodies: list[dict] = []
        # what the server did to each request, on the client's clock (time.perf_counter: the
        # server runs in the test's process): when it took the request and when it handed each
        # content chunk to its transport
        self.timelines: list[dict] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        received = time.perf_counter()
        mode = request.match_info["mode"]
        self.requests += 1
        n = self.requests
        body = await request.json()
        self.bodies.append(body)
        if mode == "http500":
            return web.json_response({"object": "error", "message": "boom"}, status=500)
        if mode == "not_an_engine":
            # what another service on the endpoint's address answers: its own page or JSON
            if n % 2:
                return web.Response(status=403, text="<h1>admin console</h1> token=s3cret")
            return web.json_response({"message": "token=s3cret"}, status=403)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if mode == "garbage":
            await response.write(b"data: {this is not json\n\n")
            await response.write(b"data: [DONE]\n\n")
            return response
        await asyncio.sleep(TTFT_S if mode in ("timed", "nousage") else 0.001)
        if mode == "chat_reasoning":
            for piece in ({"reasoning_content": "hmm"}, {"content": "ok"}):
                chunk = {"object": "chat.completion.chunk", "choices": [{"delta": piece}]}
                await response.write(_event(chunk))
            await response.write(_usage(7, 2) + b"data: [DONE]\n\n")
            return response
        timeline = {"mode": mode, "received": received, "chunks": []}
        self.timelines.append(timeline)
        for i in range(CHUNKS):
            if i:
                await asyncio.sleep(GAP_S if mode in ("timed", "nousage") else 0.001)
            timeline["chunks"].append(time.perf_counter())
            await response.write(_text_chunk(f" t{i}"))
            if mode == "drop_every_20th" and n % 20 == 0 and i == 2:
                request.transport.close()
                return response
            if mode == "stall" and i == 1:
                await asyncio.sleep(5)
        if mode == "nodone":
            await response.write(_usage(len(body["prompt"]), CHUNKS))
            return response
        if mode != "nousage":
            await response.write(_usage(len(body["prompt"]), CHUNKS))
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture(scope="module")
def scripted():
    server = ScriptedServer()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state = {}

    async def start():
        app = web.Application()
        app.router.add_post("/{mode}/v1/completions", server.handle)
        app.router.add_post("/{mode}/v1/chat/completions", server.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        state["port"] = site._server.sockets[0].getsockname()[1]
        started.set()

    def run():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(5)
    server.url = f"http://127.0.0.1:{state['port']}"
    yield server
    asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _level(concurrency=2, num_prompts=4, **kw) -> LevelConfig:
    return LevelConfig(
        concurrency=concurrency, input_len=12, output_len=CHUNKS, num_prompts=num_prompts, **kw
    )


def _client(url: str, **kw) -> ClientConfig:
    kw.setdefault("model", "m")
    kw.setdefault("vocab_size", 32000)
    return ClientConfig(base_url=url, timeout_s=kw.pop("timeout_s", 10.0), **kw)


def _ttft_as_served(requests, served):
    """The server's own figures for the requests (s, each sorted): to its first chunk and to
    its last; after judging the client's TTFTs (request_log columns) by them. Each request's
    TTFT is at least its server's first figure (the client sends before the server takes the
    request and reads a chunk after it is written), so the sorted TTFTs are too; and some
    request's first chunk was read before the server wrote its last: a client that stamped
    the chunks when the body ended would read every request's after its last. (A chunk taken
    for another shows in the count of content chunks.)"""
    assert {t["mode"] for t in served} <= {"timed", "nousage"} and len(served) == len(
        requests["ttft"]
    )
    to_chunk = [sorted(t["chunks"][i] - t["received"] for t in served) for i in (0, -1)]
    first_chunk, whole = to_chunk
    assert min(first_chunk) >= TTFT_S and min(whole) >= TTFT_S + (CHUNKS - 1) * GAP_S
    ttfts = sorted(requests["ttft"])
    # columns are rounded to the µs
    assert all(c >= s - 1e-6 for c, s in zip(ttfts, first_chunk, strict=True)), (ttfts, to_chunk)
    assert any(c < s for c, s in zip(ttfts, whole, strict=True)), (ttfts, to_chunk)
    return to_chunk


@pytest.mark.timing
@pytest.mark.parametrize("transport", ["fast", "httpx"])
def test_it_measures_ttft_tpot_itl_and_throughput_as_scripted(scripted, transport):
    """Each figure against what the server did to the same requests, on the same clock: a busy
    machine delays the client's reads past the server's writes, so it may make a figure larger
    than the script, never smaller than the server's; and a client that stamped a request
    before it had a free stream or stamped chunks when the body ended would be off by whole
    requests or streams in every request, which reads delayed by a busy machine do not imitate
    while any one request is read before its stream ends.
    The requests are compared rank by rank: where each request's figure is at least its own
    server figure, the sorted figures are too."""
    level = _level(concurrency=2, num_prompts=4)
    first = len(scripted.timelines)
    result = asyncio.run(
        loadgen.run_level(_client(scripted.url + "/timed", transport=transport), level)
    )
    served = scripted.timelines[first:]
    assert result["completed"] == 4 and result["failed"] == 0 and len(served) == 4
    assert result["usage_reported"] is True
    assert result["total_input_tokens"] == 4 * 12
    assert result["total_output_tokens"] == 4 * CHUNKS
    assert result["content_chunks"] == 4 * CHUNKS
    requests = result["requests"]
    _, whole = to_chunk = _ttft_as_served(requests, served)
    e2es = sorted(requests["latency"])
    assert all(c >= s - 1e-6 for c, s in zip(e2es, whole, strict=True)), (e2es, to_chunk)
    # chunks stamped as they came: the request read before its last chunk was written spans
    # some time from its first to its last
    spans = [sum(gaps) for gaps in requests["itl"]]
    assert max(spans) > 0, (spans, to_chunk)
    # two streams: the third request went once one of the first two had ended
    starts = sorted(requests["start_time"])
    assert starts[2] >= min(whole) - 1e-6, (starts, to_chunk)
    # each stream sent two requests one after the other
    assert result["duration"] >= 2 * min(whole)
    # the level's figures are its requests' (in ms): TPOT = (E2E - TTFT) / (tokens - 1)
    assert result["mean_ttft_ms"] == pytest.approx(1000 * sum(requests["ttft"]) / 4, abs=1e-3)
    assert result["mean_e2el_ms"] == pytest.approx(1000 * sum(e2es) / 4, abs=1e-3)
    e_t = zip(requests["latency"], requests["ttft"], strict=True)
    tpots = [(e - t) / (CHUNKS - 1) for e, t in e_t]
    assert result["mean_tpot_ms"] == pytest.approx(1000 * sum(tpots) / 4, abs=1e-3)
    assert result["mean_itl_ms"] == pytest.approx(result["mean_tpot_ms"], abs=1e-3)
    assert result["output_throughput"] == pytest.approx(4 * CHUNKS / result["duration"])
    assert result["request_throughput"] == pytest.approx(4 / result["duration"])
    # vLLM counts requests active within a 1 s bucket: both waves fall in the first second
    assert result["max_concurrent_requests"] == 4
    assert result["p99_itl_ms"] >= result["median_itl_ms"]


def test_it_computes_metrics_exactly_from_records():
    # Two requests with hand-picked timestamps (s), 3 chunks each.
    records = [
        RequestRecord(
            send_ts=10.0,
            end_ts=10.5,
            chunk_ts=[10.1, 10.2, 10.4],
            prompt_tokens=8,
            completion_tokens=3,
        ),
        RequestRecord(
            send_ts=10.0,
            end_ts=11.0,
            chunk_ts=[10.3, 10.6, 10.9],
            prompt_tokens=8,
            completion_tokens=3,
        ),
        RequestRecord(send_ts=10.2, end_ts=10.25, error="http_500", detail="boom"),
    ]
    level = LevelConfig(
        concurrency=3, input_len=8, output_len=3, num_prompts=3, slo_ttft_ms=200, slo_tpot_ms=200
    )
    result = loadgen.summarize_level(records, level)
    assert result["duration"] == pytest.approx(1.0)
    assert result["completed"] == 2 and result["failed"] == 1
    assert result["errors"] == {"http_500": 1}
    assert result["mean_ttft_ms"] == pytest.approx(200.0)  # (100 + 300) / 2
    assert result["median_ttft_ms"] == pytest.approx(200.0)
    assert result["std_ttft_ms"] == pytest.approx(100.0)
    # ITL pooled: 100, 200, 300, 300 ms
    assert result["mean_itl_ms"] == pytest.approx(225.0)
    assert result["p90_itl_ms"] == pytest.approx(300.0)
    # TPOT: (0.4-0.1)/2 = 150 ms and (0.9-0.3)/2 = 300 ms
    assert result["mean_tpot_ms"] == pytest.approx(225.0)
    assert result["mean_e2el_ms"] == pytest.approx(650.0)  # 400 and 900
    assert result["output_throughput"] == pytest.approx(6.0)
    assert result["total_token_throughput"] == pytest.approx(22.0)
    assert result["request_throughput"] == pytest.approx(2.0)
    # only the first meets TTFT ≤ 200 ms and TPOT ≤ 200 ms
    assert result["request_goodput"] == pytest.approx(1.0)
    # all six chunks land in second 0 (10.0 … 10.9)
    assert result["max_output_tokens_per_s"] == pytest.approx(6.0)
    assert result["max_concurrent_requests"] == 3


def test_it_counts_dropped_streams_as_failures(scripted):
    level = _level(concurrency=10, num_prompts=100)
    result = asyncio.run(loadgen.run_level(_client(scripted.url + "/drop_every_20th"), level))
    assert result["failed"] == 5
    assert result["errors"] == {"stream_dropped": 5}
    assert result["completed"] == 95
    assert result["total_output_tokens"] == 95 * CHUNKS


def test_it_counts_garbage_sse(scripted):
    result = asyncio.run(loadgen.run_level(_client(scripted.url + "/garbage"), _level()))
    assert result["completed"] == 0
    assert result["errors"] == {"garbage_sse": 4}
    assert "this is not json" in result["error_samples"]["garbage_sse"]
    assert result["mean_ttft_ms"] is None


def test_it_counts_http_errors_and_a_missing_done(scripted):
    errors = asyncio.run(loadgen.run_level(_client(scripted.url + "/http500"), _level()))
    assert errors["errors"] == {"http_500": 4}
    nodone = asyncio.run(loadgen.run_level(_client(scripted.url + "/nodone"), _level()))
    assert nodone["errors"] == {"missing_done": 4}


def test_it_keeps_only_the_status_line_of_an_answer_that_is_no_engines(scripted):
    refused = asyncio.run(loadgen.run_level(_client(scripted.url + "/not_an_engine"), _level()))
    assert refused["errors"] == {"http_403": 4}
    assert refused["error_samples"] == {"http_403": "Forbidden"}
    engine = asyncio.run(loadgen.run_level(_client(scripted.url + "/http500"), _level()))
    assert engine["error_samples"] == {"http_500": "boom"}


def test_it_counts_timeouts_and_refused_connections(scripted, free_port):
    slow = _client(scripted.url + "/stall", timeout_s=0.3)
    result = asyncio.run(loadgen.run_level(slow, _level(concurrency=2, num_prompts=2)))
    assert result["errors"] == {"timeout": 2}
    refused = _client(f"http://127.0.0.1:{free_port()}")
    result = asyncio.run(loadgen.run_level(refused, _level(concurrency=2, num_prompts=2)))
    assert result["errors"] == {"connect_error": 2}


def test_it_says_so_when_the_server_sends_no_usage(scripted):
    first = len(scripted.timelines)
    result = asyncio.run(loadgen.run_level(_client(scripted.url + "/nousage"), _level()))
    assert result["completed"] == 4
    assert result["usage_reported"] is False
    for key in (
        "total_output_tokens",
        "output_throughput",
        "mean_tpot_ms",
        "max_output_tokens_per_s",
    ):
        assert result[key] is None
    # TTFT needs no usage: the requests' own, as the server sent them
    _ttft_as_served(result["requests"], scripted.timelines[first:])
    # columns are rounded to the µs
    ttfts = result["requests"]["ttft"]
    assert result["mean_ttft_ms"] == pytest.approx(1000 * sum(ttfts) / 4, abs=1e-3)
    assert result["content_chunks"] == 4 * CHUNKS


def test_it_starts_ttft_at_the_first_reasoning_chunk(scripted):
    client = _client(scripted.url + "/chat_reasoning", endpoint="chat")
    result = asyncio.run(loadgen.run_level(client, _level(concurrency=1, num_prompts=1)))
    assert result["completed"] == 1 and result["content_chunks"] == 2
    body = scripted.bodies[-1]
    assert body["messages"][0]["role"] == "user"
    assert body["max_completion_tokens"] == CHUNKS and body["stream"] is True


def test_it_asks_for_exact_lengths_usage_and_no_early_stop(scripted):
    client = _client(scripted.url + "/fast", vocab_size=151936)
    asyncio.run(loadgen.run_level(client, _level(concurrency=1, num_prompts=2)))
    first, second = scripted.bodies[-2:]
    assert len(first["prompt"]) == 12 and first["prompt"] != second["prompt"]
    low, high = loadgen.token_id_range(151936)
    assert all(low <= t < high < 151643 for t in first["prompt"])
    assert first["max_tokens"] == CHUNKS
    assert first["ignore_eos"] is True
    assert first["stream_options"] == {"include_usage": True}


def test_it_leaves_warmup_requests_out_of_the_counts(scripted):
    before = scripted.requests
    result = asyncio.run(
        loadgen.run_level(_client(scripted.url + "/fast"), _level(num_prompts=4, warmup=3))
    )
    assert scripted.requests - before == 7
    assert result["completed"] == 4


def test_it_stops_at_a_request_boundary_and_keeps_finished_levels(scripted):
    done = []
    cfg = SweepConfig(
        client=_client(scripted.url + "/fast"),
        concurrencies=(1, 1, 1),
        input_len=12,
        output_len=CHUNKS,
        prompts_per_level=5,
    )

    def progress(level: int, n: int, total: int) -> None:
        done.append((level, n, total))

    results = loadgen.run_sweep(
        cfg, on_progress=progress, should_stop=lambda: any(lv == 1 and n >= 2 for lv, n, _ in done)
    )
    assert len(results) == 1 and results[0]["completed"] == 5
    assert (0, 5, 5) in done and (1, 2, 5) in done and not any(lv == 2 for lv, _, _ in done)


@pytest.mark.timing
def test_it_sends_poisson_arrivals_at_the_request_rate(scripted):
    level = _level(concurrency=50, num_prompts=40, request_rate=40.0)
    result = asyncio.run(loadgen.run_level(_client(scripted.url + "/fast"), level))
    # 40 arrivals at 40 req/s span about one second, not the instant a burst would take
    assert result["completed"] == 40
    assert 0.5 < result["duration"] < 2.0
    assert result["request_rate"] == 40.0
    assert result["achieved_request_rate"] == pytest.approx(40.0, rel=0.1)
    assert result["burstiness"] == 1.0


def test_a_concurrency_cap_holds_a_rate_back_and_the_achieved_rate_says_so(scripted):
    # each request takes ~0.31 s (TTFT + 4 gaps): one stream sends ~3 req/s, far below 50
    level = _level(concurrency=1, num_prompts=6, request_rate=50.0)
    result = asyncio.run(loadgen.run_level(_client(scripted.url + "/timed"), level))

    assert result["completed"] == 6
    assert result["achieved_request_rate"] < 5.0
    # one stream: each request goes when the one before it has ended
    requests = request_log.rows(result["requests"])
    for before, after in zip(requests, requests[1:], strict=False):
        assert after["start_time"] >= before["start_time"] + before["latency"] - 0.005


def test_a_sweep_over_rates_runs_one_level_per_rate_under_the_cap(scripted):
    cfg = SweepConfig(
        client=_client(scripted.url + "/fast"),
        concurrencies=(8,),
        request_rates=(10.0, 40.0),
        burstiness=0.5,
        input_len=12,
        output_len=CHUNKS,
        prompts_per_level=12,
    )

    results = loadgen.run_sweep(cfg)

    assert [(r["concurrency"], r["request_rate"]) for r in results] == [(8, 10.0), (8, 40.0)]
    assert all(r["burstiness"] == 0.5 for r in results)
    assert results[0]["duration"] > results[1]["duration"]


def test_a_level_keeps_each_request_with_vllms_detailed_keys(scripted):
    level = _level(concurrency=2, num_prompts=4)
    served = len(scripted.timelines)
    result = asyncio.run(loadgen.run_level(_client(scripted.url + "/timed"), level))
    requests = request_log.rows(result["requests"])

    assert len(requests) == 4
    _ttft_as_served(result["requests"], scripted.timelines[served:])
    first = requests[0]
    assert first["start_time"] == 0.0 and first["status"] == "ok" and first["error"] is None
    # in seconds, as vLLM keeps them: at least the script, within the client's 10 s timeout
    assert TTFT_S <= first["ttft"] < first["latency"] < 10.0
    assert len(first["itl"]) == CHUNKS - 1 and min(first["itl"]) >= 0
    assert first["latency"] >= TTFT_S + (CHUNKS - 1) * GAP_S
    assert first["latency"] == pytest.approx(first["ttft"] + sum(first["itl"]), abs=1e-5)
    assert (first["input_len"], first["output_len"]) == (12, CHUNKS)
    assert sorted(r["start_time"] for r in requests) == [r["start_time"] for r in requests]
    request_log.check_columns(result["requests"])


def test_a_failed_request_is_kept_with_its_reason(scripted):
    result = asyncio.run(loadgen.run_level(_client(scripted.url + "/http500"), _level()))
    requests = request_log.rows(result["requests"])

    assert [r["status"] for r in requests] == ["failed"] * 4
    assert requests[0]["error_reason"] == "http_500" and requests[0]["error"] == "boom"
    assert requests[0]["ttft"] is None and requests[0]["itl"] is None


def test_the_warm_up_tokens_are_counted_apart(scripted):
    result = asyncio.run(
        loadgen.run_level(_client(scripted.url + "/fast"), _level(num_prompts=2, warmup=3))
    )

    assert result["warmup_tokens"] == {"input_tokens": 3 * 12, "output_tokens": 3 * CHUNKS}
    assert result["total_input_tokens"] == 2 * 12


def test_it_merges_records_from_several_processes():
    url, stop = start_standin_in_thread(
        StandinConfig(max_running_requests=64, step_ms_base=1.0, step_ms_per_req=0.0)
    )
    try:
        level = LevelConfig(concurrency=8, input_len=16, output_len=10, num_prompts=24, processes=2)
        progress = []
        result = asyncio.run(
            loadgen.run_level(
                _client(url, model="standin"),
                level,
                on_request_done=lambda n, total: progress.append((n, total)),
            )
        )
    finally:
        stop()
    assert result["processes"] == 2
    assert result["completed"] == 24 and result["failed"] == 0
    assert result["total_output_tokens"] == 240 and result["total_input_tokens"] == 24 * 16
    assert progress[-1] == (24, 24)
    assert result["client_cpu_s"] > 0
    assert math.isfinite(result["duration"]) and result["duration"] < 10


def test_the_cli_refuses_to_guess_a_vocabulary_the_server_cannot_tell(scripted, capsys):
    argv = ["--base-url", scripted.url + "/fast", "--model", "m", "--concurrency", "1"]

    assert loadgen_cli.main(argv) == 2

    err = capsys.readouterr().err
    assert err.startswith("error: the model's vocabulary is unknown")
    assert "give --tokenizer PATH" in err and "--vocab-size N" in err
    assert "Traceback" not in err


def test_the_cli_takes_the_vocabulary_from_a_tokenizer_file(scripted, tmp_path, capsys):
    vocab = {f"t{i}": i for i in range(300)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="t0"))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    argv = ["--base-url", scripted.url + "/fast", "--model", "m", "--concurrency", "1"]
    argv += ["--prompts-per-level", "2", "--output-len", str(CHUNKS), "--tokenizer", str(tmp_path)]

    assert loadgen_cli.main(argv) == 0

    assert "a vocabulary of 300 (tokenizer" in capsys.readouterr().err


def test_the_cli_writes_vllm_named_results(scripted, tmp_path, capsys):
    out = tmp_path / "levels.json"
    status = loadgen_cli.main(
        [
            "--base-url",
            scripted.url + "/fast",
            "--model",
            "m",
            "--concurrency",
            "1,2",
            "--input-len",
            "12",
            "--output-len",
            str(CHUNKS),
            "--prompts-per-level",
            "3",
            "--vocab-size",
            "32000",
            "--output",
            str(out),
        ]
    )
    assert status == 0
    levels = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    for key in (
        "completed",
        "failed",
        "errors",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "mean_ttft_ms",
        "median_tpot_ms",
        "std_itl_ms",
        "p90_e2el_ms",
        "p95_ttft_ms",
        "p99_itl_ms",
        "usage_reported",
        "input_len",
        "output_len",
        "request_rate",
    ):
        assert key in levels[0], key
    table = capsys.readouterr().out
    assert "TTFT ms" in table and len(table.strip().splitlines()) == 3


def test_the_cli_sweeps_rates_and_saves_every_request(scripted, tmp_path, capsys):
    saved = tmp_path / "requests.jsonl"
    argv = ["--base-url", scripted.url + "/fast", "--model", "m", "--concurrency", "4"]
    argv += ["--request-rate", "20,40", "--burstiness", "2", "--prompts-per-level", "5"]
    argv += ["--output-len", str(CHUNKS), "--vocab-size", "32000", "--save-requests", str(saved)]

    assert loadgen_cli.main(argv) == 0

    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert len(lines) == 10
    assert [line["request_rate"] for line in lines] == [20.0] * 5 + [40.0] * 5
    assert set(lines[0]) == {*request_log.LEVEL_KEYS, *request_log.REQUEST_KEYS}
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert [row.split()[3] for row in rows] == ["20.0", "40.0"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--request-rate", "fast"], "--request-rate: numbers of req/s"),
        (["--request-rate", "0"], "--request-rate: each above 0"),
        (["--burstiness", "0"], "--burstiness: above 0"),
        (["--ramp-up-s", "-1"], "--ramp-up-s: at least 0"),
    ],
)
def test_the_cli_refuses_rates_that_send_nothing(extra, message, capsys):
    argv = ["--base-url", "http://127.0.0.1:9", "--model", "m", "--concurrency", "1", *extra]

    with pytest.raises(SystemExit):
        loadgen_cli.main(argv)

    assert message in capsys.readouterr().err


def test_it_stops_every_client_process_at_a_request_boundary():
    url, stop = start_standin_in_thread(
        StandinConfig(max_running_requests=64, step_ms_base=5.0, step_ms_per_req=0.0)
    )
    done = []
    try:
        level = LevelConfig(concurrency=4, input_len=8, output_len=20, num_prompts=200, processes=2)
        result = asyncio.run(
            loadgen.run_level(
                _client(url, model="standin"),
                level,
                on_request_done=lambda n, total: done.append(n),
                should_stop=lambda: len(done) >= 4,
            )
        )
    finally:
        stop()
    assert result["stopped"] is True
    # requests in flight when the stop came still finish and count
    assert 4 <= result["completed"] < 40 and result["failed"] == 0


def test_the_cli_runs_each_level_in_rounds_and_prints_the_median_and_interval(
    scripted, tmp_path, capsys
):
    out = tmp_path / "levels.json"
    argv = ["--base-url", scripted.url + "/fast", "--model", "m", "--concurrency", "1,2"]
    argv += ["--prompts-per-level", "2", "--output-len", str(CHUNKS), "--vocab-size", "32000"]
    argv += ["--rounds", "3", "--seed", "40", "--output", str(out)]

    assert loadgen_cli.main(argv) == 0

    levels = json.loads(out.read_text())
    assert [(lv["concurrency"], lv["round"]) for lv in levels] == [
        (1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3),
    ]  # fmt: skip
    # each round its own prompts, its seed in the file
    assert [lv["seed"] for lv in levels] == [40, 41, 42, 40, 41, 42]
    printed = capsys.readouterr().out
    assert printed.count("median of 3 rounds") == 2
    assert printed.count("95 % interval: out tok/s ") == 2


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--rounds", "0", "--rounds: from 1 to 10, got 0"),
        ("--seed", "-1", "--seed: from 0 to 2147483647, got -1"),
    ],
)
def test_the_cli_refuses_a_number_out_of_bounds(capsys, flag, value, said):
    with pytest.raises(SystemExit) as exited:
        loadgen_cli.main(
            ["--base-url", "http://x", "--model", "m", "--concurrency", "1", flag, value]
        )
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_the_cli_draws_new_prompts_each_run_and_prints_the_seed_that_sends_them_again(
    scripted, capsys
):
    argv = ["--base-url", scripted.url + "/fast", "--model", "m", "--concurrency", "1"]
    argv += ["--prompts-per-level", "2", "--output-len", str(CHUNKS), "--vocab-size", "32000"]
    prompts, seeds = [], []
    for extra in ([], [], None):
        if extra is None:  # the first run's seed given back
            extra = ["--seed", str(seeds[0])]
        scripted.bodies.clear()
        assert loadgen_cli.main(argv + extra) == 0
        seeds.append(int(re.search(r"--seed (\d+) sends them again", capsys.readouterr().err)[1]))
        prompts.append([body["prompt"] for body in scripted.bodies])
    assert seeds[0] != seeds[1] and prompts[0] != prompts[1]
    assert seeds[2] == seeds[0] and prompts[2] == prompts[0]


def test_an_imported_logs_figures_are_those_the_load_generator_computed_from_its_records():
    # the log keeps each request's send, chunks and end; a stream ends with its last chunk here
    records = [
        RequestRecord(10.0, 10.4, [10.1, 10.2, 10.4], prompt_tokens=8, completion_tokens=3),
        RequestRecord(10.0, 11.9, [10.3, 10.6, 11.9], prompt_tokens=9, completion_tokens=4),
        RequestRecord(10.5, 12.1, [10.9, 11.2, 12.1], prompt_tokens=7, completion_tokens=3),
        RequestRecord(10.2, 10.25, error="http_500", detail="boom"),
    ]
    level = LevelConfig(concurrency=3, input_len=8, output_len=3, num_prompts=4)

    measured = loadgen.summarize_level(records, level)
    from_log = request_log.level_figures(request_columns(records))

    assert from_log["completed"] == 3 and from_log["usage_reported"] is True
    for key, value in from_log.items():
        expected = measured[key]
        assert value == (pytest.approx(expected, abs=1e-3) if expected else expected), key
