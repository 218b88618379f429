"""Driving a level: in this process (asyncio), or shared out over several processes for the
highest concurrencies; and the public entry points, run_level and run_sweep."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from domain.traces import trace_offsets_s
from workers.loadgen.arrivals import arrival_offsets
from workers.loadgen.config import (
    ENDPOINT_PATHS,
    TRANSPORTS,
    ClientConfig,
    LevelConfig,
    OnRequestDone,
    RequestRecord,
    ShouldStop,
    SweepConfig,
)
from workers.loadgen.metrics import request_columns, summarize_level, ttft_by_turn
from workers.loadgen.prompts import (
    conversation,
    conversation_start,
    is_multi_turn,
    is_trace,
    requests_of,
)
from workers.loadgen.stream import build_payload, send_request
from workers.loadgen.transport import make_client

# ---------------------------------------------------------------------------------------------
# Driving a level in one process
# ---------------------------------------------------------------------------------------------


def _request_headers(client_cfg: ClientConfig) -> dict:
    # identity: the timestamps and the SSE parser read raw bytes, never a compressed body.
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    if client_cfg.api_key:
        headers["Authorization"] = f"Bearer {client_cfg.api_key}"
    return headers


async def _converse(
    client,
    url: str,
    headers: dict,
    client_cfg: ClientConfig,
    level: LevelConfig,
    key: tuple[int, ...],
    report: Callable[[RequestRecord], None],
    should_stop: ShouldStop,
) -> None:
    """One multi-turn conversation on the chat endpoint: each turn sends the history (every
    question and answer so far) and a new question, after the workload's think time. A failed
    turn ends the conversation: the next one would have no answer to send back."""
    spec = client_cfg.workload["spec"]
    history: list[dict] = conversation_start(client_cfg, level, key)
    for turn, (question, output_len) in enumerate(conversation(client_cfg, level, key), 1):
        if turn > 1:
            if spec["think_time_s"]:
                await asyncio.sleep(spec["think_time_s"])
            if should_stop():
                return
        history.append({"role": "user", "content": question})
        body = build_payload(client_cfg, level, key, messages=history, output_len=output_len)
        answer: list[str] = []
        record = await send_request(client, url, body, headers, client_cfg.timeout_s, answer)
        record.turn = turn
        report(record)
        if record.error is not None:
            return
        history.append({"role": "assistant", "content": "".join(answer)})


async def _drive(
    client_cfg: ClientConfig,
    level: LevelConfig,
    indices: list[int],
    *,
    concurrency: int,
    warmup: int,
    request_rate: float | None,
    arrival_seed: tuple[int, ...],
    on_record: Callable[[RequestRecord], None],
    should_stop: ShouldStop,
) -> tuple[int, dict]:
    """Send warmup requests, then one request per index with at most concurrency in flight,
    at request_rate (req/s; the level's burstiness and ramp-up) when one is given (a
    multi-turn workload: one conversation per index, its turns one after the other); a
    trace's request i at its timestamp divided by the spec's speed, from the level's start,
    each record noting when it was due (scheduled_ts).

    Returns how many measured requests (conversations) were started (fewer than len(indices)
    after a stop) and the warm-up's token counts as the server's usage gave them
    ({"input_tokens", "output_tokens"}): the engine's own counters count the warm-up too.
    """
    multi_turn = is_multi_turn(client_cfg)
    trace = is_trace(client_cfg)
    url = client_cfg.base_url.rstrip("/") + ENDPOINT_PATHS[client_cfg.endpoint]
    headers = _request_headers(client_cfg)
    async with make_client(client_cfg) as client:

        async def run_all(keys: list[tuple[int, ...]], report, offsets) -> int:
            position = 0
            sent = 0
            # a trace's bodies are built before its clock starts: building one while another
            # is due would make that one late by the building, not by the engine
            bodies = None
            if trace and not multi_turn:
                bodies = [build_payload(client_cfg, level, key) for key in keys]
            start = time.perf_counter()

            async def stream_worker() -> None:
                nonlocal position, sent
                while position < len(keys) and not should_stop():
                    mine = position
                    position += 1
                    # built before the wait: a request due now goes now
                    if bodies is not None:
                        body = bodies[mine]
                    else:
                        body = None if multi_turn else build_payload(client_cfg, level, keys[mine])
                    due = None
                    if offsets is not None:
                        due = start + float(offsets[mine])
                        delay = due - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                            if should_stop():
                                return
                    sent += 1
                    if multi_turn:
                        await _converse(
                            client, url, headers, client_cfg, level, keys[mine], report, should_stop
                        )
                        continue
                    record = await send_request(client, url, body, headers, client_cfg.timeout_s)
                    if trace:
                        record.scheduled_ts = due
                    report(record)

            workers = min(concurrency, len(keys))
            await asyncio.gather(*(stream_worker() for _ in range(workers)))
            return sent

        warmup_tokens = {"input_tokens": 0, "output_tokens": 0}

        def count_warmup(record: RequestRecord) -> None:
            warmup_tokens["input_tokens"] += record.prompt_tokens or 0
            warmup_tokens["output_tokens"] += record.completion_tokens or 0

        if warmup:
            await run_all([(1, j) for j in range(warmup)], count_warmup, None)
        offsets = None
        if trace:
            # the trace's own times, from its first request: every process of the level
            # keeps the same clock for its share of the requests
            times = trace_offsets_s(
                client_cfg.workload["items"], client_cfg.workload["spec"]["speed"]
            )
            offsets = np.array([times[i] for i in indices])
        elif request_rate:
            offsets = arrival_offsets(
                len(indices),
                request_rate,
                burstiness=level.burstiness,
                ramp_up_s=level.ramp_up_s,
                rng=np.random.default_rng((client_cfg.seed, level.index, *arrival_seed)),
            )
        sent = await run_all([(0, i) for i in indices], on_record, offsets)
        return sent, warmup_tokens


async def _run_in_process(
    client_cfg: ClientConfig,
    level: LevelConfig,
    on_request_done: OnRequestDone | None,
    should_stop: ShouldStop,
) -> tuple[list[RequestRecord], bool, dict]:
    records: list[RequestRecord] = []
    total = requests_of(client_cfg, level, [(0, i) for i in range(level.num_prompts)])

    def on_record(record: RequestRecord) -> None:
        records.append(record)
        if on_request_done is not None:
            on_request_done(len(records), total)

    sent, warmup_tokens = await _drive(
        client_cfg,
        level,
        list(range(level.num_prompts)),
        concurrency=level.concurrency,
        warmup=level.warmup,
        request_rate=level.request_rate,
        arrival_seed=(0,),
        on_record=on_record,
        should_stop=should_stop,
    )
    return records, sent < level.num_prompts, warmup_tokens


# ---------------------------------------------------------------------------------------------
# Driving a level over several processes
# ---------------------------------------------------------------------------------------------


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def _shard_specs(client_cfg: ClientConfig, level: LevelConfig) -> list[dict]:
    """One spec per process: its share of streams, prompts, warmup and arrival rate."""
    parts = max(1, min(level.processes, level.concurrency))
    streams = _split(level.concurrency, parts)
    warmups = _split(level.warmup, parts)
    return [
        {
            "client": asdict(client_cfg),
            "level": asdict(level),
            "indices": list(range(k, level.num_prompts, parts)),
            "concurrency": streams[k],
            "warmup": warmups[k],
            # A sum of independent Poisson streams is a Poisson stream of the summed rate (of
            # gamma streams, a stream of that mean rate, a little more even than each).
            "request_rate": level.request_rate * streams[k] / level.concurrency
            if level.request_rate
            else None,
            "shard": k,
        }
        for k in range(parts)
    ]


def _child_env() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else root
    return env


async def _run_in_processes(
    client_cfg: ClientConfig,
    level: LevelConfig,
    on_request_done: OnRequestDone | None,
    should_stop: ShouldStop,
) -> tuple[list[RequestRecord], bool, float, dict]:
    """Run the level in subprocesses (not multiprocessing: Celery's pool workers are daemonic
    and may not fork children of their own); merge their raw records."""
    specs = _shard_specs(client_cfg, level)
    records: list[RequestRecord] = []
    stopped = False
    children = []
    for spec in specs:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "workers.loadgen",
            "--shard",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_child_env(),
            limit=1 << 26,
        )
        child.stdin.write(json.dumps(spec).encode() + b"\n")
        await child.stdin.drain()
        children.append(child)

    finals: list[dict | None] = [None] * len(children)
    received = [0] * len(children)
    total = requests_of(client_cfg, level, [(0, i) for i in range(level.num_prompts)])

    async def collect(k: int) -> None:
        async for line in children[k].stdout:
            message = json.loads(line)
            if "record" in message:
                records.append(RequestRecord.from_wire(message["record"]))
                received[k] += 1
                if on_request_done is not None:
                    on_request_done(len(records), total)
            else:
                finals[k] = message
        await children[k].wait()

    async def watch_stop() -> None:
        nonlocal stopped
        while not stopped:
            await asyncio.sleep(0.1)
            if should_stop():
                stopped = True
                for child in children:
                    # A child that just exited has closed its end of the pipe.
                    with contextlib.suppress(ConnectionError):
                        if child.returncode is None:
                            child.stdin.write(b"stop\n")

    watcher = asyncio.create_task(watch_stop())
    try:
        await asyncio.gather(*(collect(k) for k in range(len(children))))
    finally:
        watcher.cancel()
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    cpu_s, stopped_early, warmup_tokens = _merge_finals(specs, children, finals, received, records)
    return records, stopped or stopped_early, cpu_s, warmup_tokens


def _merge_finals(specs, children, finals, received, records):
    """(client CPU s, whether a shard stopped early, warm-up tokens) from the shards' last
    lines; a shard that died unreported adds its missing requests to records as failures."""
    cpu_s, stopped = 0.0, False
    warmup_tokens = {"input_tokens": 0, "output_tokens": 0}
    for k, final in enumerate(finals):
        if final is None:
            # A shard that died unreported: its missing requests are failures of the client.
            detail = f"client process {k} exited with {children[k].returncode}"
            records.extend(
                RequestRecord(math.nan, math.nan, error="loadgen_shard_failed", detail=detail)
                for _ in range(len(specs[k]["indices"]) - received[k])
            )
        else:
            cpu_s += final["cpu_s"]
            stopped = stopped or final["sent"] < len(specs[k]["indices"])
            for key, value in final["warmup_tokens"].items():
                warmup_tokens[key] += value
    return cpu_s, stopped, warmup_tokens


async def shard_main() -> None:
    """Child side of _run_in_processes: spec on stdin, one JSON line per record on stdout."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 26)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    spec = json.loads(await reader.readline())
    stop = False

    async def watch_stdin() -> None:
        nonlocal stop
        line = await reader.readline()
        stop = stop or line.strip() == b"stop" or not line

    watcher = asyncio.create_task(watch_stdin())
    out = sys.stdout.buffer

    def on_record(record: RequestRecord) -> None:
        out.write(json.dumps({"record": record.to_wire()}).encode() + b"\n")
        out.flush()

    cpu0 = time.process_time()
    sent, warmup_tokens = await _drive(
        ClientConfig(**spec["client"]),
        LevelConfig(**spec["level"]),
        spec["indices"],
        concurrency=spec["concurrency"],
        warmup=spec["warmup"],
        request_rate=spec["request_rate"],
        arrival_seed=(spec["shard"],),
        on_record=on_record,
        should_stop=lambda: stop,
    )
    watcher.cancel()
    final = {"sent": sent, "cpu_s": time.process_time() - cpu0, "warmup_tokens": warmup_tokens}
    out.write(json.dumps(final).encode() + b"\n")
    out.flush()


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------


