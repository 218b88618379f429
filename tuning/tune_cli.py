"""`python -m tuning tune`: tune the fused-MoE kernel for a model's MoE shape on this GPU (or spread
over several) and write the engine's config file; progress bar, resumable from its log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuning.backends.base import BackendError
from tuning.config_files import TUNED_BATCH_SIZES, parse_ints, triton_config_unread
from tuning.engines import ENGINES
from tuning.routing import UNIFORM, load_ids, parse_routing
from tuning.search import KernelShape
from tuning.tune_results import (
    TuningLogError,
    engine_file_name,
    merge_results,
    print_summary,
    read_log,
    write_config_files,
)
from tuning.tuner import progress_bar, tune


def shape_from_args(args: argparse.Namespace) -> KernelShape:
    """The KernelShape of --model-config, --tp, --ep, --dtype and --block-shape."""
    from tuning.moe_params import moe_params

    try:
        text = Path(args.model_config).read_text()
    except OSError as exc:
        problem = f"cannot read {args.model_config}: {exc.strerror}"
        raise ValueError(f"--model-config: {problem}") from None
    params = moe_params(text, tp=args.tp, ep=args.ep)
    dtype = args.dtype or ("fp8_w8a8" if params.quantization == "fp8" else "bf16")
    block_shape = None
    if dtype == "fp8_w8a8":
        block_shape = parse_ints(args.block_shape) if args.block_shape else params.block_shape
    return KernelShape(
        E=params.experts_per_rank,
        N=params.N,
        H=params.hidden_size,
        top_k=params.topk,
        dtype=dtype,
        block_shape=tuple(block_shape) if block_shape else None,
    )


def add_shape_arguments(
    parser: argparse.ArgumentParser, *, model_config_required=True, device=True
) -> None:
    """--model-config, --tp, --ep, --dtype, --block-shape, --batch-sizes, and --device unless
    device is False (a command that runs no GPU)."""
    parser.add_argument(
        "--model-config", required=model_config_required, help="the model's HF config.json"
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (default 1)")
    parser.add_argument(
        "--dtype",
        choices=("bf16", "fp8_w8a8"),
        help="kernel dtype (default: fp8_w8a8 for fp8 checkpoints, else bf16)",
    )
    parser.add_argument(
        "--block-shape", help="fp8 weight-scale block, e.g. 128,128 (default: the model's)"
    )
    parser.add_argument(
        "--batch-sizes",
        help="comma-separated batch sizes (default: the 18 the engines tune)",
    )
    if device:
        parser.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `python -m tuning tune`."""
    # --merge takes the shape from its logs
    add_shape_arguments(parser, model_config_required=False)
    parser.add_argument("--out", required=True, help="folder for the config file and the log")
    parser.add_argument(
        "--style", choices=("vllm", "sglang"), default="vllm", help="whose file to write"
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        help="whose kernel to time: the engine's own (read from its installed package) or"
        " moeops' builtin copy (default: --style's engine where it is installed, else builtin)",
    )
    parser.add_argument(
        "--engine-source",
        help="the engine's package folder (e.g. unpacked from its wheel) instead of the"
        " installed one (MOEOPS_VLLM_PYTHON / MOEOPS_SGLANG_PYTHON name the engine's Python)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="tune a checkpoint whose MoE runs on kernels that read no Triton config (FP4)",
    )
    parser.add_argument(
        "--exhaustive", action="store_true", help="time every viable config (slow; a check)"
    )
    parser.add_argument(
        "--no-down",
        action="store_true",
        help="skip the search for GEMM 2's own configs (SGLang's _down file)",
    )
    parser.add_argument(
        "--deep-gemm-e8m0",
        action="store_true",
        help="the deployment runs vLLM with DeepGEMM and VLLM_USE_DEEP_GEMM_E8M0=1 (vLLM 0.34"
        " then runs GEMM 2 on its sorted-A path for fp8 block [128, 128] on the H100/H200,"
        " and the tune writes its _down file too)",
    )
    parser.add_argument(
        "--compile-workers",
        type=int,
        help="parallel compile processes (default: CPUs − 1, at most 32; with --gpus, per GPU"
        " process: the CPUs shared out)",
    )
    parser.add_argument(
        "--gpus",
        help="spread the tune over these GPUs, e.g. 0,1,2,3 or all (one process each; --log"
        " then names a folder for their logs)",
    )
    parser.add_argument(
        "--routing",
        default="uniform",
        help="the routing to time under: uniform (default), zipf:S (expert popularity ∝"
        " 1/rank^S), dirichlet:A (a popularity drawn per set, concentration A) or a file of"
        " top-k ids (.npy, .npz, JSON lines of [[e1..ek], …]) as an engine or a model run"
        " dumps them",
    )
    parser.add_argument(
        "--also-under",
        help="time the written file, the engine's default and shipped configs under this routing"
        " too, and say where the file loses to them there (default: uniform for a skewed"
        " --routing, none for a uniform one)",
    )
    parser.add_argument("--log", help="tuning log to resume from and write (default: in --out)")
    parser.add_argument("--fresh", action="store_true", help="ignore an existing log")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="LOG",
        help="write the config file from these logs (tuned side by side) instead of tuning",
    )


