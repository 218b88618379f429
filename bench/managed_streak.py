"""Does the managed real-vLLM loop hold on a busy machine, run after run?

Runs the managed e2e test (restart with a changed argument, re-sweep, apply a config from the
page, come back from a bad recipe; tests/e2e/test_real_vllm_managed.py) --runs times in a row
while --busy `yes` processes keep the cores busy, each run a fresh pytest. After each run it
checks that no vLLM server or Celery worker of the run is left. Prints a line per run and the
table for bench/RESULTS.md; exits 1 when any run failed or left a process.

    .venv/bin/python bench/managed_streak.py [--runs 10] [--busy 2]
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
TEST = (
    "tests/e2e/test_real_vllm_managed.py::"
    "test_restart_resweep_apply_a_config_from_the_page_and_come_back_from_a_bad_recipe"
)
LEFT_BEHIND = ("vllm_cli.py serve", "celery -A workers")


def left_behind():
    """The command lines of the engines and workers still running."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if any(mark in line for mark in LEFT_BEHIND):
            found.append(f"{proc.pid} {line[:120]}")
    return found


def one_run(number):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    time.sleep(2)  # a stopped engine's last children exit
    left = left_behind()
    tail = (done.stdout.strip().splitlines() or ["no output"])[-1]
    print(f"run {number}: exit {done.returncode} in {seconds:.0f} s, {tail}", flush=True)
    for line in left:
        print(f"  left running: {line}", flush=True)
    if done.returncode != 0:
        print(done.stdout[-4000:], flush=True)
    return done.returncode == 0, seconds, left


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs in a row (default 10)")
    parser.add_argument("--busy", type=int, default=2, help="`yes` processes (default 2)")
    args = parser.parse_args(argv)
    if left_behind():
        parser.error("engines or workers already run here: " + "; ".join(left_behind()))
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.busy)]
    results = []
    try:
        for number in range(1, args.runs + 1):
            results.append(one_run(number))
    finally:
        for proc in busy:
            proc.kill()
    passed = sum(ok for ok, _, _ in results)
    clean = sum(not left for _, _, left in results)
    seconds = sorted(s for _, s, _ in results)
    print()
    print("| runs | passed | left nothing running | median s | slowest s |")
    print("| --- | --- | --- | --- | --- |")
    print(
        f"| {len(results)} | {passed} | {clean} | {seconds[len(seconds) // 2]:.0f} "
        f"| {seconds[-1]:.0f} |"
    )
    return 0 if passed == clean == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
