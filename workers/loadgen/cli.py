"""The command line: `python -m workers.loadgen --base-url URL --model NAME --concurrency 32,64 …`,
one table row per level; with --rounds N, one per round and the level's median with its 95 %
interval (domain.intervals). With --capacity --slo "ttft:p99:500,tpot:p99:50" --start 1, an SLO
capacity search (domain.capacity): each level's row and the bracket as it narrows, then the
answer."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
from pathlib import Path

from domain import request_log
from domain import workloads as workload_specs
from domain.capacity import (
    DEFAULT_ROUNDS,
    MODES,
    Search,
    at_capacity,
    bracket,
    capacity_answer,
    needs_more_rounds,
    next_load,
    parse_slo,
    probe_of,
    search_problems,
)
from domain.intervals import level_of_rounds, with_interval
from domain.levels import MAX_ROUNDS, MAX_SEED
from domain.slo import DEFAULT_MAX_FAILED_PERCENT
from domain.traces import parse_trace
from workers import step_profile, vocabulary
from workers.capacity import level_at
from workers.loadgen.config import ENDPOINT_PATHS, TRANSPORTS, ClientConfig, SweepConfig
from workers.loadgen.drivers import run_level, run_sweep
from workers.loadgen.prompts import conversation_items, dataset_items

# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

# (title, result key, width, decimals) of the CLI's table.
TABLE_COLUMNS = (
    ("conc", "concurrency", 5, 0),
    ("ok", "completed", 6, 0),
    ("fail", "failed", 5, 0),
    ("rate", "request_rate", 6, 1),
    ("sent/s", "achieved_request_rate", 7, 2),
    ("dur s", "duration", 7, 1),
    ("req/s", "request_throughput", 7, 2),
    ("out tok/s", "output_throughput", 10, 1),
    ("peak tok/s", "max_output_tokens_per_s", 10, 1),
    ("TTFT ms", "mean_ttft_ms", 9, 1),
    ("p99 TTFT", "p99_ttft_ms", 9, 1),
    ("TPOT ms", "mean_tpot_ms", 8, 2),
    ("p99 TPOT", "p99_tpot_ms", 8, 2),
    ("ITL ms", "mean_itl_ms", 8, 2),
    ("p99 ITL", "p99_itl_ms", 8, 2),
)


def format_level(result: dict, header: bool) -> str:
    """One table row for a level result (and the header line above it when header is true).

    A level whose every request failed with one error shows that error, verbatim, first."""
    cells = []
    for _, key, width, decimals in TABLE_COLUMNS:
        value = result.get(key)
        cells.append("-".rjust(width) if value is None else f"{value:>{width}.{decimals}f}")
    row = " ".join(cells)
    if result.get("all_failed_with"):
        total = result.get("failed")
        row = (
            f"{result.get('concurrency')!s:>5} every request failed ({total} of {total}): "
            f"{result['all_failed_with']}"
        )
    else:
        if result.get("errors"):
            row += "  " + ", ".join(f"{k}={v}" for k, v in sorted(result["errors"].items()))
        if not result.get("usage_reported"):
            row += "  (no usage from the server: token figures left out)"
    if not header:
        return row
    titles = " ".join(title.rjust(width) for title, _, width, _ in TABLE_COLUMNS)
    return titles + "\n" + row


# (title, result key, decimals) of the intervals printed under a level of several rounds.
INTERVAL_COLUMNS = (
    ("out tok/s", "output_throughput", 1),
    ("p99 TTFT ms", "p99_ttft_ms", 1),
    ("p99 TPOT ms", "p99_tpot_ms", 2),
    ("p99 ITL ms", "p99_itl_ms", 2),
)


def format_rounds(rounds: list[dict]) -> str:
    """The median row of a level's rounds and, under it, the 95 % interval of its key figures
    ("one round: no interval" where a figure has none)."""
    level = level_of_rounds(rounds)
    row = format_level({**level, "concurrency": rounds[0].get("concurrency")}, header=False)
    spans = []
    for title, key, decimals in INTERVAL_COLUMNS:
        interval = level["intervals"].get(key)
        if interval is not None:
            spans.append(f"{title} {interval[0]:.{decimals}f}–{interval[1]:.{decimals}f}")
    intervals = ", ".join(spans) if spans else "one round: no interval"
    return f"{row}  median of {len(rounds)} rounds\n      95 % interval: {intervals}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workers.loadgen", description="Concurrency sweep of an OpenAI endpoint."
    )
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--endpoint", choices=sorted(ENDPOINT_PATHS), default="completions")
    parser.add_argument("--concurrency", help="comma-separated, e.g. 32,64,128")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--prompts-per-level", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument(
        "--request-rate",
        default=None,
        help="req/s, comma-separated for a level per rate (each capped by each --concurrency)",
    )
    parser.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the gaps between requests: 1 Poisson, <1 burstier, >1 more even",
    )
    parser.add_argument(
        "--ramp-up-s", type=float, default=0.0, help="the rate rises from 0 over these seconds"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"times each level runs in a row (1 to {MAX_ROUNDS}): the median and a 95 %% interval",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="the model's tokenizer.json or folder: prompt token ids are drawn from its vocabulary",
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="the model's vocabulary size, when no --tokenizer is at hand",
    )
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0, help="per request, s")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="draws the prompts (default: a new one each run, printed). The same seed sends "
        "the same prompts again, which the engine's prefix cache then serves warm",
    )
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    parser.add_argument("--transport", choices=TRANSPORTS, default="fast")
    parser.add_argument("--slo-ttft-ms", type=float, default=None)
    parser.add_argument("--slo-tpot-ms", type=float, default=None)
    parser.add_argument("--slo-e2el-ms", type=float, default=None)
    parser.add_argument(
        "--workload",
        default=None,
        help="a JSON file of a workload spec (domain.workloads: random lengths, shared_prefix, "
        "multi_turn, dataset, trace); lengths in tokens",
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help="a ShareGPT JSON or JSONL, OpenAI messages JSONL, MT-bench question or "
        "one-prompt-a-line file: its first turns are the prompts (a dataset workload), or with "
        "a multi_turn --workload every turn of its conversations, or with a trace --workload "
        "the Mooncake trace it replays (JSONL or CSV)",
    )
    parser.add_argument(
        "--random-range-ratio",
        type=float,
        default=None,
        help="input and output lengths uniform around --input-len and --output-len, as "
        "--range-ratio-convention's engine reads the ratio (docs/metrics.md)",
    )
    parser.add_argument(
        "--range-ratio-convention", choices=workload_specs.RANGE_RATIO_CONVENTIONS, default="vllm"
    )
    parser.add_argument("--output", default=None, help="write the JSON list of levels here")
    search = parser.add_argument_group("capacity search (--capacity)")
    search.add_argument(
        "--capacity",
        action="store_true",
        help="search the largest load whose levels meet --slo (rounds default to 3)",
    )
    search.add_argument(
        "--slo", help='limits, metric:percentile:ms, e.g. "ttft:p99:500,tpot:p99:50"'
    )
    search.add_argument(
        "--max-failed-percent", type=float, default=DEFAULT_MAX_FAILED_PERCENT, help="%%"
    )
    search.add_argument("--mode", choices=MODES, default="concurrency")
    # a float, as --start 4 parses to: the whole-number check reads float.is_integer
    search.add_argument(
        "--start", type=float, default=1.0, help="first load (concurrency or req/s)"
    )
    search.add_argument("--end", type=float, default=None, help="highest load tried")
    search.add_argument("--budget", type=int, default=None, help="most levels run")
    parser.add_argument(
        "--save-requests", default=None, help="write every request here, one JSON line each"
    )
    profile = parser.add_argument_group(
        "inside the step (vLLM started with --profiler-config; docs/metrics.md)"
    )
    profile.add_argument(
        "--profile-levels",
        default="",
        help="comma-separated concurrencies of the sweep to run once more after the sweep, "
        "with the engine's profiler recording a window of steps; the breakdown is printed and "
        "written into --output",
    )
    profile.add_argument(
        "--profile-steps", type=int, default=40, help="engine steps the window records"
    )
    args = parser.parse_args(argv)
    _check_profile(parser, args)
    if args.rounds is None:
        args.rounds = DEFAULT_ROUNDS if args.capacity else 1
    try:
        args.request_rates = tuple(
            float(r) for r in (args.request_rate or "").split(",") if r.strip()
        )
    except ValueError:
        parser.error(f"--request-rate: numbers of req/s, got {args.request_rate!r}")
    if any(not 0 < r < float("inf") for r in args.request_rates):
        parser.error(f"--request-rate: each above 0 and finite, got {args.request_rate!r}")
    if not args.burstiness > 0:
        parser.error(f"--burstiness: above 0, got {args.burstiness}")
    if not 0 <= args.ramp_up_s < float("inf"):
        parser.error(f"--ramp-up-s: at least 0, got {args.ramp_up_s}")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds: from 1 to {MAX_ROUNDS}, got {args.rounds}")
    if args.seed is None:
        args.seed = secrets.randbelow(MAX_SEED + 1)
    elif not 0 <= args.seed <= MAX_SEED:
        parser.error(f"--seed: from 0 to {MAX_SEED}, got {args.seed}")
    if args.capacity:
        try:
            args.limits = parse_slo(args.slo or "")
        except ValueError as exc:
            parser.error(f"--slo: {exc}")
        if args.mode == "concurrency":
            args.start = int(args.start) if args.start.is_integer() else args.start
            if args.end is not None and args.end.is_integer():
                args.end = int(args.end)
        problems = search_problems(args.mode, args.start, args.end, args.budget)
        for name, sentence in problems.items():
            parser.error(f"--{name}: {sentence}")
    elif not args.concurrency:
        parser.error("--concurrency is required (or --capacity)")
    return args


def _check_profile(parser, args) -> None:
    """--profile-levels as a list of the sweep's concurrencies, --profile-steps in range."""
    try:
        args.profile_levels = [int(c) for c in args.profile_levels.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--profile-levels: concurrencies, got {args.profile_levels!r}")
    if not 1 <= args.profile_steps <= 10_000:
        parser.error(f"--profile-steps: from 1 to 10000, got {args.profile_steps}")
    if args.profile_levels and args.capacity:
        parser.error("--profile-levels: profiles a sweep's levels, not a capacity search's")
    sweep_levels = {int(c) for c in (args.concurrency or "").split(",") if c.strip().isdigit()}
    for c in args.profile_levels:
        if c not in sweep_levels:
            parser.error(f"--profile-levels: {c} is not one of --concurrency {args.concurrency}")


def _workload(args: argparse.Namespace) -> dict | None:
    """The workload the arguments name (None: random ids of fixed lengths); raises ValueError
    (WorkloadError, DatasetFileError) with a sentence."""
    spec = None
    if args.workload:
        spec = json.loads(Path(args.workload).read_text())
    elif args.dataset:
        spec = {"kind": "dataset", "output": None}
    elif args.random_range_ratio is not None:
        spec = {
            "kind": "random",
            **{
                key: workload_specs.range_ratio_length(
                    length, args.random_range_ratio, args.range_ratio_convention
                )
                for key, length in (("input", args.input_len), ("output", args.output_len))
            },
        }
    if spec is None:
        return None
    if spec.get("kind") == "multi_turn" and args.dataset:
        spec = {**spec, "from_file": True}
    spec = workload_specs.spec_checked(spec)
    workload = {"spec": spec}
    if spec["kind"] == "trace":
        if not args.dataset:
            raise ValueError("a trace workload needs --dataset FILE, the trace")
        if args.capacity or args.request_rate:
            raise ValueError(
                "a trace sends at its own timestamps: no --request-rate or --capacity (its "
                "spec's speed sets how fast)"
            )
        path = Path(args.dataset)
        parsed = parse_trace(path.name, path.read_bytes(), block_size=spec["block_size"])
        workload["items"] = parsed["items"]
    elif spec["kind"] == "dataset" or spec.get("from_file"):
        if not args.dataset:
            raise ValueError(f"a {spec['kind']} workload of a file needs --dataset FILE")
        path = Path(args.dataset)
        parsed = workload_specs.parse_dataset(path.name, path.read_bytes())
        tokenizer = vocabulary.model_tokenizer(
            tokenizer=args.tokenizer, base_url=args.base_url, model=args.model
        )
        prepare = dataset_items if spec["kind"] == "dataset" else conversation_items
        workload["items"] = prepare(parsed["items"], tokenizer)
    return workload


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints one table row per level, returns the exit status."""
    args = _parse_args(argv)
    try:
        workload = _workload(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    vocab_size = None
    if args.endpoint == "completions":
        try:
            vocab_size, source = vocabulary.resolve(
                vocab_size=args.vocab_size,
                tokenizer=args.tokenizer,
                base_url=args.base_url,
                model=args.model,
            )
        except vocabulary.VocabularyUnknown as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        # on stderr: stdout is the table, for pipes
        print(
            f"prompt token ids drawn from a vocabulary of {vocab_size:,} ({source})",
            file=sys.stderr,
        )
    print(f"prompts of seed {args.seed} (--seed {args.seed} sends them again)", file=sys.stderr)
    limits = getattr(args, "limits", {})

    def goodput_limit(metric, given):
        # the search's own limits count each request's goodput unless asked otherwise
        return given if given is not None else (limits.get(metric) or (None, None))[1]

    cfg = SweepConfig(
        client=ClientConfig(
            base_url=args.base_url,
            model=args.model,
            endpoint=args.endpoint,
            timeout_s=args.timeout,
            vocab_size=vocab_size,
            seed=args.seed,
            api_key=args.api_key,
            transport=args.transport,
            workload=workload,
        ),
        concurrencies=tuple(int(c) for c in (args.concurrency or "").split(",") if c.strip()),
        input_len=args.input_len,
        output_len=args.output_len,
        prompts_per_level=args.prompts_per_level,
        warmup=args.warmup,
        request_rates=args.request_rates,
        burstiness=args.burstiness,
        ramp_up_s=args.ramp_up_s,
        processes=args.processes,
        slo_ttft_ms=goodput_limit("ttft", args.slo_ttft_ms),
        slo_tpot_ms=goodput_limit("tpot", args.slo_tpot_ms),
        slo_e2el_ms=goodput_limit("e2el", args.slo_e2el_ms),
        rounds=args.rounds,
    )
    if args.capacity:
        return capacity_search(args, cfg)
    rounds: list[dict] = []
    saved = open(args.save_requests, "w") if args.save_requests else None  # noqa: SIM115

    def on_level_done(i: int, result: dict) -> None:
        columns = result.pop("requests")
        if saved is not None:
            level = {key: result.get(key, 1) for key in request_log.LEVEL_KEYS}
            for request in request_log.rows(columns):
                saved.write(request_log.export_line(level, request) + "\n")
        print(format_level(result, header=i == 0 and len(rounds) == 0), flush=True)
        rounds.append(result)
        if len(rounds) == cfg.rounds and cfg.rounds > 1:
            print(format_rounds(rounds), flush=True)
        if len(rounds) == cfg.rounds:
            rounds.clear()
        for turn in result.get("ttft_by_turn") or []:
            mean = turn["mean_ttft_ms"]
            shown = "-" if mean is None else f"{mean:.1f}"
            print(f"      turn {turn['turn']}: TTFT {shown} ms, {turn['failed']} failed")

    try:
        results = run_sweep(cfg, on_level_done=on_level_done)
    finally:
        if saved is not None:
            saved.close()
    profiles = [profile_after(cfg, level, results, args) for level in cfg.levels()]
    profiles = [p for p in profiles if p is not None]
    if args.output:
        # each round's seed: --seed with it sends that round's prompts again
        for result in results:
            result["seed"] = cfg.round_client(result.get("round", 1)).seed
        written = {"levels": results, "profiles": profiles} if args.profile_levels else results
        Path(args.output).write_text(json.dumps(written, indent=2) + "\n")
    return 0


def profile_after(cfg, level, results, args) -> dict | None:
    """The LevelProfile body of level's profiled pass (printed as it comes), where
    --profile-levels asks for it; its cost is judged against the level's rounds."""
    if level.concurrency not in args.profile_levels:
        return None
    rounds = [
        r.get("output_throughput") or 0.0
        for r in results
        if r["concurrency"] == level.concurrency and r.get("request_rate") == level.request_rate
    ]
    print(
        f"profiling concurrency {level.concurrency}: {args.profile_steps} engine steps",
        file=sys.stderr,
    )
    body = step_profile.profile_level(
        cfg.round_client(cfg.rounds + 1),
        level,
        steps=args.profile_steps,
        unprofiled_tok_s=sorted(rounds)[len(rounds) // 2] if rounds else None,
    )
    print(step_profile.describe(body), flush=True)
    return body


def _verdict(probe):
    check = probe.conservative.binding
    said = check.sentence() if check is not None else ""
    if not probe.conservative.failures_met:
        said = f"failed {probe.conservative.failed_percent or 0:.3g} %"
    medians = "" if probe.met_on_medians else "; fails on medians too"
    return f"{'meets' if probe.met else 'fails'} ({said}{medians})"


def answer_text(search, answer):
    """The answer in lines: the capacity, its bracket, the one on medians, what binds, and the
    capacity point's figures."""
    if answer["load"] is None:
        lines = ["No load tried meets the SLO."]
    else:
        low, high = answer["bracket"]
        upper = "" if high is None else f", bracket {low:g}–{high:g}"
        capacity = search.load_text(answer["load"])
        lines = [f"Capacity: {capacity}{upper} (every 95 % upper bound within the SLO)"]
    if answer["load_on_medians"] is not None:
        lines.append(f"On medians: {search.load_text(answer['load_on_medians'])}")
    if answer["binding"]:
        lines.append(answer["binding"]["sentence"])
    if answer["level"] is not None:
        point = at_capacity(answer["level"])
        throughput = point["output_throughput"]
        if throughput is not None:
            interval = point["output_throughput_interval"]
            lines.append(f"Output tok/s there: {with_interval(throughput, interval, 1)}")
        if point["per_user"] is not None:
            lines.append(f"tok/s per user there: {point['per_user']:.1f}")
        if point["request_goodput"] is not None:
            lines.append(f"Goodput there: {point['request_goodput']:.2f} req/s")
    return "\n".join(lines)


def capacity_search(args, cfg) -> int:
    """Run the capacity search: each level's median row (with its rounds' interval) and the
    bracket after it, then the answer; --output gets the answer and every level as JSON."""
    search = Search(
        args.mode, args.start, args.end, **({"budget": args.budget} if args.budget else {})
    )
    probes, levels = [], []
    while (load := next_load(search, probes)) is not None:
        level = level_at(cfg, search, load, len(probes))
        rounds = []
        for number in range(1, cfg.rounds + 1):
            rounds.append(asyncio.run(run_level(cfg.round_client(number), level)))
        probe = probe_of(args.limits, args.max_failed_percent, load, level_of_rounds(rounds))
        while needs_more_rounds(probe, len(rounds)):
            said = f"{search.load_text(load)} straddles a limit: round {len(rounds) + 1}"
            print(f"  {said}", flush=True)
            rounds.append(asyncio.run(run_level(cfg.round_client(len(rounds) + 1), level)))
            probe = probe_of(args.limits, args.max_failed_percent, load, level_of_rounds(rounds))
        print(
            format_rounds(rounds) if cfg.rounds > 1 else format_level(rounds[0], header=not probes),
            flush=True,
        )
        levels.append({**probe.level, "rounds": rounds})
        probes.append(probe)
        low, high = bracket(probes)
        where = f"bracket {low if low is not None else '?'}–{high if high is not None else '?'}"
        print(f"  {search.load_text(load)} {_verdict(probes[-1])}; {where}", flush=True)
    answer = capacity_answer(search, probes)
    print(answer_text(search, answer), flush=True)
    if args.output:
        Path(args.output).write_text(
            json.dumps({"answer": answer, "levels": levels}, indent=2) + "\n"
        )
    return 0
