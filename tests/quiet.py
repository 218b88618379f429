"""Turns between make test's passes, for the tests marked `quiet`: they judge rounds measured on
the real vLLM against each other or against a limit, and beside the other passes' tests on the
2-core machine the same level's rounds spread 5× and more (0.04 s, then 0.9 s), so that a fall
that should show read "within the noise".

`make test` gives every pass the same lock file (MOEOPS_QUIET_LOCK). Each test of every pass
holds the lock shared while it runs; a quiet test holds it alone: it waits for the tests running
in the other passes to end, and they start their next one when it has ended. A gate before the
lock keeps a quiet test from waiting on a stream of shared turns (flock grants a shared lock
while an exclusive one waits)."""

import fcntl
import time
from contextlib import contextmanager


@contextmanager
def turn(path, alone):
    """Hold the lock at `path` while the body runs: shared, or alone (saying how long that
    took to get)."""
    with open(f"{path}.gate", "a") as gate, open(path, "a") as lock:
        began = time.monotonic()
        fcntl.flock(gate, fcntl.LOCK_EX)
        if alone:
            fcntl.flock(lock, fcntl.LOCK_EX)
            print(f"\n[quiet: the other passes paused after {time.monotonic() - began:.0f} s]")
        else:
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
