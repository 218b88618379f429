"""Turns between make test's passes, for the tests marked `quiet`: they judge rounds measured on
the real vLLM against each other or against a limit, and beside the other passes' tests on the
2-core machine the same level's rounds spread 5× and more (0.04 s, then 0.9 s), so that a fall
that should show read "within the noise".

`make test` gives every pass the same lock file (MOEOPS_QUIET_LOCK). Each test of every pass
holds the lock shared while it runs; a quiet test holds it alone: it waits for the tests running
in the other passes to end, and they start their next one when it has ended. A quiet test that
asks for the `quiet_turn` fixture (tests/conftest.py) holds it alone only in the parts it runs
under `quiet_turn.alone()`, its measured ones, and shared in the rest. A gate before the
lock keeps a quiet test from waiting on a stream of shared turns (flock grants a shared lock
while an exclusive one waits)."""

import fcntl
import time
from contextlib import contextmanager


class Turn:
    """A test's turn, from turn(): alone() holds the lock alone for a part of a test that holds
    it shared, and is nothing more in a test that holds it alone already or holds no lock."""

    def __init__(self, gate=None, lock=None):
        self._gate, self._lock = gate, lock

    @contextmanager
    def alone(self):
        """The body runs while the other passes wait, as a quiet test's whole turn does: for a
        test whose measured part is only a part of it (the rest, an engine's restart, lets the
        other passes go on)."""
        if self._lock is None:
            yield
            return
        began = time.monotonic()
        # the shared hold is given up first: two tests of two passes each holding it shared
        # and waiting to hold it alone would wait for each other
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        print(f"\n[quiet: the other passes paused after {time.monotonic() - began:.0f} s]")
        try:
            yield
        finally:
            # shared again while the gate still holds back every other turn
            fcntl.flock(self._lock, fcntl.LOCK_SH)
            fcntl.flock(self._gate, fcntl.LOCK_UN)


@contextmanager
def turn(path, alone):
    """Hold the lock at `path` while the body runs: shared, or alone (saying how long that
    took to get). Gives the body its Turn."""
    with open(f"{path}.gate", "a") as gate, open(path, "a") as lock:
        began = time.monotonic()
        fcntl.flock(gate, fcntl.LOCK_EX)
        if alone:
            fcntl.flock(lock, fcntl.LOCK_EX)
            print(f"\n[quiet: the other passes paused after {time.monotonic() - began:.0f} s]")
            yield Turn()
        else:
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
            yield Turn(gate, lock)
