"""Whether this worker reaches its Celery broker, for its heartbeat to say (the heartbeat goes
over HTTP, which a broker out of reach leaves standing).

A worker cut off from its broker takes no task while Celery retries the connection (100 times,
waiting longer each time), and only its own log said so: the web tier showed its queued work as
waiting for a worker that was, to every appearance, alive.
"""

import time

from kombu.exceptions import OperationalError

from domain.queues import BROKER_ANSWER_S, BROKER_TIMEOUTS


class BrokerCheck:
    """Connects to the app's broker once per call; remembers since when it has failed."""

    def __init__(self, app):
        self.app = app
        self._failing_since = None

    def __call__(self) -> dict:
        """{"reachable": bool, "url" (no credentials), "error" ("" when reachable), "since"
        (UTC epoch s of the first failed check in a row, None when reachable)}; one connection
        attempt that waits at most BROKER_ANSWER_S (s) for an answer: a broker that takes the
        connection and says nothing (paused) hung the heartbeat that asked."""
        connection = self.app.connection_for_write(transport_options=BROKER_TIMEOUTS)
        url = f"{connection.transport_cls}://{connection.hostname}:{connection.port}"
        try:
            # max_retries counts retries after the first attempt: 0 is one attempt
            connection.ensure_connection(max_retries=0, interval_start=0, interval_step=0)
            # a connection alone proves nothing: the kernel accepts it for a stopped process
            with connection.channel() as channel:
                channel.client.ping()
        except (OperationalError, *connection.connection_errors) as exc:
            self._failing_since = self._failing_since or time.time()
            error = str(exc)
            if "timeout" in error.lower():
                error = f"it took the connection but did not answer within {BROKER_ANSWER_S} s"
            return {"reachable": False, "url": url, "error": error, "since": self._failing_since}
        finally:
            connection.release()
        self._failing_since = None
        return {"reachable": True, "url": url, "error": "", "since": None}
