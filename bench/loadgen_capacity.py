"""Client capacity: moeops' load generator against minimal aiohttp streaming clients.

All clients stream from the same instant SSE server (the stand-in engine with zero step time and
room for every stream, in its own process) at the same concurrency, each client in a fresh
process. For each we report content chunks received per second of wall time and the CPU seconds
the client process used; the goal is ≥ 1.0× the aiohttp client, so that the client is never what
limits a sweep.

    .venv/bin/python bench/loadgen_capacity.py [--concurrency 1024] [--output-len 256]
"""

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

# Run as a script from anywhere: the repository root holds the workers package.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localstack.standin import spawn_standin  # noqa: E402
from workers import loadgen  # noqa: E402

CLIENTS = ("moeops", "moeops-httpx-pool", "aiohttp-iter-any", "aiohttp-lines")


def _payload(i: int, output_len: int) -> dict:
    return {
        "model": "standin",
        "prompt": [1000 + i % 1000] * 16,
        "max_tokens": output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _aiohttp_client(url: str, concurrency: int, requests: int, output_len: int, lines: bool):
    """The minimal aiohttp streaming client: timestamp per read, json per SSE event, count
    content chunks. lines=True iterates the body line by line (the classic form)."""
    semaphore = asyncio.Semaphore(concurrency)
    chunks = 0

    def on_event(payload: bytes) -> None:
        nonlocal chunks
        if payload == b"[DONE]":
            return
        obj = json.loads(payload)
        if obj["choices"] and obj["choices"][0].get("text"):
            chunks += 1

    async def one(session, i: int) -> None:
        async with semaphore, session.post(url, json=_payload(i, output_len)) as response:
            if lines:
                async for line in response.content:
                    time.perf_counter()
                    if line.startswith(b"data: "):
                        on_event(line[6:].rstrip())
                return
            tail = b""
            async for data in response.content.iter_any():
                time.perf_counter()
                *events, tail = (tail + data).split(b"\n\n")
                for event in events:
                    on_event(event[6:])

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(one(session, i) for i in range(requests)))
        return chunks, time.perf_counter() - start


def run_client(name: str, base_url: str, concurrency: int, requests: int, output_len: int) -> dict:
    """Run one client once in this process; returns {chunks, wall_s, cpu_s}."""
    cpu0 = time.process_time()
    if name.startswith("moeops"):
        client = loadgen.ClientConfig(
            base_url=base_url,
            model="standin",
            vocab_size=32000,
            transport="httpx" if name == "moeops-httpx-pool" else "fast",
        )
        level = loadgen.LevelConfig(
            concurrency=concurrency, input_len=16, output_len=output_len, num_prompts=requests
        )
        result = asyncio.run(loadgen.run_level(client, level))
        chunks, wall = result["content_chunks"], result["duration"]
        failed = result["failed"]
    else:
        url = base_url + "/v1/completions"
        chunks, wall = asyncio.run(
            _aiohttp_client(url, concurrency, requests, output_len, name == "aiohttp-lines")
        )
        failed = requests - chunks // output_len
    return {"chunks": chunks, "wall_s": wall, "cpu_s": time.process_time() - cpu0, "failed": failed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--requests", type=int, default=None, help="default 2 × concurrency")
    parser.add_argument("--repeat", type=int, default=3, help="runs per client; best is kept")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    requests = args.requests or 2 * args.concurrency
    if args.client:
        print(
            json.dumps(
                run_client(args.client, args.url, args.concurrency, requests, args.output_len)
            )
        )
        return

    url, server = spawn_standin(
        [
            "--max-running-requests", str(args.concurrency),
            "--step-ms-base", "0", "--step-ms-per-req", "0", "--prefill-ms-per-token", "0",
            "--max-total-tokens", str(1 << 30),
        ]
    )  # fmt: skip
    best: dict[str, dict] = {}
    try:
        for _ in range(args.repeat):
            for name in args.clients.split(","):
                out = subprocess.run(
                    [
                        sys.executable, __file__, "--client", name, "--url", url,
                        "--concurrency", str(args.concurrency), "--requests", str(requests),
                        "--output-len", str(args.output_len),
                    ],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                run = json.loads(out.stdout)
                run["chunks_per_s"] = run["chunks"] / run["wall_s"]
                if name not in best or run["chunks_per_s"] > best[name]["chunks_per_s"]:
                    best[name] = run
    finally:
        server.terminate()
        server.wait(5)

    base = best.get("aiohttp-iter-any")
    print(
        f"concurrency {args.concurrency}, {requests} requests × {args.output_len} chunks, "
        f"best of {args.repeat}; instant stand-in server in its own process"
    )
    print(
        f"{'client':<20} {'chunks/s':>10} {'CPU s':>7} {'CPU busy':>9} {'µs CPU/chunk':>13}"
        f" {'vs aiohttp':>11}"
    )
    for name, run in best.items():
        ratio = f"{run['chunks_per_s'] / base['chunks_per_s']:.2f}×" if base else "-"
        per_chunk = run["cpu_s"] / max(run["chunks"], 1) * 1e6
        failed = f"  ({run['failed']} failed)" if run["failed"] else ""
        # CPU busy near 100% means the client limits the rate; lower, the server does.
        busy = f"{run['cpu_s'] / run['wall_s']:.0%}"
        print(
            f"{name:<20} {run['chunks_per_s']:>10.0f} {run['cpu_s']:>7.2f} {busy:>9}"
            f" {per_chunk:>13.2f} {ratio:>11}{failed}"
        )


if __name__ == "__main__":
    main()
