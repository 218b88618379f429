"""What a sweep, a level and the client are configured with, and what one request did."""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from domain.levels import DEFAULT_PROMPTS_PER_STREAM

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
TRANSPORTS = ("fast", "httpx")
# Common one-token English words for chat prompts; with no tokenizer, one word ≈ one token.
# fmt: off
CHAT_WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like",
    "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no",
    "way", "could", "people", "my", "than",
)
# fmt: on

# The longest server error message kept per failure reason.
ERROR_MESSAGE_CHARS = 500

OnRequestDone = Callable[[int, int], None]
ShouldStop = Callable[[], bool]


@dataclass(frozen=True)
class ClientConfig:
    """Where and how to send requests.

    endpoint is "completions" (prompts as token-id lists, exact lengths) or "chat" (text
    prompts, approximate lengths); timeout_s bounds each request end to end and each wait for
    bytes (s); vocab_size is the model's vocabulary (workers.vocabulary), from which prompt
    token ids are drawn, needed by the completions endpoint; transport is "fast"
    (HTTP1StreamTransport) or "httpx" (httpx's own pool); workload: the run's workload
    ({"spec": domain.workloads' spec, "items": a dataset's prompts}), None for random token
    ids of the level's lengths.
    """

    base_url: str
    model: str
    endpoint: str = "completions"
    timeout_s: float = 600.0
    vocab_size: int | None = None
    seed: int = 0
    api_key: str | None = None
    transport: str = "fast"
    workload: dict | None = None


@dataclass(frozen=True)
class LevelConfig:
    """One level: a concurrency, and a request rate when the level sends at one.

    request_rate is the arrival rate in req/s, None for "send whenever a stream is free"; with
    a rate, concurrency caps the requests in flight (a request whose time has come waits for a
    free stream), burstiness shapes the gaps (1: Poisson; workers.loadgen.arrivals) and the
    rate rises from 0 over the first ramp_up_s seconds; processes > 1 splits the level's
    streams over that many client processes; the slo_*
    values (ms) turn on request_goodput; index seeds the prompts so each level differs.
    """

    concurrency: int
    input_len: int
    output_len: int
    num_prompts: int
    warmup: int = 0
    request_rate: float | None = None
    burstiness: float = 1.0
    ramp_up_s: float = 0.0
    processes: int = 1
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2el_ms: float | None = None
    index: int = 0


@dataclass(frozen=True)
class SweepConfig:
    """A sweep: one LevelConfig per concurrency, or per concurrency and request rate, the rest
    shared.

    request_rates (req/s) make the levels those rates, each capped by each concurrency
    (concurrencies × request_rates levels; one concurrency is the usual cap); request_rate is
    the one rate of every level (request_rates of one). prompts_per_level None means
    DEFAULT_PROMPTS_PER_STREAM × concurrency; rounds: how many
    times each level runs in a row (round_client gives each its own prompts).
    """

    client: ClientConfig
    concurrencies: tuple[int, ...]
    input_len: int
    output_len: int
    prompts_per_level: int | None = None
    warmup: int = 0
    request_rate: float | None = None
    request_rates: tuple[float, ...] = ()
    burstiness: float = 1.0
    ramp_up_s: float = 0.0
    processes: int = 1
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2el_ms: float | None = None
    rounds: int = 1

    def round_client(self, round_number: int) -> ClientConfig:
        """The client of round 1, 2, …: round 1 as a sweep of one round, each later round with
        other prompts (seed + round − 1), as an engine's prefix cache would serve a prompt it
        has seen faster."""
        return replace(self.client, seed=self.client.seed + round_number - 1)

    def levels(self) -> list[LevelConfig]:
        """The sweep's levels in order: each concurrency, and within it each request rate. A
        trace's level sends its requests (at most prompts_per_level of them, the first)."""
        rates = self.request_rates or (self.request_rate,)
        workload = self.client.workload or {}
        trace = (workload.get("spec") or {}).get("kind") == "trace"
        pairs = [(c, rate) for c in self.concurrencies for rate in rates]

        def prompts(c):
            if trace:
                return min(self.prompts_per_level or math.inf, len(workload["items"]))
            return self.prompts_per_level or DEFAULT_PROMPTS_PER_STREAM * c

        return [self.level(c, rate, prompts(c), i) for i, (c, rate) in enumerate(pairs)]

    def level(self, concurrency, request_rate, num_prompts, index, *, arrivals=True):
        """A LevelConfig of this sweep's lengths, warm-up, processes and SLOs; arrivals: whether
        the sweep's burstiness and ramp-up shape the level's arrivals (else the defaults)."""
        shaped = {"burstiness": self.burstiness, "ramp_up_s": self.ramp_up_s} if arrivals else {}
        return LevelConfig(
            concurrency=concurrency,
            input_len=self.input_len,
            output_len=self.output_len,
            num_prompts=num_prompts,
            warmup=self.warmup,
            request_rate=request_rate,
            processes=self.processes,
            slo_ttft_ms=self.slo_ttft_ms,
            slo_tpot_ms=self.slo_tpot_ms,
            slo_e2el_ms=self.slo_e2el_ms,
            index=index,
            **shaped,
        )


@dataclass
class RequestRecord:
    """What one request did, in time.perf_counter seconds (one clock for all processes).

    chunk_ts holds the arrival time of each chunk with non-empty content; prompt_tokens and
    completion_tokens come from the server's usage (None when it sent none); error is the
    failure reason (None on success) and detail a short message for it; turn: the request's
    turn (1, 2, …) in a multi-turn conversation, None for a single-turn request;
    scheduled_ts: when a trace's request was due (its scaled timestamp), None otherwise.
    """

    send_ts: float
    end_ts: float = 0.0
    chunk_ts: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    detail: str | None = None
    turn: int | None = None
    scheduled_ts: float | None = None

    def to_wire(self) -> dict:
        """JSON-ready form for passing between processes (chunk_ts as base64 float64)."""
        out = asdict(self)
        out["chunk_ts"] = base64.b64encode(np.asarray(self.chunk_ts, np.float64)).decode()
        return out

    @classmethod
    def from_wire(cls, data: dict) -> RequestRecord:
        """Inverse of to_wire."""
        ts = np.frombuffer(base64.b64decode(data["chunk_ts"]), dtype=np.float64)
        return cls(**{**data, "chunk_ts": ts.tolist()})
