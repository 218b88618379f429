"""moeops's cache folder on a host: $MOEOPS_CACHE_DIR, else ~/.cache/moeops. It holds the worker's
spool (workers.client) and tuning logs (workers.kernel_tune) and the GPUs' measured ceilings
(tuning.timing); each of the first two can be put elsewhere by a variable of its own."""

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("MOEOPS_CACHE_DIR") or Path.home() / ".cache" / "moeops")
