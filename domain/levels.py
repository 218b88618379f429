"""What a sweep's level is: the load it sends, how often it runs, and the names of its latency
statistics (`vllm bench serve`'s result keys). The level's metrics themselves are the fields of
the wire's model (domain.wire.levels.LevelMetrics); docs/metrics.md defines each."""

# A level with no prompts_per_level sends this many requests per concurrent stream, so that the
# steady state outweighs the ramp-up and drain at the level's edges (workers.loadgen).
DEFAULT_PROMPTS_PER_STREAM = 4
# The largest seed of a run's prompts (one a 32-bit signed column holds); each run draws its own.
MAX_SEED = 2_147_483_647
# A level runs at most this many rounds in a row: past ten, more rounds buy little but time.
MAX_ROUNDS = 10

# Latency statistics per level (ms): time to first token, time per output token, inter-token
# latency and end-to-end latency, each as mean, median, std and three percentiles.
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
LATENCY_PERCENTILES = (90, 95, 99)
LATENCY_STATS = ("mean", "median", "std", *(f"p{p}" for p in LATENCY_PERCENTILES))
LATENCY_KEYS = tuple(f"{s}_{m}_ms" for m in LATENCY_METRICS for s in LATENCY_STATS)
