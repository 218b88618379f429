"""Server time of the heavy UI pages, on SQLite and PostgreSQL.

For each database: a fresh database, migrations, then the data of a long sweep: one run of
6 concurrency levels over 2 h with 1 Hz telemetry on 8 GPUs (57,600 samples) and 7,200 engine
samples, and 20 more runs of 6 levels each for the compare page. Each page is requested
through Django's test client in-process (URL routing, views, queries, templates, JSON; no
network), a few times to warm up, then `--repeat` times; the table gives median and p95 ms
and the number of SQL queries of one request.

Targets (issue 7): run page < 300 ms, compare of 20 runs < 200 ms.

    .venv/bin/python bench/ui_pages.py                      # both databases
    .venv/bin/python bench/ui_pages.py --db sqlite --repeat 30

PostgreSQL comes from --pg-url (default: $DATABASE_URL or postgres://postgres@127.0.0.1:5432/
moeops); a scratch database `moeops_bench_ui_<pid>` is created next to it and dropped after.
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
SECONDS = 2 * 3600
LEVELS = (32, 64, 128, 256, 512, 1024)
COMPARE_RUNS = 20
TARGETS_MS = {"run page": 300.0, "compare 20 runs": 200.0}

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


def _populate():
    from moeops.fleet.models import GPU, Deployment, Host, ModelSpec
    from moeops.runs.models import (
        EngineSample,
        LevelResult,
        SweepRun,
        TelemetrySample,
        level_key,
    )

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
    long_run = SweepRun.objects.create(deployment=deployment, label="2 h sweep", status="succeeded")
    span = SECONDS / len(LEVELS)
    for i, c in enumerate(LEVELS):
        LevelResult.objects.create(
            run=long_run,
            key=level_key(c, None),
            started_at=t0 + i * span,
            finished_at=t0 + (i + 1) * span - 1,
            **_level_fields(c),
        )
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
            for s in range(SECONDS)
            for g in range(GPUS)
        ),
        batch_size=5000,
    )
    EngineSample.objects.bulk_create(
        (
            EngineSample(run=long_run, ts=t0 + s, running=s % 257, queued=s % 300)
            for s in range(SECONDS)
        ),
        batch_size=5000,
    )
    compare = []
    for r in range(COMPARE_RUNS):
        run = SweepRun.objects.create(deployment=deployment, label=f"run {r}", status="succeeded")
        LevelResult.objects.bulk_create(
            LevelResult(run=run, key=level_key(c, None), **_level_fields(c, 1 + r / 10))
            for c in LEVELS
        )
        compare.append(run)
    return deployment, long_run, compare


def _measure(client, url, repeat):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(3):
        assert client.get(url).status_code == 200, url
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    # read now: the next request clears the connection's query log
    queries = len(captured)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, url
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "p95_ms": times[min(len(times) - 1, round(0.95 * (len(times) - 1)))],
        "queries": queries,
        "bytes": len(response.content),
    }


def child(repeat):
    """Runs inside the child process, whose environment already names its database."""
    sys.path.insert(0, str(ROOT))
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "moeops.settings")
    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    start = time.perf_counter()
    deployment, long_run, compare = _populate()
    populate_s = time.perf_counter() - start
    client = Client()
    client.force_login(User.objects.create_user("bench"))
    query = "&".join(f"run={run.uuid}" for run in compare)
    pages = {
        "run page": f"/runs/{long_run.uuid}/",
        "run status poll (with charts)": f"/runs/{long_run.uuid}/status.json?figures=1",
        "compare 20 runs": f"/compare/?{query}",
        "deployment page (21 runs)": f"/deployments/{deployment.pk}/",
        "dashboard": "/",
    }
    results = {name: _measure(client, url, repeat) for name, url in pages.items()}
    from django.db import connection

    print(
        json.dumps(
            {"vendor": connection.vendor, "populate_s": populate_s, "pages": results},
        )
    )


def _pg_scratch(base_url):
    import psycopg

    parsed = urlparse(base_url)
    name = f"moeops_bench_ui_{os.getpid()}"
    admin = urlunparse(parsed._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunparse(parsed._replace(path=f"/{name}")), admin, name


def _run_child(env, repeat):
    result = subprocess.run(
        [sys.executable, __file__, "--child", "--repeat", str(repeat)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"child failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--pg-url",
        default=os.getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/moeops"),
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.repeat)
        return

    reports = []
    if args.db in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as var:
            env = {**os.environ, "MOEOPS_VAR_DIR": var}
            env.pop("DATABASE_URL", None)
            reports.append(_run_child(env, args.repeat))
    if args.db in ("postgres", "both"):
        import psycopg

        url, admin, name = _pg_scratch(args.pg_url)
        try:
            reports.append(_run_child({**os.environ, "DATABASE_URL": url}, args.repeat))
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    print(
        f"{GPUS} GPUs × {SECONDS} s telemetry = {GPUS * SECONDS:,} samples; "
        f"{COMPARE_RUNS} runs × {len(LEVELS)} levels to compare; {args.repeat} requests each"
    )
    print(f"{'database':<11}{'page':<32}{'median ms':>10}{'p95 ms':>9}{'queries':>9}{'KiB':>8}")
    for report in reports:
        for page, r in report["pages"].items():
            target = TARGETS_MS.get(page)
            verdict = "" if target is None else ("  ok" if r["p95_ms"] < target else "  SLOW")
            print(
                f"{report['vendor']:<11}{page:<32}{r['median_ms']:>10.1f}{r['p95_ms']:>9.1f}"
                f"{r['queries']:>9}{r['bytes'] / 1024:>8.0f}{verdict}"
            )
        print(f"{report['vendor']:<11}(data loaded in {report['populate_s']:.1f} s)")


if __name__ == "__main__":
    main()