async def run_level(
    client_cfg: ClientConfig,
    level_cfg: LevelConfig,
    *,
    on_request_done: OnRequestDone | None = None,
    should_stop: ShouldStop | None = None,
) -> dict:
    """Run one level and return its metrics (summarize_level's dict) plus bookkeeping.

    on_request_done(done, total) is called after each measured request; should_stop() is
    polled before each new request: once true, no request starts, those in flight finish and
    the result carries stopped=True. Adds started_at / finished_at (UTC epoch s), client_cpu_s
    (CPU s the client processes used), processes, warmup_tokens (the warm-up's usage) and
    requests: the level's requests, one entry per request (metrics.request_columns).
    """
    if client_cfg.endpoint not in ENDPOINT_PATHS:
        raise ValueError(f"endpoint must be one of {sorted(ENDPOINT_PATHS)}")
    if client_cfg.endpoint == "completions" and client_cfg.vocab_size is None:
        raise ValueError("prompts of token ids need the model's vocabulary size")
    if client_cfg.transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}")
    stop = should_stop or (lambda: False)
    started_at = time.time()
    cpu0 = time.process_time()
    if level_cfg.processes > 1:
        records, stopped, child_cpu, warmup_tokens = await _run_in_processes(
            client_cfg, level_cfg, on_request_done, stop
        )
    else:
        records, stopped, warmup_tokens = await _run_in_process(
            client_cfg, level_cfg, on_request_done, stop
        )
        child_cpu = 0.0
    result = summarize_level(records, level_cfg)
    if is_multi_turn(client_cfg):
        result["ttft_by_turn"] = ttft_by_turn(records)
    result.update(
        warmup_tokens=warmup_tokens,
        requests=request_columns(records),
        started_at=started_at,
        finished_at=time.time(),
        client_cpu_s=time.process_time() - cpu0 + child_cpu,
        processes=max(1, min(level_cfg.processes, level_cfg.concurrency)),
        stopped=stopped,
    )
    return result


