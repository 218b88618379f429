"""What a sweep reports for one level, under the key names of `vllm bench serve`'s result JSON:
the worker's load generator writes them (workers.loadgen, workers.sweep), the web tier stores
them as LevelResult fields and reads them from imported files (moeops.runs). Units: counts,
tokens, s (duration), req/s and tok/s (rates), ms (latencies); docs/metrics.md defines each."""

# A level with no prompts_per_level sends this many requests per concurrent stream, so that the
# steady state outweighs the ramp-up and drain at the level's edges (workers.loadgen).
DEFAULT_PROMPTS_PER_STREAM = 4
# The largest seed of a run's prompts (one a 32-bit signed column holds); each run draws its own.
MAX_SEED = 2_147_483_647

# Latency statistics per level (ms): time to first token, time per output token, inter-token
# latency and end-to-end latency, each as mean, median, std and three percentiles.
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
LATENCY_PERCENTILES = (90, 95, 99)
LATENCY_STATS = ("mean", "median", "std", *(f"p{p}" for p in LATENCY_PERCENTILES))
LATENCY_KEYS = tuple(f"{s}_{m}_ms" for m in LATENCY_METRICS for s in LATENCY_STATS)
# Throughput and count keys of one level.
LEVEL_KEYS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "request_goodput",
    "achieved_request_rate",
) + LATENCY_KEYS
