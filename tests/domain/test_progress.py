"""A sweep's and a tune's progress as both tiers read it (domain.progress)."""

import pytest

from domain.progress import SweepProgress, TuneProgress, attempt_of


def test_it_reads_what_the_sweeping_worker_pushes():
    pushed = {
        "attempt": 2,
        "heartbeat": 1_700_000_000.5,
        "claim": "c0ffee",
        "worker": {"host": "gpu-7", "pid": 4242},
        "level_index": 1,
        "levels_total": 3,
        "requests_done": 40,
        "requests_total": 64,
        "capacity": {"unit": "concurrent", "probes": []},
    }

    progress = SweepProgress.read(pushed)

    assert (progress.attempt, progress.heartbeat, progress.claim) == (2, 1_700_000_000.5, "c0ffee")
    assert (progress.worker.host, progress.worker.pid) == ("gpu-7", 4242)
    # counts stay ints: the status endpoint sends them back as the worker wrote them
    assert progress.requests_done == 40 and isinstance(progress.requests_done, int)
    assert progress.capacity == {"unit": "concurrent", "probes": []}


@pytest.mark.parametrize("progress", [None, [], "running", {}])
def test_a_run_with_no_progress_object_reads_as_attempt_one_with_nothing_known(progress):
    read = SweepProgress.read(progress)

    assert read.attempt == 1 and attempt_of(progress) == 1
    assert read.heartbeat is None and read.worker.pid is None and read.capacity is None


def test_a_value_of_another_type_reads_as_absent_not_as_a_failure():
    read = SweepProgress.read(
        {
            "attempt": True,  # JSON's true is no attempt
            "heartbeat": "soon",
            "requests_done": False,
            "worker": "gpu-7",
            "capacity": [8, 16],
            "claim": 7,
        }
    )

    assert read.attempt == 1
    assert (read.heartbeat, read.requests_done, read.capacity, read.claim) == (None,) * 4
    assert read.worker.host is None
    assert attempt_of({"attempt": 0}) == 1 and attempt_of({"attempt": 3}) == 3


def test_a_tune_counts_its_work_by_the_first_pair_it_filled_in():
    assert TuneProgress.read({"batch_sizes_done": 3, "batch_sizes_total": 18}).counted() == (3, 18)
    # a total of 0 counts nothing: the next pair is read
    both = {"batch_index": 1, "batch_sizes_total": 0, "candidates_done": 5, "candidates_total": 9}
    assert TuneProgress.read(both).counted() == (5, 9)
    assert TuneProgress.read({"done": True, "total": 4}).counted() == (None, None)
    assert TuneProgress.read({"message": ["x"], "batch_size": 64}).message is None
