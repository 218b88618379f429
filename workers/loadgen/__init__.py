"""Concurrency-sweep load generator for OpenAI-compatible engines (SGLang, vLLM, the stand-in).

One level = N streamed requests of fixed input/output length at a fixed concurrency (optionally with
Poisson arrivals), measured the way `vllm bench serve` measures (docs/metrics.md); results use its
key names. Timestamps are taken with time.perf_counter when the raw bytes arrive, before any JSON
parsing. Failures are counted per level by reason and never stop the sweep.

The HTTP client is an httpx AsyncClient. By default it runs over `HTTP1StreamTransport`, an
httpx transport that decodes a whole network read of chunked SSE at once: httpx's own transport
spends ~10 µs per HTTP chunk in h11 and its pool scans every connection on each request, which at
1024 streams makes the client, not the engine, the bottleneck (bench/loadgen_capacity.py).

Library use (the Celery task):
    results = run_sweep(SweepConfig(client=ClientConfig(base_url, model), concurrencies=(32, 64),
                                    input_len=1024, output_len=1024),
                        on_progress=..., should_stop=...)
CLI:
    python -m workers.loadgen --base-url URL --model NAME --concurrency 32,64,128 ...
"""

from workers.loadgen.config import ClientConfig, LevelConfig, RequestRecord, SweepConfig
from workers.loadgen.drivers import run_level, run_sweep
from workers.loadgen.metrics import all_failed_with, summarize_level
from workers.loadgen.prompts import conversation_items, dataset_items, token_id_range
from workers.loadgen.stream import build_payload, send_request, server_error_message
from workers.loadgen.transport import HTTP1StreamTransport, make_client

__all__ = [
    "ClientConfig",
    "HTTP1StreamTransport",
    "LevelConfig",
    "RequestRecord",
    "SweepConfig",
    "all_failed_with",
    "build_payload",
    "conversation_items",
    "dataset_items",
    "make_client",
    "run_level",
    "run_sweep",
    "send_request",
    "server_error_message",
    "summarize_level",
    "token_id_range",
]
