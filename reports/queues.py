"""The GPU hosts' task queues, as both tiers name and time them: the web tier enqueues
`workers.<task>` on `host.<name>` (moeops.celery), each host's worker listens there
(workers.celery), and both use the same Redis, whose visibility timeout must outlast every
host task."""

import os

# Time limits (s): soft raises inside the task so it can end its run as failed; hard kills it.
SWEEP_SOFT_LIMIT_S = 6 * 3600
TUNE_SOFT_LIMIT_S = 3 * 3600
CHECK_SOFT_LIMIT_S = 120
# A restart waits for the engine's /health (a recipe allows up to 2 h), then perhaps for the
# previous recipe's.
ACTION_SOFT_LIMIT_S = 5 * 3600
HARD_MARGIN_S = 120

# Redis hands an unacked task to another worker after this long; it must outlast the longest
# task, or a sweep still running would be delivered a second time. The web side's app uses the
# same value: it shares the Redis, and its own setting would apply to the unacked host tasks too.
VISIBILITY_TIMEOUT_S = int(
    os.getenv("MOEOPS_VISIBILITY_TIMEOUT", SWEEP_SOFT_LIMIT_S + 2 * HARD_MARGIN_S)
)


def host_queue(host_name: str) -> str:
    """The Celery queue of a host's worker: host.<name>."""
    return f"host.{host_name}"
