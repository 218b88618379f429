"""Telemetry ingest through the REST API, on SQLite and PostgreSQL.

For each database: a fresh database, `manage.py migrate`, gunicorn serving moeops on a free
port (one worker per client), and clients that POST /api/v1/runs/{id}/telemetry in batches
of 5,000 samples (8 GPUs × 625 readings) over keep-alive httpx connections. The request
bodies are encoded before the clock starts: what is measured is the web tier's ingest
(HTTP, JSON parsing, validation, auth, the insert and the commit), not the client's encoder.
Each run ends by checking that the API holds every sample once.

    .venv/bin/python bench/api_ingest.py                       # both databases
    .venv/bin/python bench/api_ingest.py --db postgres --clients 1,2,4 --batches 40

PostgreSQL comes from --pg-url (default: $DATABASE_URL or postgres://postgres@127.0.0.1:5432/
moeops); a scratch database `moeops_bench_<pid>` is created next to it and dropped after.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from domain.latency_stats import percentile  # noqa: E402
from localstack.ports import free_port  # noqa: E402
from workers.client import MoeopsClient  # noqa: E402

PYTHON = sys.executable
GPUS = 8

GLM5_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "hidden_size": 6144,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 78,
}


def _manage(env, *args):
    result = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout.strip()


def _batch_body(batch_index, batch_size):
    """One telemetry batch: batch_size samples, GPUS per timestamp, 1 Hz."""
    t0 = 1.7e9 + batch_index * (batch_size // GPUS)
    samples = [
        {
            "gpu_index": i % GPUS,
            "ts": t0 + i // GPUS,
            "level_concurrency": 128,
            "gpu_util": 87.0 + (i % 13),
            "mem_util": 41.5,
            "power_w": 512.25 + (i % 7),
            "power_limit_w": 600.0,
            "mem_used_mib": 90112.0,
            "mem_total_mib": 97887.0,
            "sm_clock_mhz": 1980.0,
            "temperature_c": 61.0 + (i % 5),
        }
        for i in range(batch_size)
    ]
    return json.dumps({"batch_id": f"bench-{batch_index}", "samples": samples}).encode()


class Server:
    """gunicorn serving moeops against one database, with a token and a run to fill."""

    def __init__(self, database_url, workers):
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DEBUG": "0",
            # whitenoise warns about a missing collectstatic folder the API never uses
            "PYTHONWARNINGS": "ignore:No directory at",
        }
        self.port = free_port()
        self.workers = workers
        self.process = None

    def __enter__(self):
        self.process = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "gunicorn",
                "moeops.wsgi",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                str(self.workers),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=self.env,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/v1/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)
        raise SystemExit("gunicorn did not answer /api/v1/health within 60 s")

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"


def _prepare(env, url, tag):
    """A token, a host, a model, a deployment and a run; returns (token, run id)."""
    token = _manage(env, "create_token", f"bench-{tag}")
    with MoeopsClient(url, token, spool=False, retries=0) as api:
        api.request("POST", "/hosts", body={"name": "bench-host"})
        api.request("POST", "/models", body={"name": "GLM-5", "config": GLM5_CONFIG})
        deployment = {"name": "bench", "model": "GLM-5", "host": "bench-host", "tp": 8}
        api.request("POST", "/deployments", body=deployment)
        run = api.create_run("bench", label=f"ingest {tag}")
    return token, run["id"]


def _measure(url, token, run_id, bodies, clients):
    """POST every body once, `clients` at a time; returns (seconds, request latencies)."""
    queue = list(enumerate(bodies))
    lock = threading.Lock()
    latencies, failures = [], []
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def client():
        with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    _, body = queue.pop()
                start = time.perf_counter()
                response = http.post(f"/api/v1/runs/{run_id}/telemetry", content=body)
                elapsed = time.perf_counter() - start
                with lock:
                    latencies.append(elapsed)
                    if response.status_code != 201:
                        failures.append(f"{response.status_code} {response.text[:200]}")

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    if failures:
        raise SystemExit(f"{len(failures)} requests failed, e.g. {failures[0]}")
    return seconds, latencies


def _stored(url, token, run_id):
    with MoeopsClient(url, token, spool=False, retries=0, timeout_s=120) as api:
        response = api.request("GET", f"/runs/{run_id}/telemetry", params={"limit": 1})
    return response.json()["count"]


def _pg_admin(pg_url, sql):
    import psycopg

    # CREATE/DROP DATABASE run from the server's maintenance database
    admin = urlunparse(urlparse(pg_url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql)


def _databases(kinds, pg_url, scratch):
    """(label, DATABASE_URL, cleanup) for a fresh database of each kind."""
    for kind in kinds:
        if kind == "sqlite":
            path = Path(scratch) / f"bench-{time.monotonic_ns()}.sqlite3"
            yield "SQLite", f"sqlite:///{path}", lambda path=path: path.unlink(missing_ok=True)
        else:
            name = f"moeops_bench_{os.getpid()}_{time.monotonic_ns() % 10**6}"
            _pg_admin(pg_url, f'CREATE DATABASE "{name}"')
            url = urlunparse(urlparse(pg_url)._replace(path=f"/{name}"))
            yield (
                "PostgreSQL",
                url,
                lambda name=name: _pg_admin(
                    pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
                ),
            )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite,postgres", help="sqlite,postgres (default both)")
    parser.add_argument("--clients", default="1,2,4", help="concurrent clients, e.g. 1,2,4")
    parser.add_argument("--batches", type=int, default=24, help="batches per measurement")
    parser.add_argument("--batch-size", type=int, default=5000, help="samples per batch")
    parser.add_argument(
        "--pg-url",
        default=os.getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/moeops"),
        help="a PostgreSQL server to create the scratch database on",
    )
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.db.split(",") if k.strip()]
    clients = [int(c) for c in args.clients.split(",")]
    bodies = [_batch_body(i, args.batch_size) for i in range(args.batches)]
    print(
        f"{args.batches} batches × {args.batch_size} samples "
        f"({len(bodies[0]) / 1e6:.2f} MB per request), {os.cpu_count()} CPUs here"
    )
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for label, url, cleanup in _databases(kinds, args.pg_url, scratch):
            try:
                env = {**os.environ, "DATABASE_URL": url}
                _manage(env, "migrate", "--noinput")
                for count in clients:
                    with Server(url, workers=count) as server:
                        token, run_id = _prepare(env, server.url, f"{label}-{count}")
                        warmup = [_batch_body(10**6 + i, args.batch_size) for i in range(count)]
                        _measure(server.url, token, run_id, warmup, count)
                        seconds, latencies = _measure(server.url, token, run_id, bodies, count)
                        stored = _stored(server.url, token, run_id)
                    expected = (len(bodies) + len(warmup)) * args.batch_size
                    if stored != expected:
                        raise SystemExit(f"{label}: {stored} samples stored, {expected} sent")
                    samples = len(bodies) * args.batch_size
                    rows.append(
                        (
                            label,
                            count,
                            samples,
                            seconds,
                            samples / seconds,
                            percentile(latencies, 50) * 1000,
                        )
                    )
                    print(f"  {label}, {count} client(s): {samples / seconds:,.0f} samples/s")
            finally:
                cleanup()
    print()
    print(
        f"{'database':<11} {'clients':>7} {'samples':>9} {'seconds':>8} "
        f"{'samples/s':>10} {'p50 ms/req':>10}"
    )
    for label, count, samples, seconds, rate, p50 in rows:
        print(f"{label:<11} {count:>7} {samples:>9,} {seconds:>8.2f} {rate:>10,.0f} {p50:>10.1f}")


if __name__ == "__main__":
    main()
