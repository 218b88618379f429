"""What a sweep run's progress says of its deliveries, read alike by the worker (which claims and
takes runs over) and the web tier (which grants a takeover and shows the attempts).

A run's progress is the JSON object its worker pushes; "attempt" is the delivery sweeping it: 1,
then 2, … each time a new delivery takes the run over from a worker that stopped.
"""

from reports.numbers import is_integer

# A sweeping worker pushes its progress heartbeat every second: a run silent for this long (s)
# has lost its worker. A new delivery then takes it over, and a cancel ends it at once.
HEARTBEAT_STALE_S = 10.0


def attempt_of(progress) -> int:
    """The attempt a progress object is of: a run swept before attempts were counted (no
    attempt, or one that is no positive integer) was on its first."""
    attempt = (progress or {}).get("attempt")
    if is_integer(attempt) and attempt >= 1:
        return attempt
    return 1
