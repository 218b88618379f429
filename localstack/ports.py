"""free_port(): a TCP port on 127.0.0.1 that nothing listens on right now, for the local stack
(`make run`), the benches and the tests to start servers on. Another process may take it before
the caller binds it; the callers start their servers at once."""

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
