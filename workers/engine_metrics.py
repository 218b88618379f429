"""The engine's own view during a sweep: its Prometheus /metrics.

SGLang and vLLM both export running requests, queued requests and KV-cache usage, under their
own names, sampled through the sweep; and counters of prompt and generation tokens, prefix-cache
use, preemptions and speculative decoding, read at each level's start and end (docs/metrics.md,
"Engine counters"). An engine with several schedulers (data-parallel ranks, vLLM's engine index)
exports one series per scheduler: counts are summed over them and KV-cache usage averaged.
Series that differ only by tp_rank / pp_rank are copies of one scheduler's state (SGLang with
--enable-metrics-for-all-schedulers) and count once."""

import math
import threading
import time
from collections import Counter, defaultdict

from prometheus_client.parser import text_string_to_metric_families

from workers.engine_http import EngineHTTP, EngineUnanswered

# Gauge names per engine; KV-cache usage is a 0..1 fraction under every name.
ENGINE_GAUGES = {
    "sglang": {
        "running": ("sglang:num_running_reqs",),
        "queued": ("sglang:num_queue_reqs",),
        "kv_cache_usage": ("sglang:token_usage",),
    },
    "vllm": {
        "running": ("vllm:num_requests_running",),
        "queued": ("vllm:num_requests_waiting",),
        # vLLM V1 renamed gpu_cache_usage_perc (V0) to kv_cache_usage_perc.
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
}
# Counters per engine, read at the start and end of each level (the level's figure is their
# difference); each name is the sample's, "_total" included. vLLM counts prefix-cache queries
# and hits in tokens; SGLang counts the prompt tokens its radix cache served (cached_tokens).
ENGINE_COUNTERS = {
    "vllm": {
        "prompt_tokens": ("vllm:prompt_tokens_total",),
        "generation_tokens": ("vllm:generation_tokens_total",),
        "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
        "prefix_cache_hits": ("vllm:prefix_cache_hits_total",),
        "preemptions": ("vllm:num_preemptions_total",),
        "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
        "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    },
    "sglang": {
        "prompt_tokens": ("sglang:prompt_tokens_total",),
        "generation_tokens": ("sglang:generation_tokens_total",),
        "cached_tokens": ("sglang:cached_tokens_total",),
        "preemptions": ("sglang:num_retracted_requests_total",),
    },
}
# Gauges of the engine's own recent averages, read at the end of each level: SGLang's prefix
# cache hit rate (0..1) and speculative acceptance length (tokens per step).
ENGINE_RATIOS = {
    "sglang": {
        "cache_hit_rate": ("sglang:cache_hit_rate",),
        "spec_accept_length": ("sglang:spec_accept_length",),
    },
}
# Labels that tell apart copies of one scheduler's state rather than distinct schedulers.
REPLICA_LABELS = frozenset({"tp_rank", "pp_rank", "attn_tp_rank", "moe_ep_rank"})
STANDIN_INFO = "moeops_standin_info"


class EngineMetricsError(ValueError):
    """A /metrics body that is not Prometheus text exposition."""


def parse_engine_metrics(text: str) -> dict:
    """Running, queued and KV-cache usage from a Prometheus /metrics body.

    Returns {"engine": "sglang" | "vllm" | "standin" | None, "running": float | None,
    "queued": float | None, "kv_cache_usage": float | None (0..1)}; a value is None when the
    engine does not export it. Raises EngineMetricsError when the text does not parse.
    """
    series = _series(text)
    engine = _engine_of(series)
    out = {"engine": engine, "running": None, "queued": None, "kv_cache_usage": None}
    if engine is None:
        return out
    for field, names in ENGINE_GAUGES[engine].items():
        found = next((series[name] for name in names if name in series), None)
        if found is not None:
            per_scheduler = _per_scheduler(found)
            if field == "kv_cache_usage":
                out[field] = sum(per_scheduler) / len(per_scheduler)
            else:
                out[field] = float(sum(per_scheduler))
    if STANDIN_INFO in series:
        out["engine"] = "standin"
    return out


def parse_engine_counters(text: str) -> dict:
    """The engine's token, prefix-cache, preemption and speculative-decoding counters
    (ENGINE_COUNTERS, summed over schedulers) and ratio gauges (ENGINE_RATIOS, averaged) from a
    /metrics body: {"engine", name: value, …}, a name left out when the engine does not export
    it. Raises EngineMetricsError when the text does not parse."""
    series = _series(text)
    engine = _engine_of(series)
    out: dict = {"engine": "standin" if STANDIN_INFO in series else engine}
    for field, names in ENGINE_COUNTERS.get(engine, {}).items():
        found = next((series[name] for name in names if name in series), None)
        if found is not None:
            out[field] = float(sum(_per_scheduler(found)))
    for field, names in ENGINE_RATIOS.get(engine, {}).items():
        found = next((series[name] for name in names if name in series), None)
        if found is not None:
            per_scheduler = _per_scheduler(found)
            out[field] = sum(per_scheduler) / len(per_scheduler)
    return out


def counter_deltas(before: dict, after: dict) -> dict:
    """A level's engine figures from the counters read before and after it: each counter's
    increase (a counter that went down, the engine restarted, is left out), each ratio as read
    after; {"engine"} alone when either read failed (None)."""
    if before is None or after is None:
        return {"engine": (after or before or {}).get("engine")}
    out = {"engine": after.get("engine")}
    for field in {name for names in ENGINE_COUNTERS.values() for name in names}:
        if field in before and field in after and after[field] >= before[field]:
            out[field] = after[field] - before[field]
    for field in {name for names in ENGINE_RATIOS.values() for name in names}:
        if field in after:
            out[field] = after[field]
    return out


def _series(text: str) -> dict[str, list[tuple[dict, float]]]:
    """{sample name: [(labels, value)]} of a /metrics body, NaN values left out."""
    series: dict[str, list[tuple[dict, float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not math.isnan(sample.value):
                    series[sample.name].append((sample.labels, sample.value))
    except ValueError as exc:
        raise EngineMetricsError(f"not Prometheus text: {exc}") from exc
    return series


def _engine_of(series) -> str | None:
    return next(
        (
            name
            for name, gauges in ENGINE_GAUGES.items()
            if any(metric in series for names in gauges.values() for metric in names)
        ),
        None,
    )


def _per_scheduler(found: list[tuple[dict, float]]) -> list[float]:
    """One value per scheduler: copies (differing only by REPLICA_LABELS) collapse to their max.

    SGLang's priority scheduling adds per-priority series next to an aggregate with an empty
    priority label; the aggregate is used when present.
    """
    aggregate = [(labels, v) for labels, v in found if not labels.get("priority")]
    if aggregate and len(aggregate) < len(found):
        found = aggregate
    groups: dict[tuple, float] = {}
    for labels, value in found:
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in REPLICA_LABELS))
        groups[key] = max(value, groups.get(key, value))
    return list(groups.values())


def scrape_engine_metrics(
    base_url: str, *, engine: EngineHTTP | None = None, timeout_s: float = 2.0
) -> dict:
    """GET base_url/metrics and parse it (parse_engine_metrics' dict).

    Raises EngineUnanswered when the engine does not answer 200, EngineMetricsError when the
    body is not Prometheus text.
    """
    if engine is None:
        with EngineHTTP(base_url, timeout_s=timeout_s) as own:
            answer = own.get("/metrics")
    else:
        answer = engine.get("/metrics", timeout_s=timeout_s)
    return parse_engine_metrics(answer.text_or_raise())


def read_engine_counters(base_url: str, *, timeout_s: float = 5.0) -> dict | None:
    """parse_engine_counters of the engine's /metrics now, or None when it cannot be read (no
    answer, not 200, not Prometheus text): a level's engine figures are then left out."""
    with EngineHTTP(base_url, timeout_s=timeout_s) as engine:
        answer = engine.get("/metrics")
    try:
        return parse_engine_counters(answer.text_or_raise())
    except (EngineUnanswered, EngineMetricsError):
        return None


class EngineMetricsSampler:
    """Scrapes an engine's /metrics every interval_s on a background thread.

    Each sample is {"ts": UTC epoch s, "running", "queued", "kv_cache_usage" (0..1),
    "level_concurrency"}, the last being whatever the caller set in level_concurrency when the
    scrape happened. A failed scrape adds no sample (nothing is made up) and counts its reason
    in errors. Use as a context manager, or start() and stop().
    """

    def __init__(self, base_url: str, *, interval_s: float = 1.0, timeout_s: float = 2.0):
        self.base_url = base_url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.level_concurrency: int | None = None
        self.engine: str | None = None
        self.samples: list[dict] = []
        self.errors: Counter = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "EngineMetricsSampler":
        """Begin sampling (the first scrape is immediate)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="engine-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        """Stop sampling, wait for the thread and return the samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + self.interval_s + 1)
        return self.samples

    def __enter__(self) -> "EngineMetricsSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def sample_once(self, engine: EngineHTTP) -> dict | None:
        """Scrape once; the sample appended, or None when the scrape failed."""
        ts = time.time()
        try:
            parsed = scrape_engine_metrics(self.base_url, engine=engine, timeout_s=self.timeout_s)
        except EngineUnanswered as exc:
            self.errors[exc.kind] += 1
            return None
        except EngineMetricsError:
            self.errors["unparsable"] += 1
            return None
        self.engine = parsed["engine"]
        sample = {
            "ts": ts,
            "running": parsed["running"],
            "queued": parsed["queued"],
            "kv_cache_usage": parsed["kv_cache_usage"],
            "level_concurrency": self.level_concurrency,
        }
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        start = time.monotonic()
        ticks = 0
        with EngineHTTP(self.base_url, timeout_s=self.timeout_s) as engine:
            while not self._stop.is_set():
                self.sample_once(engine)
                # A fixed schedule: a slow scrape skips ticks instead of pushing later ones back.
                ticks = max(ticks + 1, int((time.monotonic() - start) / self.interval_s) + 1)
                next_at = start + ticks * self.interval_s
                self._stop.wait(max(0.0, next_at - time.monotonic()))
