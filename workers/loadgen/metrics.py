"""A level's figures from its requests' records, as `vllm bench serve` computes them
(docs/metrics.md): throughputs, latency statistics, goodput, peaks."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from domain import latency_stats, request_log
from domain.failures import describe_failure
from domain.traces import KEEP_UP_MS
from workers.loadgen.arrivals import achieved_rate
from workers.loadgen.config import ERROR_MESSAGE_CHARS, LevelConfig, RequestRecord

# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def summarize_level(records: list[RequestRecord], level: LevelConfig) -> dict:
    """Level metrics from raw records, with `vllm bench serve` key names.

    Durations in s, latencies in ms, throughput in req/s and tok/s. Token totals and the
    token-based figures (throughputs, TPOT, peak tok/s) are None unless every completed request
    reported usage; usage_reported says which case this is.
    """
    ok = [r for r in records if r.error is None]
    failed = [r for r in records if r.error is not None]
    timed = [r for r in records if not math.isnan(r.send_ts)]
    start = min((r.send_ts for r in timed), default=0.0)
    duration = max((r.end_ts for r in timed), default=start) - start
    usage_reported = bool(ok) and all(
        r.completion_tokens is not None and r.prompt_tokens is not None for r in ok
    )
    ttfts = [r.chunk_ts[0] - r.send_ts for r in ok]
    e2els = [r.chunk_ts[-1] - r.send_ts for r in ok]
    itls = [b - a for r in ok for a, b in zip(r.chunk_ts, r.chunk_ts[1:], strict=False)]
    tpots: list[float] = []
    if usage_reported:
        tpots = [
            (r.chunk_ts[-1] - r.chunk_ts[0]) / (r.completion_tokens - 1)
            for r in ok
            if r.completion_tokens > 1
        ]
        total_input = sum(r.prompt_tokens for r in ok)
        total_output = sum(r.completion_tokens for r in ok)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: None)
    result: dict = {
        "concurrency": level.concurrency,
        "request_rate": level.request_rate,
        "burstiness": level.burstiness,
        "ramp_up_s": level.ramp_up_s,
        "achieved_request_rate": achieved_rate(
            np.array([r.send_ts for r in timed]), level.ramp_up_s if level.request_rate else 0.0
        ),
        "input_len": level.input_len,
        "output_len": level.output_len,
        "num_prompts": level.num_prompts,
        "warmup": level.warmup,
        "duration": duration,
        "completed": len(ok),
        "failed": len(failed),
        "errors": dict(Counter(r.error for r in failed)),
        "error_samples": {r.error: r.detail for r in reversed(failed)},
        "all_failed_with": all_failed_with(records),
        "usage_reported": usage_reported,
        "total_input_tokens": total_input if usage_reported else None,
        "total_output_tokens": total_output if usage_reported else None,
        "content_chunks": sum(len(r.chunk_ts) for r in ok),
        "request_throughput": per_s(len(ok)),
        "output_throughput": per_s(total_output) if usage_reported else None,
        "total_token_throughput": per_s(total_input + total_output) if usage_reported else None,
        "max_output_tokens_per_s": _peak_tokens_per_s(ok, start) if usage_reported else None,
        "max_concurrent_requests": latency_stats.interval_overlap_max(
            np.array([r.send_ts for r in timed]), np.array([r.end_ts for r in timed]), start
        ),
    }
    result.update(lateness(timed))
    slos = {"ttft": level.slo_ttft_ms, "tpot": level.slo_tpot_ms, "e2el": level.slo_e2el_ms}
    if any(v is not None for v in slos.values()):
        result["request_goodput"] = per_s(_good_requests(ok, slos, usage_reported))
    result.update(latency_stats.describe_ms("ttft", ttfts))
    result.update(latency_stats.describe_ms("tpot", tpots))
    result.update(latency_stats.describe_ms("itl", itls))
    result.update(latency_stats.describe_ms("e2el", e2els))
    return result


def lateness(timed: list[RequestRecord]) -> dict:
    """How far a trace's requests went after they were due (ms, send_ts − scheduled_ts):
    p99_lateness_ms, max_lateness_ms, and late_requests, how many went more than
    domain.traces.KEEP_UP_MS late; {} where no request had a time to keep (not a trace)."""
    late = [float(r.send_ts - r.scheduled_ts) * 1000 for r in timed if r.scheduled_ts is not None]
    if not late:
        return {}
    return {
        "p99_lateness_ms": float(np.percentile(late, 99)),
        "max_lateness_ms": float(max(late)),
        "late_requests": sum(1 for x in late if x > KEEP_UP_MS),
    }


def request_columns(records: list[RequestRecord]) -> dict:
    """The level's requests as domain.request_log columns (s, from the level's first send), in
    the order they were sent; a request a dead client process never sent has no times."""
    ordered = sorted(records, key=lambda r: (math.isnan(r.send_ts), r.send_ts))
    timed = [r.send_ts for r in ordered if not math.isnan(r.send_ts)]
    start = timed[0] if timed else 0.0
    columns: dict = {key: [] for key in request_log.REQUEST_KEYS}
    for r in ordered:
        sent = not math.isnan(r.send_ts)
        ok = r.error is None
        columns["start_time"].append(request_log.rounded(r.send_ts - start) if sent else None)
        columns["ttft"].append(request_log.rounded(r.chunk_ts[0] - r.send_ts) if ok else None)
        end = r.chunk_ts[-1] if ok else r.end_ts
        columns["latency"].append(request_log.rounded(end - r.send_ts) if sent else None)
        columns["input_len"].append(r.prompt_tokens)
        columns["output_len"].append(r.completion_tokens)
        columns["status"].append("ok" if ok else "failed")
        columns["error_reason"].append(r.error)
        columns["error"].append(None if ok else (r.detail or "")[:ERROR_MESSAGE_CHARS])
        gaps = [
            request_log.rounded(b - a) for a, b in zip(r.chunk_ts, r.chunk_ts[1:], strict=False)
        ]
        columns["itl"].append(gaps if ok else None)
    return columns


def all_failed_with(records: list[RequestRecord]) -> str | None:
    """ "HTTP 400: <the engine's message>" when every request failed for one reason, else
    None: then the level measured nothing but that error. The message is the one most requests
    got (they may differ in a number, e.g. which token id was out of vocabulary)."""
    if not records or any(r.error is None for r in records):
        return None
    if len({r.error for r in records}) != 1:
        return None
    detail, _ = Counter(r.detail for r in records).most_common(1)[0]
    return describe_failure(records[0].error, detail)


def _peak_tokens_per_s(ok: list[RequestRecord], start: float) -> float:
    """Most output tokens in one 1 s bucket; a chunk counts for its request's tokens / chunks,
    so multi-token chunks (speculative decoding, stream intervals) are not undercounted."""
    times = np.concatenate([np.asarray(r.chunk_ts) for r in ok]) if ok else np.empty(0)
    weights = (
        np.concatenate(
            [np.full(len(r.chunk_ts), r.completion_tokens / len(r.chunk_ts)) for r in ok]
        )
        if ok
        else np.empty(0)
    )
    return latency_stats.bucket_max(times, weights, start)


def _good_requests(ok: list[RequestRecord], slos: dict, usage_reported: bool) -> int:
    """Completed requests within every given SLO (ms); a TPOT SLO needs usage to judge."""
    good = 0
    for r in ok:
        ttft_ms = (r.chunk_ts[0] - r.send_ts) * 1000
        e2el_ms = (r.chunk_ts[-1] - r.send_ts) * 1000
        if slos["ttft"] is not None and ttft_ms > slos["ttft"]:
            continue
        if slos["e2el"] is not None and e2el_ms > slos["e2el"]:
            continue
        if slos["tpot"] is not None:
            if not usage_reported:
                continue
            tokens = r.completion_tokens
            tpot_ms = (e2el_ms - ttft_ms) / (tokens - 1) if tokens > 1 else 0.0
            if tpot_ms > slos["tpot"]:
                continue
        good += 1
    return good


def ttft_by_turn(records: list[RequestRecord]) -> list[dict]:
    """Per turn of multi-turn conversations (1, 2, …): {"turn", "completed", "failed",
    "mean_input_tokens"} (from the server's usage, None where a completed request reported
    none) and the turn's TTFT statistics (latency_stats.describe_ms: "mean_ttft_ms",
    "p99_ttft_ms", …; None where no request of the turn completed). A later turn sends a longer
    history: its TTFT shows the prefill that costs."""
    out = []
    for turn in sorted({r.turn for r in records if r.turn is not None}):
        mine = [r for r in records if r.turn == turn]
        ok = [r for r in mine if r.error is None]
        ttfts = [r.chunk_ts[0] - r.send_ts for r in ok]
        counted = ok and all(r.prompt_tokens is not None for r in ok)
        out.append(
            {
                "turn": turn,
                "completed": len(ok),
                "failed": len(mine) - len(ok),
                "mean_input_tokens": float(np.mean([r.prompt_tokens for r in ok]))
                if counted
                else None,
                **latency_stats.describe_ms("ttft", ttfts),
            }
        )
    return out
