"""A sweep's and a tune's progress, the JSON object its worker pushes, read alike by the worker
(which claims and takes runs over) and the web tier (which grants a takeover and shows how far a
run has got).

Read through `SweepProgress.read(run.progress)` and `TuneProgress.read(tuning_run.progress)`:
every field is typed, and a value of another type (an old run's, a worker's of another version)
reads as absent rather than failing the page. "attempt" is the delivery sweeping a run: 1, then
2, … each time a new delivery takes the run over from a worker that stopped.
"""

from typing import Annotated

from pydantic import BeforeValidator

from domain.numbers import is_integer
from domain.worker_json import Flag, Integer, Number, Object, Text, WorkerJSON

# A sweeping worker pushes its progress heartbeat every second: a run silent for this long (s)
# has lost its worker. A new delivery then takes it over, and a cancel ends it at once.
HEARTBEAT_STALE_S = 10.0


class Sender(WorkerJSON):
    """Who sends a run's heartbeats: on its own host, a dead sender's run is taken over."""

    host: Text = None
    pid: Integer = None


def _attempt(value) -> int:
    # a run swept before attempts were counted (none, or no positive integer) was on its first
    return value if is_integer(value) and value >= 1 else 1


class JobBeat(WorkerJSON):
    """What every job's progress carries (workers.job): the delivery running it (attempt), its
    last heartbeat (UTC epoch s), the claim its delivery made and who sends the heartbeats."""

    attempt: Annotated[int, BeforeValidator(_attempt)] = 1
    heartbeat: Number = None
    claim: Text = None
    worker: Annotated[Sender, BeforeValidator(lambda v: v if isinstance(v, dict) else {})] = (
        Sender()
    )


class SweepProgress(JobBeat):
    """A sweep run's progress (workers.sweep): epochs in UTC s, level_index 0-based, the
    request counts of the round running; capacity: a capacity search's bracket so far
    (workers.capacity.bracket_progress); more_rounds: the round running is one more than the
    run's rounds, run because the level's intervals straddle a limit."""

    started_at: Number = None
    level_index: Number = None
    levels_total: Number = None
    levels_done: Number = None
    round: Number = None
    rounds: Number = None
    more_rounds: Flag = False
    requests_done: Number = None
    requests_total: Number = None
    concurrency: Number = None
    capacity: Object = None
    # when the web tier last sent the sweep again to the host's worker, back after its loss
    # (moeops.runs.services.run_resend_orphaned)
    resent_at: Number = None


class TuneProgress(JobBeat):
    """A tune's progress (workers.kernel_tune): the tuner counts its work as batch sizes or as
    candidates (`counted()` picks the pair); batch_size is the M being tuned."""

    batch_sizes_done: Number = None
    batch_index: Number = None
    batch_sizes_total: Number = None
    candidates_done: Number = None
    candidates_total: Number = None
    done: Number = None
    total: Number = None
    started_at: Number = None
    batch_size: Number = None
    message: Text = None

    def counted(self) -> tuple:
        """(done, total) of the first counter pair the tuner filled in, else (None, None)."""
        for done, total in (
            (self.batch_sizes_done, self.batch_sizes_total),
            (self.batch_index, self.batch_sizes_total),
            (self.candidates_done, self.candidates_total),
            (self.done, self.total),
        ):
            if done is not None and total:
                return done, total
        return None, None


def attempt_of(progress) -> int:
    """The attempt a progress object is of: a run swept before attempts were counted (no
    attempt, or one that is no positive integer) was on its first."""
    return SweepProgress.read(progress).attempt