class _Refusal(Exception):
    """What `run` prints after "error: ", and the status it exits with."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def run(args: argparse.Namespace) -> int:
    """Tune (or merge logs), write the config file, print its path and a summary."""
    try:
        if args.merge:
            return _merge(args)
        shape, batch_sizes = _checked(args)
        if args.gpus:
            from tuning import spread

            try:
                gpus = spread.parse_gpus(args.gpus)
            except ValueError as exc:
                raise _Refusal(str(exc)) from exc
            if len(gpus) > 1:
                return spread.run_cli(args, shape, batch_sizes, gpus)
            args.device = gpus[0]
        return _tune_here(args, shape, batch_sizes)
    except _Refusal as refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return refusal.status


def _merge(args: argparse.Namespace) -> int:
    try:
        result = merge_results(read_log(p) for p in args.merge)
    except ValueError as exc:
        raise _Refusal(f"--merge: {exc}") from exc
    for path in write_config_files(result, args.out, args.style):
        print(path)
    return 0


def _checked(args: argparse.Namespace) -> tuple[KernelShape, list[int]]:
    """(shape, batch sizes) the arguments ask for, or _Refusal saying why they cannot be tuned."""
    if not args.model_config:
        raise _Refusal("--model-config is required (except with --merge)")
    try:
        shape = shape_from_args(args)
        batch_sizes = parse_ints(args.batch_sizes) if args.batch_sizes else TUNED_BATCH_SIZES
        refusal = fp4_refusal(args)
        args.routing_spec = routing_for(args.routing, shape)
        also = getattr(args, "also_under", None)
        args.also_under_spec = routing_for(also, shape) if also else None
        args.engine_spec = engine_spec(args.engine, args.style, args.engine_source)
    except (ValueError, BackendError) as exc:
        raise _Refusal(str(exc)) from exc
    if refusal and not args.force:
        raise _Refusal(f"{refusal} --force tunes it all the same.")
    if args.engine_spec is not None and args.engine_spec["engine"] == "vllm":
        # which path vLLM takes (and so which files it reads) follows from the launch
        args.engine_spec["launch"] = {
            "deep_gemm_e8m0": args.deep_gemm_e8m0,
            "expert_parallel": args.ep > 1,
        }
    return shape, batch_sizes


def _tune_here(args: argparse.Namespace, shape: KernelShape, batch_sizes: list[int]) -> int:
    """Tune on this process's one GPU, write the file, print its path and a summary."""
    import torch

    if not torch.cuda.is_available():
        raise _Refusal("tuning needs a CUDA GPU", status=1)
    name = engine_file_name(shape, torch.cuda.get_device_name(args.device), args.style)
    routing = getattr(args, "routing_spec", None) or UNIFORM
    # a tune under another routing is another log: neither resumes the other
    under = "" if routing.kind == "uniform" else f".{routing.slug}"
    log = Path(args.log) if args.log else Path(args.out) / f"{name}{under}.tuning-log.json"
    if args.fresh and log.exists():
        log.unlink()
    try:
        result = tune(
            shape,
            batch_sizes,
            device_index=args.device,
            exhaustive=args.exhaustive,
            down=not args.no_down,
            progress_callback=progress_bar(),
            resume_path=log,
            compile_workers=args.compile_workers,
            engine=args.engine_spec,
            routing=routing,
            also_under=getattr(args, "also_under_spec", None),
        )
    except TuningLogError as exc:
        raise _Refusal(f"{exc}; --fresh starts the tune over") from exc
    for path in write_config_files(result, args.out, args.style):
        print(path)
    print_summary(result)
    return 0


def routing_for(text: str, shape: KernelShape):
    """--routing as a Routing; a file of top-k ids is read and checked against the shape's
    experts and top-k now, before any GPU work (RoutingError, a ValueError, says what is
    wrong)."""
    routing = parse_routing(text)
    if routing.kind == "file":
        load_ids(routing.file, shape.E, shape.top_k)
    return routing


def fp4_refusal(args: argparse.Namespace) -> str | None:
    """Why tuning this checkpoint's fused-MoE Triton kernel would change nothing the engine runs
    (its experts are FP4: CUTLASS, FlashInfer and TRT-LLM kernels, which read no Triton config),
    or None."""
    from tuning.moe_params import moe_params

    params = moe_params(Path(args.model_config).read_text(), tp=args.tp, ep=args.ep)
    reason = triton_config_unread(params.quantization)
    return f"{args.model_config}: {reason}" if reason else None


def engine_spec(engine: str | None, style: str, source_dir: str | None) -> dict | None:
    """Whose kernel to time, as tuning.tuner.tune takes it (None: moeops' builtin).

    No engine named: style's engine where its package is found here, else builtin (and says
    so). A named engine that cannot be found is a BackendError naming what to give.
    """
    from tuning.engine_source import EngineSourceError, locate_package

    if engine == "builtin":
        return None
    wanted = engine or style
    try:
        package = locate_package(wanted, source_dir=source_dir)
    except EngineSourceError as exc:
        if engine is None:
            print(
                f"{wanted}'s package is not found here ({exc}): timing moeops' builtin kernel",
                file=sys.stderr,
            )
            return None
        raise BackendError(str(exc)) from None
    print(f"timing {package.title}'s own kernel ({package.package_dir})", file=sys.stderr)
    return {"engine": wanted, "source_dir": str(package.package_dir)}
