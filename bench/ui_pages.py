"""Server time of the heavy UI pages, on SQLite and PostgreSQL, of one tree or of several
measured in turns.

For each database and tree: a fresh database, the tree's own migrations, then the data of a
long sweep: one run of 6 concurrency levels over `--hours` (2 by default) with 1 Hz telemetry
on 8 GPUs (57,600 samples for 2 h, 691,200 for 24 h) and as many engine samples as seconds,
and 20 more runs of 6 levels each for the compare page; a tree that sums samples per time
bucket as they are stored (runs.rollup) gets those sums of the long run too. Every level holds
`--rounds` rounds (3 by default), each stored with its own figures, where the tree stores
rounds; a tree from before rounds gets levels of one round. Each page is requested through
Django's test client in-process (URL routing, views, queries, templates, JSON; no network).

Each tree runs in its own child process with its own database; after every child has loaded
its data they take turns: one pass of `--repeat` requests of every page per child, A B A B …,
`--passes` times, so that a busy machine slows them alike. The table gives the median over all
passes, the least server CPU time (the request's thread time), the number of SQL queries and
the size of one response, and each tree's figures as a ratio to the first tree's.

    .venv/bin/python bench/ui_pages.py                               # this tree, both databases
    .venv/bin/python bench/ui_pages.py --db sqlite --tree old=/tmp/old --tree new=.
    .venv/bin/python bench/ui_pages.py --tree 2h=. --tree 24h=.:24

A tree is NAME=PATH[:HOURS] (PATH a checkout with the same .venv's packages, e.g. a `git
worktree add /tmp/old REV`); without --tree, this tree alone. PostgreSQL comes from --pg-url
(default: $DATABASE_URL or postgres://postgres@127.0.0.1:5432/moeops); a scratch database
`moeops_bench_ui_<pid>_<n>` per tree is created next to it and dropped after.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8
LEVELS = (32, 64, 128, 256, 512, 1024)
COMPARE_RUNS = 20
# (page, how the long run is when it is asked for: "finished", "first view" of a finished run
# with nothing read before, or "live", running). A live run's poll asks for the charts in full
# when new samples came (every 5 s from the worker), and "since" what it has otherwise (every
# other poll: the page polls every 1.5 s), which a tree from before figures_key answers in full.
PAGES = (
    ("run page", "finished"),
    ("run page, first view", "first view"),
    ("run page, live", "live"),
    ("poll, live: new samples", "live"),
    ("poll, live: nothing new", "live"),
    ("compare 20 runs", None),
    ("deployment page (21 runs)", None),
    ("dashboard", None),
)

GLM5_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "hidden_size": 6144,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 78,
}


def _level_fields(concurrency, scale=1.0):
    """Every metric of a level, plausible for a plateauing engine."""
    output = scale * 1000.0 * concurrency / (concurrency + 100)
    tpot = 10.0 + concurrency / 20
    fields = {
        "concurrency": concurrency,
        "input_len": 1024,
        "output_len": 1024,
        "completed": 4 * concurrency,
        "failed": 0,
        "duration": 4 * concurrency * 1024 / output,
        "total_input_tokens": 4 * concurrency * 1024,
        "total_output_tokens": 4 * concurrency * 1024,
        "request_throughput": output / 1024,
        "output_throughput": output,
        "total_token_throughput": 2 * output,
        "max_output_tokens_per_s": 1.2 * output,
        "max_concurrent_requests": concurrency,
    }
    for metric, base in (("ttft", 50.0 + concurrency), ("tpot", tpot), ("itl", tpot), ("e2el", 0)):
        base = base or tpot * 1024
        for stat, factor in (
            ("mean", 1.0),
            ("median", 0.95),
            ("std", 0.2),
            ("p90", 1.3),
            ("p95", 1.5),
            ("p99", 2.0),
        ):
            fields[f"{stat}_{metric}_ms"] = base * factor
    return fields


def _rounds_stored():
    from moeops.runs import models

    return hasattr(models, "LevelRound")


def _level_key(concurrency):
    try:
        from moeops.runs.keys import level_key
    except ImportError:  # a tree from before moeops/runs/keys.py
        from moeops.runs.models import level_key
    return level_key(concurrency, None)


def _level_create(run, concurrency, rounds, scale=1.0, start=None, end=None):
    """A LevelResult of `rounds` rounds (each a few % off the others, spread evenly over
    start–end epoch s) with its LevelRounds, or of one where the tree stores no rounds."""
    from moeops.runs import models

    times = {} if start is None else {"started_at": start, "finished_at": end}
    if rounds == 1 or not _rounds_stored():
        return models.LevelResult.objects.create(
            run=run,
            key=_level_key(concurrency),
            **times,
            **_level_fields(concurrency, scale),
        )
    from domain.intervals import level_of_rounds

    figures = []
    for r in range(rounds):
        jitter = scale * (1 + 0.04 * (r - (rounds - 1) / 2))
        fields = {**_level_fields(concurrency, jitter), "errors": {}, "usage_reported": True}
        if start is not None:
            width = (end - start) / rounds
            fields |= {"started_at": start + r * width, "finished_at": start + (r + 1) * width}
        figures.append(fields)
    level = models.LevelResult.objects.create(
        run=run,
        key=_level_key(concurrency),
        round_count=rounds,
        **level_of_rounds(figures),
    )
    models.LevelRound.objects.bulk_create(
        models.LevelRound(level=level, round=r + 1, figures=fields, body_sha256="")
        for r, fields in enumerate(figures)
    )
    return level


def _sample_models():
    """(EngineBucket, EngineSample, TelemetryBucket, TelemetrySample) of the tree: in
    moeops.runs.samples, or in moeops.runs.models in a tree from before they moved there (the
    buckets None in a tree from before buckets)."""
    try:
        from moeops.runs import samples
    except ImportError:
        from moeops.runs import models as samples
    names = ("EngineBucket", "EngineSample", "TelemetryBucket", "TelemetrySample")
    return tuple(getattr(samples, name, None) for name in names)


def _buckets_summed(run):
    """Sums the run's samples per time bucket as its services would have on storing them,
    where the tree keeps such sums (runs.rollup)."""
    try:
        from moeops.runs import rollup
    except ImportError:
        return
    EngineBucket, EngineSample, TelemetryBucket, TelemetrySample = _sample_models()
    for buckets, samples in ((TelemetryBucket, TelemetrySample), (EngineBucket, EngineSample)):
        rollup.buckets_rebuild(buckets, samples, owner_field="run", owner_id=run.pk)


def _populate(seconds, rounds):
    from moeops.fleet.models import GPU, Deployment, Host, ModelSpec
    from moeops.runs.models import SweepRun

    _, EngineSample, _, TelemetrySample = _sample_models()

    model = ModelSpec(name="GLM-5", config_json=GLM5_CONFIG)
    model.fill_shape()
    model.save()
    host = Host.objects.create(name="bench-host")
    for index in range(GPUS):
        GPU.objects.create(host=host, index=index, name="NVIDIA H200", power_limit_w=700.0)
    deployment = Deployment.objects.create(
        name="GLM-5 bench", model=model, host=host, tp=8, max_running_requests=256
    )
    deployment.gpus.set(host.gpus.all())

    t0 = 1.8e9
    long_run = SweepRun.objects.create(
        deployment=deployment, label=f"{seconds // 3600} h sweep", status="succeeded"
    )
    span = seconds / len(LEVELS)
    for i, c in enumerate(LEVELS):
        _level_create(long_run, c, rounds, start=t0 + i * span, end=t0 + (i + 1) * span - 1)
    # in slices: a 24 h run's 691,200 samples would not fit in memory as model instances
    for first in range(0, seconds, 3600):
        TelemetrySample.objects.bulk_create(
            (
                TelemetrySample(
                    run=long_run,
                    gpu_index=g,
                    ts=t0 + s,
                    level_concurrency=LEVELS[min(int(s // span), len(LEVELS) - 1)],
                    gpu_util=(s * 7 + g * 13) % 100,
                    mem_util=40.0,
                    power_w=85.0 + (s * 3 + g) % 500,
                    power_limit_w=700.0,
                    mem_used_mib=90112.0,
                    mem_total_mib=143771.0,
                    sm_clock_mhz=1980.0,
                    temperature_c=60.0,
                )
                for s in range(first, min(first + 3600, seconds))
                for g in range(GPUS)
            ),
            batch_size=5000,
        )
    EngineSample.objects.bulk_create(
        (
            EngineSample(run=long_run, ts=t0 + s, running=s % 257, queued=s % 300)
            for s in range(seconds)
        ),
        batch_size=5000,
    )
    _buckets_summed(long_run)
    compare = []
    for r in range(COMPARE_RUNS):
        run = SweepRun.objects.create(deployment=deployment, label=f"run {r}", status="succeeded")
        for c in LEVELS:
            _level_create(run, c, rounds, scale=1 + r / 10)
        compare.append(run)
    return deployment, long_run, compare


def _ask(client, run, page, url, state):
    """The response to `url` with the long run as the page wants it (set outside the time)."""
    from django.core.cache import cache

    status = "running" if state == "live" else "succeeded"
    if state is not None and run.status != status:
        run.status = status
        run.save(update_fields=["status"])
    if state == "first view":
        # what a tree keeps of a finished run's samples between requests
        cache.clear()
    start, cpu = time.perf_counter(), time.thread_time()
    response = client.get(url)
    ms = (time.perf_counter() - start) * 1000
    cpu_ms = (time.thread_time() - cpu) * 1000
    assert response.status_code == 200, url
    return response, ms, cpu_ms


def _one_pass(client, run, urls, repeat):
    """{page: [[wall ms, CPU ms] of each request]}: `repeat` requests of every page in turn."""
    times = {page: [] for page, _ in PAGES}
    for _ in range(repeat):
        for page, state in PAGES:
            times[page].append(_ask(client, run, page, urls[page], state)[1:])
    return times


def _shape(client, run, page, url, state):
    """(SQL queries, bytes) of one request of `url`."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        response = _ask(client, run, page, url, state)[0]
    # read now: the next request clears the connection's query log
    return len(captured), len(response.content)


