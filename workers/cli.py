"""moeops from the command line, over the REST API: `python -m workers.cli COMMAND --help`.

Configured by MOEOPS_URL (default http://127.0.0.1:8000) and MOEOPS_TOKEN. Every failure
exits non-zero with one line on stderr.

    python -m workers.cli import-results bench.jsonl --format sglang --deployment glm-5-sglang
    python -m workers.cli push-config "E=256,N=256,device_name=NVIDIA_H200.json"
    python -m workers.cli export-config 3 --style sglang --out ./configs
    python -m workers.cli runs --deployment glm-5-sglang
    python -m workers.cli push-workload chats --dataset chats.jsonl
    python -m workers.cli push-workload prod-day --trace mooncake_trace.jsonl --speed 2
    python -m workers.cli sweep --deployment glm-5-sglang --levels 8,16 --workload chats
    python -m workers.cli sweep --deployment glm-5-vllm --levels 8,16 --profile-levels 16
    python -m workers.cli step-breakdown ./traces --json

step-breakdown reads torch-profiler traces on this machine and needs neither the API nor a token.
engine-paths reads the installed engine (or --source) and needs neither either:

    python -m workers.cli engine-paths --engine vllm --capability 12.0 --tp 8 --json
"""

import argparse
import json
import os
import sys
from pathlib import Path

from domain.step_trace import TraceError, read_breakdown
from domain.workloads import DEFAULT_BLOCK_SIZE
from workers import step_profile
from workers.client import ApiError, MoeopsClient


