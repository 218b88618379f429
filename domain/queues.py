"""The GPU hosts' task queues, as both tiers name and time them: the web tier enqueues
`workers.<task>` on `host.<name>` (moeops.celery), each host's worker listens there
(workers.celery), and both use the same Redis, whose visibility timeout must outlast every
host task. Each task's own time limits are the worker's (workers.tasks)."""

import os

# How long a sweep may run (s), the longest host task: past it the worker ends the run as
# failed, and the web tier refuses a sweep too large to fit in it (moeops.runs.parameters).
SWEEP_SOFT_LIMIT_S = 6 * 3600

# Redis hands an unacked task to another worker after this long; it must outlast the longest
# task and its hard kill (workers.tasks), or a sweep still running would be delivered a second
# time. The web side's app uses the same value: it shares the Redis, and its own setting would
# apply to the unacked host tasks too.
VISIBILITY_TIMEOUT_S = int(os.getenv("MOEOPS_VISIBILITY_TIMEOUT", SWEEP_SOFT_LIMIT_S + 4 * 60))

# A broker that takes a connection but does not answer (a paused or swapping Redis) is given up
# on after this long (s): a send fails with the reason, a heartbeat says the broker is out of
# reach, rather than either hanging with no end.
BROKER_ANSWER_S = 5
BROKER_TIMEOUTS = {"socket_timeout": BROKER_ANSWER_S, "socket_connect_timeout": BROKER_ANSWER_S}


def host_queue(host_name: str) -> str:
    """The Celery queue of a host's worker: host.<name>."""
    return f"host.{host_name}"
