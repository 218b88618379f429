"""The command line: `python -m workers.loadgen --base-url URL --model NAME --concurrency 32,64 …`,
one table row per level; with --rounds N, one per round and the level's median with its 95 %
interval (reports.intervals)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from reports import workloads as workload_specs
from reports.intervals import MAX_ROUNDS, level_of_rounds
from workers import vocabulary
from workers.loadgen.config import ENDPOINT_PATHS, TRANSPORTS, ClientConfig, SweepConfig
from workers.loadgen.drivers import run_sweep
from workers.loadgen.prompts import dataset_items

# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

# (title, result key, width, decimals) of the CLI's table.
TABLE_COLUMNS = (
    ("conc", "concurrency", 5, 0),
    ("ok", "completed", 6, 0),
    ("fail", "failed", 5, 0),
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
    parser.add_argument("--concurrency", required=True, help="comma-separated, e.g. 32,64,128")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--prompts-per-level", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--request-rate", type=float, default=None, help="req/s, Poisson")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    parser.add_argument("--transport", choices=TRANSPORTS, default="fast")
    parser.add_argument("--slo-ttft-ms", type=float, default=None)
    parser.add_argument("--slo-tpot-ms", type=float, default=None)
    parser.add_argument("--slo-e2el-ms", type=float, default=None)
    parser.add_argument(
        "--workload",
        default=None,
        help="a JSON file of a workload spec (reports.workloads: random lengths, shared_prefix, "
        "multi_turn, dataset); lengths in tokens",
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help="a ShareGPT JSON or JSONL, OpenAI messages JSONL or one-prompt-a-line file: its "
        "first turns are the prompts (a dataset workload)",
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
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds: from 1 to {MAX_ROUNDS}, got {args.rounds}")
    return args


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
    spec = workload_specs.spec_checked(spec)
    workload = {"spec": spec}
    if spec["kind"] == "dataset":
        if not args.dataset:
            raise ValueError("a dataset workload needs --dataset FILE")
        path = Path(args.dataset)
        parsed = workload_specs.parse_dataset(path.name, path.read_bytes())
        tokenizer = vocabulary.model_tokenizer(
            tokenizer=args.tokenizer, base_url=args.base_url, model=args.model
        )
        workload["items"] = dataset_items(parsed["items"], tokenizer)
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
        concurrencies=tuple(int(c) for c in args.concurrency.split(",") if c.strip()),
        input_len=args.input_len,
        output_len=args.output_len,
        prompts_per_level=args.prompts_per_level,
        warmup=args.warmup,
        request_rate=args.request_rate,
        processes=args.processes,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        slo_e2el_ms=args.slo_e2el_ms,
        rounds=args.rounds,
    )
    rounds: list[dict] = []

    def on_level_done(i: int, result: dict) -> None:
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

    results = run_sweep(cfg, on_level_done=on_level_done)
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    return 0