def run_sweep(
    cfg: SweepConfig,
    *,
    on_level_start: Callable[[int, LevelConfig], None] | None = None,
    on_level_done: Callable[[int, dict], None] | None = None,
    on_progress: Callable[[int, int, int], None] | None = None,
    should_stop: ShouldStop | None = None,
) -> list[dict]:
    """Run every level of the sweep in order, each cfg.rounds times in a row; returns the
    finished results, one per level and round (a result of several rounds carries "round": 1,
    2, …).

    on_level_start(i, level) and on_level_done(i, result) bracket level i (each round of it);
    on_progress(i, done, total) follows requests within it. When should_stop() turns true the
    level in progress ends at the next request boundary and is not returned; finished levels
    are. Blocking: runs its own event loop.
    """
    stop = should_stop or (lambda: False)

    async def sweep() -> list[dict]:
        results = []
        for i, level in enumerate(cfg.levels()):
            if stop():
                break
            if on_level_start is not None:
                on_level_start(i, level)
            progress = None
            if on_progress is not None:

                def progress(done: int, total: int, i: int = i) -> None:
                    on_progress(i, done, total)

            for round_number in range(1, cfg.rounds + 1):
                client = cfg.round_client(round_number)
                result = await run_level(client, level, on_request_done=progress, should_stop=stop)
                if result["stopped"]:
                    return results
                if cfg.rounds > 1:
                    result["round"] = round_number
                results.append(result)
                if on_level_done is not None:
                    on_level_done(i, result)
        return results

    return asyncio.run(sweep())