def child(tree, hours, rounds, repeat):
    """Runs inside the child process, whose environment already names its database: loads the
    data, answers "ready", then one line of JSON per pass for each line read on stdin."""
    sys.path.insert(0, str(tree))
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "moeops.settings")
    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    call_command("migrate", verbosity=0)
    start = time.perf_counter()
    deployment, long_run, compare = _populate(round(hours * 3600), rounds)
    populate_s = time.perf_counter() - start
    client = Client()
    client.force_login(User.objects.create_user("bench"))
    query = "&".join(f"run={run.uuid}" for run in compare)
    poll = f"/runs/{long_run.uuid}/status.json?figures=1"
    urls = {
        "run page": f"/runs/{long_run.uuid}/",
        "run page, first view": f"/runs/{long_run.uuid}/",
        "run page, live": f"/runs/{long_run.uuid}/",
        "poll, live: new samples": poll,
        "poll, live: nothing new": poll,
        "compare 20 runs": f"/compare/?{query}",
        "deployment page (21 runs)": f"/deployments/{deployment.pk}/",
        "dashboard": "/",
    }
    for page, state in PAGES:
        for _ in range(3):
            _ask(client, long_run, page, urls[page], state)
    long_run.status = "running"
    long_run.save(update_fields=["status"])
    since = json.loads(client.get(poll).content).get("figures_key")
    if since:
        urls["poll, live: nothing new"] += f"&since={since}"
    shapes = {page: _shape(client, long_run, page, urls[page], state) for page, state in PAGES}
    ready = {
        "vendor": connection.vendor,
        "populate_s": populate_s,
        "rounds": rounds if _rounds_stored() else 1,
        "shapes": shapes,
    }
    print(json.dumps(ready), flush=True)
    for _ in sys.stdin:
        print(json.dumps(_one_pass(client, long_run, urls, repeat)), flush=True)