class CliError(Exception):
    """A failure to report in one line."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _read_text(path):
    try:
        return Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror}") from None


def import_results(client, args):
    content = _read_text(args.file)
    answer = client.import_results(
        fmt=args.format,
        deployment=args.deployment,
        content=content,
        file_name=Path(args.file).name,
        label=args.label,
        accept_mismatch=args.accept_mismatch,
        requests_content=_read_text(args.requests) if args.requests else "",
    )
    run = answer["run"]
    print(f"{answer['levels']} level(s) in run {run['id']} ({run['uuid']}) of {args.deployment}")


def push_config(client, args):
    path = Path(args.file)
    content = _read_text(path)
    # SGLang keeps configs under triton_X_Y_Z/: the folder names the Triton version
    name = (
        f"{path.parent.name}/{path.name}" if path.parent.name.startswith("triton_") else path.name
    )
    config = client.push_kernel_config(name, content)
    print(
        f"kernel config {config['id']}: {config['device_name']} E={config['E']} N={config['N']} "
        f"{config['dtype']} version {config['version']}"
    )


def export_config(client, args):
    name, relative, text = client.export_kernel_config(args.id, style=args.style)
    target = Path(args.out) / relative
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    except OSError as exc:
        raise CliError(f"{target}: {exc.strerror}") from None
    print(target)


def push_workload(client, args):
    if args.dataset:
        try:
            data = Path(args.dataset).read_bytes()
        except OSError as exc:
            raise CliError(f"{args.dataset}: {exc.strerror}") from None
        spec = {"kind": "dataset", "output": None}
        file_name = Path(args.dataset).name
    elif args.trace:
        try:
            data = Path(args.trace).read_bytes()
        except OSError as exc:
            raise CliError(f"{args.trace}: {exc.strerror}") from None
        spec = {"kind": "trace", "block_size": args.block_size, "speed": args.speed}
        file_name = Path(args.trace).name
    else:
        data, file_name = None, ""
    if args.spec:
        try:
            spec = json.loads(_read_text(args.spec))
        except ValueError as exc:
            raise CliError(f"{args.spec}: not JSON ({exc})") from None
    workload = client.push_workload(
        args.name, spec, file_name=file_name, data=data, context_len=args.context_len
    )
    what = "requests" if workload["kind"] == "trace" else "prompts"
    items = f", {workload['item_count']} {what}" if workload["item_count"] else ""
    print(f"workload {workload['name']} v{workload['version']} ({workload['kind']}{items})")


def sweep(client, args):
    try:
        levels = [int(c) for c in args.levels.split(",") if c.strip()]
    except ValueError:
        raise CliError(f"--levels: comma-separated concurrencies, got {args.levels!r}") from None
    parameters = {
        "levels": levels,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "endpoint": args.endpoint,
    }
    if args.prompts_per_level is not None:
        parameters["prompts_per_level"] = args.prompts_per_level
    if args.workload:
        parameters["workload"] = args.workload
    if args.profile_levels:
        try:
            profiled = [int(c) for c in args.profile_levels.split(",") if c.strip()]
        except ValueError:
            raise CliError(
                f"--profile-levels: comma-separated concurrencies, got {args.profile_levels!r}"
            ) from None
        parameters["profile"] = {"levels": profiled, "steps": args.profile_steps}
    run = client.create_run(
        args.deployment, label=args.label, parameters=parameters, start=True, source="worker"
    )
    print(f"run {run['id']} ({run['uuid']}) queued on {run['host']}")


def runs(client, args):
    page = client.list_runs(deployment=args.deployment, status=args.status, limit=args.limit)
    header = ("ID", "UUID", "STATUS", "SOURCE", "LEVELS", "PEAK TOK/S", "CREATED", "LABEL")
    rows = [
        (
            str(run["id"]),
            run["uuid"][:8],
            run["status"],
            run["source"],
            str(run["level_count"]),
            f"{run['peak_output_throughput']:,.1f}" if run["peak_output_throughput"] else "-",
            run["created"][:19].replace("T", " "),
            run["label"],
        )
        for run in page["items"]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    if page["count"] > len(rows):
        print(f"({len(rows)} of {page['count']} runs; --limit shows more)")


def step_breakdown(args):
    breakdown = read_breakdown([Path(p) for p in args.paths], max_bytes=int(args.max_gib * 2**30))
    if args.json:
        print(breakdown.model_dump_json())
    else:
        print(step_profile.format_breakdown(breakdown))


def engine_paths(args):
    """The engine's decisions of its fast paths for a capability and TP (its own functions,
    evaluated here: tuning.engine_paths), and with --log what a start-up log says."""
    from domain.engine_paths import log_rows, merge_paths
    from tuning.engine_paths import Capability, source_paths
    from workers.engine_paths import gpu_capability

    capability = args.capability
    if capability is None:
        capability, _ = gpu_capability()
    elif capability.lower() == "cpu":
        capability = None
    else:
        try:
            capability = str(Capability.parse(capability))
        except ValueError as exc:
            raise CliError(str(exc)) from None
    model_config = None
    if args.model_config:
        try:
            model_config = json.loads(_read_text(args.model_config))
        except ValueError as exc:
            raise CliError(f"{args.model_config}: not JSON ({exc})") from None
    installed = {"flashinfer": args.flashinfer, "deep_gemm": args.deep_gemm}
    installed = {k: {"yes": True, "no": False}.get(v) for k, v in installed.items()}
    if args.torch_cuda:
        try:
            installed["torch_cuda"] = str(Capability.parse(args.torch_cuda))
        except ValueError:
            raise CliError(
                f"--torch-cuda {args.torch_cuda!r}: a CUDA version such as 12.9"
            ) from None
    paths = source_paths(
        args.engine,
        capability=capability,
        tp=args.tp,
        source_dir=args.source,
        model_config=model_config,
        installed=installed,
    )
    if args.log:
        with open(args.log, "rb") as log:
            text = log.read().decode("utf-8", errors="replace")
        paths.rows = merge_paths(log_rows(text, where=Path(args.log).name), paths.rows)
    if args.json:
        print(paths.model_dump_json(indent=2, exclude_none=True))
        return
    gpu = f"compute capability {paths.capability}" if paths.capability else "no CUDA GPU"
    print(f"{args.engine} {paths.version or '?'} on {gpu}, TP {paths.tp}")
    for note in paths.notes:
        print(f"  ({note})")
    for row in paths.rows:
        print(f"  {row.title:<30} {row.state_words:<10} {row.value or ''}")
        print(f"  {'':<30} {row.reason}")


def build_parser():
    parser = Parser(
        prog="python -m workers.cli",
        description="moeops from the command line (MOEOPS_URL, MOEOPS_TOKEN).",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    command = commands.add_parser(
        "import-results",
        help="import a load tool's result file, or a run's requests, as a run",
        description="Import SGLang bench_serving JSONL (--output-file) or vLLM --save-result "
        "JSON, each result object one level of a new run; AIPerf's "
        "profile_export_aiperf.json, guidellm's benchmarks.json or inference-perf's "
        "stage_N_lifecycle_metrics.json (docs/formats.md); or (--format moeops) a run's "
        "per-request export, its levels and rounds those of its lines.",
    )
    command.add_argument("file", help="the result file")
    command.add_argument(
        "--format",
        required=True,
        choices=("sglang", "vllm", "moeops", "aiperf", "guidellm", "inference-perf"),
    )
    command.add_argument("--deployment", required=True, help="deployment name or id")
    command.add_argument("--label", default="", help="label of the run (default: file name)")
    command.add_argument(
        "--requests",
        "--config",
        dest="requests",
        metavar="FILE",
        help="the file beside the result file: aiperf's per-request records "
        "(profile_export.jsonl), kept as the level's requests; inference-perf's run "
        "configuration (the config.yml given to --config_file, or its report's config.yaml), "
        "which names the model and engine",
    )
    command.add_argument(
        "--accept-mismatch",
        action="store_true",
        help="import a file that states another model, TP, GPU count or engine than the "
        "deployment's (refused otherwise)",
    )
    command.set_defaults(handler=import_results)

    command = commands.add_parser(
        "push-config",
        help="store a fused-MoE kernel config file",
        description="Store a vLLM/SGLang fused-MoE config file; its name gives E, N, device, "
        "dtype and block shape (a triton_X_Y_Z/ parent folder gives the Triton version).",
    )
    command.add_argument("file", help="e.g. E=256,N=256,device_name=NVIDIA_H200.json")
    command.set_defaults(handler=push_config)

    command = commands.add_parser(
        "export-config",
        help="write a stored kernel config as the engine's file",
        description="Write kernel config ID under the exact name the engine loads, in DIR "
        "(SGLang: in DIR/triton_X_Y_Z/).",
    )
    command.add_argument("id", help="kernel config id")
    command.add_argument("--style", required=True, choices=("vllm", "sglang"))
    command.add_argument("--out", required=True, metavar="DIR", help="folder to write into")
    command.set_defaults(handler=export_config)

    command = commands.add_parser(
        "runs",
        help="list a deployment's runs",
        description="List runs newest first as a table.",
    )
    command.add_argument("--deployment", required=True, help="deployment name or id")
    command.add_argument(
        "--status", choices=("queued", "running", "succeeded", "failed", "cancelled")
    )
    command.add_argument("--limit", type=int, default=50, help="most runs shown (default 50)")
    command.set_defaults(handler=runs)

    command = commands.add_parser(
        "push-workload",
        help="store a workload: a dataset file or a spec",
        description="Store a new version of workload NAME: a dataset file (ShareGPT JSON or "
        "JSONL, OpenAI messages JSONL, MT-bench questions, one prompt a line), or a spec as "
        'JSON (docs/metrics.md, "Workloads"), or both (a dataset with an output length, or a '
        "multi_turn spec whose conversations are the file's), or a timestamped trace (--trace).",
    )
    command.add_argument("name")
    dataset = command.add_mutually_exclusive_group()
    dataset.add_argument("--dataset", metavar="FILE")
    dataset.add_argument(
        "--trace",
        metavar="FILE",
        help="a Mooncake trace (JSONL or CSV: timestamp, input_length, output_length, hash_ids) "
        "replayed at its timestamps",
    )
    command.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help=f"a trace's tokens per hash id (default {DEFAULT_BLOCK_SIZE}, as AIPerf reads it)",
    )
    command.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="a trace replayed this many times as fast (2: its timestamps halved)",
    )
    command.add_argument("--spec", metavar="FILE", help="the spec as a JSON file")
    command.add_argument("--context-len", type=int, help="tokens a prompt may have")
    command.set_defaults(handler=push_workload)

    command = commands.add_parser(
        "sweep",
        help="start a sweep of a deployment on its host's worker",
        description="Queue a sweep of a deployment, optionally sending a stored workload.",
    )
    command.add_argument("--deployment", required=True, help="deployment name or id")
    command.add_argument("--levels", required=True, help="concurrencies, e.g. 8,16,32")
    command.add_argument("--input-len", type=int, default=1024)
    command.add_argument("--output-len", type=int, default=256)
    command.add_argument("--prompts-per-level", type=int)
    command.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    command.add_argument("--workload", help='a workload\'s name, "name v3" or id')
    command.add_argument("--label", default="")
    command.add_argument(
        "--profile-levels",
        help="levels to run once more after their rounds with the engine's profiler recording "
        "(README: inside the engine's step), e.g. 16",
    )
    command.add_argument(
        "--profile-steps", type=int, default=40, help="engine steps a profiled window records"
    )
    command.set_defaults(handler=sweep)

    command = commands.add_parser(
        "step-breakdown",
        help="break an engine's steps down by time class from its torch-profiler traces",
        description="Read a profiled window's traces (a folder, a .zip or *.json.gz files, one "
        "per engine rank) and print, per rank and kind of step, each class's share of the step "
        "and mean µs per step, with the step time's median, p10 and p90 (docs/metrics.md, "
        '"Inside the step"). Runs here: no MOEOPS_URL or token needed.',
    )
    command.add_argument("paths", nargs="+", metavar="DIR", help="folder, .zip or trace files")
    command.add_argument("--json", action="store_true", help="print the StepBreakdown as JSON")
    command.add_argument(
        "--max-gib", type=float, default=4.0, help="largest trace read, uncompressed (GiB)"
    )
    command.set_defaults(handler=step_breakdown, local=True)

    command = commands.add_parser(
        "engine-paths",
        help="the engine's fast paths for a GPU's compute capability, from its own source",
        description="Evaluate the installed engine's (or --source's) own decision functions "
        "for a compute capability and TP: all-reduce + RMSNorm fusion, custom all-reduce, the "
        "MoE and attention backends in the engine's order, DeepGEMM (vLLM); FlashInfer's "
        "all-reduce fusion (SGLang). Runs here: no MOEOPS_URL "
        "or token needed.",
    )
    command.add_argument("--engine", required=True, choices=("vllm", "sglang"))
    command.add_argument("--source", metavar="DIR", help="the engine's package folder")
    command.add_argument(
        "--capability", help='e.g. 12.0, or "cpu" (default: this host\'s first GPU)'
    )
    command.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    command.add_argument("--model-config", metavar="F", help="the model's config.json")
    command.add_argument(
        "--flashinfer", choices=("yes", "no"), help="installed beside the engine (default: both)"
    )
    command.add_argument(
        "--deep-gemm", choices=("yes", "no"), help="installed beside the engine (default: both)"
    )
    command.add_argument(
        "--torch-cuda",
        metavar="X.Y",
        help="the CUDA version the engine's torch is built for (SGLang's probes ask it; "
        "default: each of torch's builds)",
    )
    command.add_argument("--log", metavar="FILE", help="the engine's start-up log, read too")
    command.add_argument("--json", action="store_true", help="print EnginePaths as JSON")
    command.set_defaults(handler=engine_paths, local=True)
    return parser


def main(argv=None, transport=None):
    args = build_parser().parse_args(argv)
    if getattr(args, "local", False):
        try:
            args.handler(args)
        except (TraceError, CliError, OSError) as exc:
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 1
        return 0
    if not os.getenv("MOEOPS_TOKEN"):
        print(
            "error: MOEOPS_TOKEN is not set (create one: manage.py create_token NAME)",
            file=sys.stderr,
        )
        return 2
    # a person is waiting: fail fast, and never spool
    client = MoeopsClient(spool=False, retries=2, backoff_s=0.5, transport=transport)
    try:
        with client:
            args.handler(client, args)
    except (ApiError, CliError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
