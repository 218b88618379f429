"""make test's turns (tests/quiet.py): a quiet test waits for the running ones and holds back
the next ones until it has ended."""

import threading
import time

from tests import quiet


def _in_turn(path, alone, entered, leave):
    def hold():
        with quiet.turn(path, alone=alone):
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def test_a_quiet_turn_waits_for_the_running_test_and_the_next_one_waits_for_it(tmp_path):
    path = str(tmp_path / "quiet.lock")
    running, running_leaves = threading.Event(), threading.Event()
    first = _in_turn(path, False, running, running_leaves)
    assert running.wait(5)

    quiet_in, quiet_leaves = threading.Event(), threading.Event()
    alone = _in_turn(path, True, quiet_in, quiet_leaves)
    assert not quiet_in.wait(0.5), "a quiet test started beside a running one"

    # a test starting meanwhile in another pass waits behind the quiet one
    next_in, next_leaves = threading.Event(), threading.Event()
    following = _in_turn(path, False, next_in, next_leaves)
    time.sleep(0.3)
    assert not next_in.is_set()

    running_leaves.set()
    assert quiet_in.wait(5)
    assert not next_in.wait(0.5), "a test started while the quiet one ran"
    quiet_leaves.set()
    assert next_in.wait(5)
    next_leaves.set()
    for thread in (first, alone, following):
        thread.join(5)


def test_shared_turns_run_side_by_side(tmp_path):
    path = str(tmp_path / "quiet.lock")
    entered = [threading.Event(), threading.Event()]
    leave = threading.Event()
    threads = [_in_turn(path, False, e, leave) for e in entered]
    assert all(e.wait(5) for e in entered)
    leave.set()
    for thread in threads:
        thread.join(5)


def test_a_part_run_alone_waits_for_the_running_test_and_the_rest_runs_beside_the_others(
    tmp_path,
):
    path = str(tmp_path / "quiet.lock")
    running, running_leaves = threading.Event(), threading.Event()
    first = _in_turn(path, False, running, running_leaves)
    assert running.wait(5)

    in_turn, asks, alone_in, alone_leaves, done = (threading.Event() for _ in range(5))

    def in_parts():
        with quiet.turn(path, alone=False) as turn:
            in_turn.set()
            asks.wait(10)
            with turn.alone():
                alone_in.set()
                alone_leaves.wait(10)
            done.wait(10)

    parts = threading.Thread(target=in_parts)
    parts.start()
    # its shared part runs beside the running test
    assert in_turn.wait(5)
    asks.set()
    assert not alone_in.wait(0.5), "a part run alone began beside a running test"

    next_in, next_leaves = threading.Event(), threading.Event()
    following = _in_turn(path, False, next_in, next_leaves)
    time.sleep(0.3)
    assert not next_in.is_set()
    running_leaves.set()
    assert alone_in.wait(5)
    assert not next_in.wait(0.5), "a test started while a part ran alone"
    alone_leaves.set()
    # after its part the test goes on beside the next one
    assert next_in.wait(5)
    assert parts.is_alive()
    done.set()
    next_leaves.set()
    for thread in (first, parts, following):
        thread.join(5)


def test_a_part_alone_in_a_test_without_a_lock_or_already_alone_is_the_body_alone(tmp_path):
    with quiet.Turn().alone():
        pass
    with quiet.turn(str(tmp_path / "quiet.lock"), alone=True) as turn, turn.alone():
        pass