def _pg_scratch(base_url, n):
    import psycopg

    parsed = urlparse(base_url)
    name = f"moeops_bench_ui_{os.getpid()}_{n}"
    admin = urlunparse(parsed._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunparse(parsed._replace(path=f"/{name}")), admin, name


def _pg_drop(admin, name):
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _start_child(tree, hours, rounds, repeat, env):
    process = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--child",
            str(tree),
            "--hours",
            str(hours),
            "--rounds",
            str(rounds),
            "--repeat",
            str(repeat),
        ],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    if not line:
        process.wait()
        raise SystemExit(f"child of {tree} failed (exit {process.returncode})")
    return process, json.loads(line)


def _measure(db, trees, args):
    """{tree name: report} of every tree on one database, measured in turns."""
    scratch, children, reports = [], {}, {}
    try:
        for n, (name, tree, hours) in enumerate(trees):
            if db == "sqlite":
                var = tempfile.TemporaryDirectory()
                scratch.append(var)
                env = {**os.environ, "MOEOPS_VAR_DIR": var.name}
                env.pop("DATABASE_URL", None)
            else:
                url, admin, pg_name = _pg_scratch(args.pg_url, n)
                scratch.append((admin, pg_name))
                env = {**os.environ, "DATABASE_URL": url}
            # loaded one after the other: two loads at once would slow each other's
            children[name], reports[name] = _start_child(tree, hours, args.rounds, args.repeat, env)
            reports[name] |= {"hours": hours, "times": {page: [] for page, _ in PAGES}}
        for _ in range(args.passes):
            for name, process in children.items():
                process.stdin.write("pass\n")
                process.stdin.flush()
                for page, times in json.loads(process.stdout.readline()).items():
                    reports[name]["times"][page] += times
    finally:
        for process in children.values():
            process.stdin.close()
            process.wait()
        for item in scratch:
            if isinstance(item, tuple):
                _pg_drop(*item)
            else:
                item.cleanup()
    return reports


