"""The sweep walk: how many rooms (modules) and stops (functions) of moeops a sweep passes
through, end to end, in one tree or several (issue 41 measures it before and after).

The walk is the one a sweep takes in production, in one process so that one profiler sees it
all: the runs service creates the run, the worker's `run_sweep` claims it, sends its load to an
in-process stand-in engine and pushes levels, samples and its end through the real REST client
to a live Django server, and the web tier's finished hooks judge it. A profile hook counts every
call into first-party code (moeops/, domain/, workers/, tuning/; not the tests, the stand-in or
migrations) while the walk runs:

- rooms: the modules with at least one function called (code that runs as a module is
  imported is loading, not the walk, and is left out);
- stops: the distinct functions called;
- crossings: the distinct (caller module, callee module) pairs, a call from one room into another.

Each tree runs the walk in its own pytest process (its own tests/conftest.py and fixtures: a
file is copied into its tests/ and removed after), three times; the counts are the same every
time or the table says so.

    .venv/bin/python bench/sweep_walk.py --tree before=/tmp/before --tree after=.

A tree is NAME=PATH (a checkout whose .venv, or this one's, has the packages, e.g. a `git
worktree add /tmp/before REV`).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

WALK_TEST = r"""
import json, os, sys, threading
from pathlib import Path

import pytest
from django.urls import get_resolver

from localstack.standin import StandinConfig, start_standin_in_thread
from moeops.api.models import ApiToken
from moeops.fleet.models import Deployment, Host, ModelSpec
from moeops.runs import services
from workers import sweep
from workers.client import MoeopsClient

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("moeops", "domain", "workers", "tuning")
SEEN = {"on": False, "functions": set(), "crossings": set()}


def _module(filename):
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    if rel.parts[0] not in ROOMS or "migrations" in rel.parts or rel.suffix != ".py":
        return None
    return ".".join(rel.with_suffix("").parts)


def _profile(frame, event, arg):
    if event != "call" or not SEEN["on"]:
        return
    callee = _module(frame.f_code.co_filename)
    if callee is None:
        return
    # code run by an import (a module's body, its decorators) is loading, not the walk
    outer = frame
    while outer is not None:
        if outer.f_code.co_name == "<module>":
            return
        outer = outer.f_back
    SEEN["functions"].add((callee, frame.f_code.co_name, frame.f_code.co_firstlineno))
    caller = _module(frame.f_back.f_code.co_filename) if frame.f_back else None
    if caller is not None and caller != callee:
        SEEN["crossings"].add((caller, callee))


@pytest.fixture(scope="session")
def walk_profile():
    # session scope and asked for first: set before live_server's thread starts
    threading.setprofile(_profile)
    sys.setprofile(_profile)
    yield
    sys.setprofile(None)
    threading.setprofile(None)


@pytest.mark.django_db(transaction=True)
def test_walk(walk_profile, live_server, tmp_path):
    url, stop = start_standin_in_thread(
        StandinConfig(model="m", max_running_requests=16, step_ms_base=2.0)
    )
    try:
        host = Host.objects.create(name="gpu-1")
        _, token = ApiToken.issue(name="worker", host=host)
        config = json.loads((ROOT / "moeops/examples/glm-5-fp8_config.json").read_text())
        model = ModelSpec.objects.create(name="GLM-5", config_json=config)
        deployment = Deployment.objects.create(
            name="glm", model=model, host=host, endpoint_url=url, served_model_name="m"
        )
        client = MoeopsClient(live_server.url, token, spool_dir=tmp_path / "spool")
        parameters = {
            "base_url": url, "model": "m", "levels": [4, 8], "input_len": 8,
            "output_len": 16, "vocab_size": 154880,
        }
        # the URLconf, and with it every view and API module, loads before the walk
        get_resolver().url_patterns
        SEEN["on"] = True
        run, _ = services.run_create(deployment=deployment, parameters=parameters)
        status = sweep.run_sweep(str(run.uuid), run.parameters, client=client)
        SEEN["on"] = False
        client.close()
        assert status == "succeeded"
    finally:
        stop()
    modules = {f[0] for f in SEEN["functions"]}
    Path(os.environ["WALK_OUT"]).write_text(json.dumps({
        "rooms": sorted(modules),
        "stops": len(SEEN["functions"]),
        "crossings": len(SEEN["crossings"]),
    }))
"""


def walk(path: Path, python: str) -> dict:
    test = path / "tests" / "test_zz_sweep_walk.py"
    test.write_text(WALK_TEST)
    try:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            env = {**os.environ, "WALK_OUT": out.name, "PYTHONPATH": str(path)}
            env.pop("DATABASE_URL", None)
            done = subprocess.run(
                [
                    python,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    str(test),
                    "--rootdir",
                    str(path),
                    "-o",
                    "addopts=",
                ],
                cwd=path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode != 0:
                sys.exit(f"the walk failed in {path}:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
            return json.loads(Path(out.name).read_text())
    finally:
        test.unlink()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tree",
        action="append",
        metavar="NAME=PATH",
        help="a checkout to walk (repeatable); default: this tree",
    )
    parser.add_argument("--times", type=int, default=3, help="walks per tree (default 3)")
    parser.add_argument("--json", action="store_true", help="print each tree's rooms too")
    args = parser.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree or [f"this={HERE}"]]
    print("| tree | rooms (modules) | stops (functions) | crossings (module → module) |")
    print("| --- | ---: | ---: | ---: |")
    for name, path in trees:
        path = Path(path).resolve()
        python = path / ".venv/bin/python"
        python = str(python if python.exists() else HERE / ".venv/bin/python")
        walks = [walk(path, python) for _ in range(args.times)]
        figures = {
            k: sorted({len(w["rooms"]) if k == "rooms" else w[k] for w in walks})
            for k in ("rooms", "stops", "crossings")
        }
        cells = ["–".join(str(v) for v in figures[k]) for k in ("rooms", "stops", "crossings")]
        print(f"| {name} | {' | '.join(cells)} |")
        if args.json:
            print(json.dumps(walks[0]["rooms"]))


if __name__ == "__main__":
    main()