def _tree(text):
    name, _, rest = text.partition("=")
    path, _, hours = rest.partition(":")
    if not name or not path:
        raise argparse.ArgumentTypeError(f"a tree is NAME=PATH[:HOURS], got {text!r}")
    return name, Path(path).resolve(), float(hours or 2)


def _print(db, reports):
    first = next(iter(reports.values()))
    print(f"\n{db}")
    print(
        f"{'tree':<10}{'hours':>6}{'rounds':>7}  {'page':<31}{'median ms':>10}{'ratio':>7}"
        f"{'CPU ms':>8}{'ratio':>7}{'queries':>8}{'KiB':>7}"
    )
    for page, _ in PAGES:
        base = _times(first, page)
        for name, report in reports.items():
            median, cpu = _times(report, page)
            queries, size = report["shapes"][page]
            print(
                f"{name:<10}{report['hours']:>6g}{report['rounds']:>7}  {page:<31}"
                f"{median:>10.1f}{median / base[0]:>7.2f}{cpu:>8.1f}{cpu / base[1]:>7.2f}"
                f"{queries:>8}{size / 1024:>7.0f}"
            )
    for name, report in reports.items():
        print(f"{name}: data loaded in {report['populate_s']:.1f} s")


def _times(report, page):
    """(median wall ms, least CPU ms) of the page's requests: the least CPU time is the one a
    busy machine sways least (the thread's own time, with SQLite's work but not PostgreSQL's)."""
    times = report["times"][page]
    return statistics.median(wall for wall, _ in times), min(cpu for _, cpu in times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--tree", type=_tree, action="append", help="NAME=PATH[:HOURS]")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per level")
    parser.add_argument("--repeat", type=int, default=3, help="requests per page and pass")
    parser.add_argument("--passes", type=int, default=7, help="turns of each tree")
    parser.add_argument("--hours", type=float, default=2.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--pg-url",
        default=os.getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/moeops"),
    )
    parser.add_argument("--child", metavar="TREE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child), args.hours, args.rounds, args.repeat)
        return

    trees = args.tree or [("this", ROOT, 2.0)]
    print(
        f"{GPUS} GPUs × 1 Hz telemetry; {COMPARE_RUNS} runs × {len(LEVELS)} levels to compare; "
        f"{args.rounds} rounds per level where stored; {args.passes} passes × {args.repeat} "
        "requests of each page per tree, trees in turns"
    )
    for db in ("sqlite", "postgres"):
        if args.db in (db, "both"):
            _print(db, _measure(db, trees, args))


if __name__ == "__main__":
    main()
