"""Rules of the fused-MoE kernel configs: no tuned config for the deployment's shape and GPU, and
a tuned file whose kernel is not the one the engine runs (provenance)."""

from domain.engine import label as engine_label
from moeops.insights.rules.evidence import _key
from moeops.insights.rules.run_data import Proposal, RunData
from tuning.config_files import file_device_name, kernel_dtype

# -- no tuned kernel config ------------------------------------------------------------------


def no_tuned_kernel(data: RunData) -> list[Proposal]:
    """No KernelConfig on record for the deployment's device, per-rank E and N, and dtype, while
    the deployment's newest run did not measure a tuned config in effect either.

    dtype follows the weights: none/bf16 -> "bf16", fp16 -> "fp16", fp8 -> "fp8_w8a8" (with the
    model's block shape); FP4 weights (nvfp4, mxfp4) run through the engines' FP4 kernels, which
    take no Triton config, so the rule says that instead. Other quantizations: nothing.
    """
    shape = data.moe_shape
    names = list(dict.fromkeys(gpu.name for gpu in data.gpus if gpu.name))
    if not shape or not names or data.newest_run_tuned:
        # a tuned file the engine loads is the point, whether or not moeops holds it
        return []
    quantization = (data.quantization or "").lower()
    E, N = shape["experts_per_rank"], shape["N"]
    if "fp4" in quantization:
        return [
            Proposal(
                kind="other",
                key=_key("kernel-not-triton", quantization),
                severity="info",
                title=f"No fused-MoE Triton config applies to {quantization} weights",
                text=(
                    f"The engines run {quantization} experts through their FP4 MoE kernels "
                    "(CUTLASS, FlashInfer), which read no Triton config file; tuning the "
                    "fused-MoE Triton kernel does not change them."
                ),
                evidence={"quantization": quantization, "E": E, "N": N, "chart": None},
                scope="deployment",
            )
        ]
    dtype = kernel_dtype(quantization)
    if dtype is None:
        return []
    block = shape.get("block_shape") if dtype == "fp8_w8a8" else None
    block = tuple(block) if block else None
    on_record = {(file_device_name(d), e, n, t, b) for d, e, n, t, b in data.kernel_configs}
    proposals = []
    for name in names:
        if (file_device_name(name), E, N, dtype, block) in on_record:
            continue
        block_text = f" block {block[0]}×{block[1]}" if block else ""
        what = f"{name} E={E} N={N} {dtype}{block_text}"
        tune = {
            "device_name": name,
            "E": E,
            "N": N,
            "hidden_size": shape["hidden_size"],
            "topk": shape["topk"],
            "dtype": dtype,
            "block_shape": list(block) if block else None,
        }
        proposals.append(
            Proposal(
                kind="no_tuned_kernel",
                key=_key("kernel", name, E, N, dtype, block),
                severity="warning",
                title=f"No tuned fused-MoE kernel config for {what}",
                text=(
                    f"No kernel config is on record for {what} (tp {data.tp}, ep {data.ep}), so "
                    "the engine runs the fused-MoE kernel with default block sizes that were "
                    "never tuned for this GPU and shape."
                ),
                evidence={
                    "tune": tune,
                    "num_experts": shape["num_experts"],
                    "moe_intermediate_size": shape["moe_intermediate_size"],
                    "tp": data.tp,
                    "ep": data.ep,
                    "quantization": quantization or None,
                    "chart": None,
                },
                scope="deployment",
                plan=[f"Tune the fused-MoE kernel for {what}"],
                # a recipe that brings a tuned file in answers it
                recipe_bound=True,
            )
        )
    return proposals


# -- kernel provenance -----------------------------------------------------------------------


def kernel_provenance(data: RunData) -> list[Proposal]:
    """The tuned file the engine loaded was tuned in another version of the engine's kernel.

    A file tuned in vLLM 0.33.0's kernel, served by vLLM 0.34.0: 0.34 launches the kernel
    otherwise (TMA reads of B), and 0.33's best tiles ran 0.92× of 0.34's default at M=2048
    for GLM-5 fp8 (bench/RESULTS.md). Where both kernels' source hashes are known and equal (a
    patch release that left the kernel alone) nothing is raised. Without a recorded kernel for
    the file, an engine version that changed since the previous comparable run under the same
    tuned file says as much. A file tuned in another engine's kernel: its own finding.
    """
    engine, version = data.observed.get("engine"), data.observed.get("version")
    if engine not in ("vllm", "sglang") or not version:
        return []
    tuned = data.tuned_file
    serving = engine_label({"engine": engine, "version": version})
    plan = [retune_title(engine, version)]
    if tuned is not None and tuned.untimed:
        return [
            Proposal(
                kind="kernel_provenance",
                key=_key("other-engine", tuned.config_id),
                severity="warning",
                title=f"{tuned.name} was never timed in {engine_label(engine)}'s kernel",
                text=f"The engine loaded {tuned.name}. {tuned.untimed}",
                evidence={"kernel_config": tuned.config_id, "engine": engine, "chart": None},
                plan=plan,
            )
        ]
    if tuned is not None and tuned.kernel_engine == engine and tuned.kernel_version:
        if tuned.kernel_version == version:
            return []
        same_kernel = tuned.kernel_source_sha256 and (
            tuned.kernel_source_sha256 == data.serving_kernel_sha256
        )
        if same_kernel:
            return []
        tuned_on = engine_label({"engine": engine, "version": tuned.kernel_version})
        return [
            Proposal(
                kind="kernel_provenance",
                key=_key("tuned-on", tuned.config_id, version),
                severity="warning",
                title=f"{tuned.name} was tuned for {tuned_on}'s kernel; the engine runs {version}",
                text=(
                    f"This file was tuned for {tuned_on}'s kernel; the engine runs {version}, "
                    "whose launch differs: re-tune. Its best tiles were timed in the other "
                    f"kernel and may run slower than {serving}'s own default."
                ),
                evidence={
                    "kernel_config": tuned.config_id,
                    "tuned_on": {
                        "engine": engine,
                        "version": tuned.kernel_version,
                        "kernel_source_sha256": tuned.kernel_source_sha256 or None,
                    },
                    "serving": {
                        "engine": engine,
                        "version": version,
                        "kernel_source_sha256": data.serving_kernel_sha256 or None,
                    },
                    "chart": None,
                },
                plan=plan,
            )
        ]
    previous = data.previous
    moved = previous.engine_moved if previous is not None else None
    if (tuned is None or not tuned.kernel_engine) and moved:
        before = previous.label or f"run {previous.uuid[:8]}"
        return [
            Proposal(
                kind="kernel_provenance",
                key=_key("engine-moved", moved["from"], version),
                severity="warning",
                title=(
                    f"The engine moved from {moved['from']} to {version} under the "
                    "same tuned kernel file"
                ),
                text=(
                    f"{before} ran {engine_label(engine)} {moved['from']} with the same "
                    f"tuned kernel file; this run ran {version}. moeops does not know which "
                    "kernel the file was tuned in; it was not tuned in this one: re-tune."
                ),
                evidence={
                    "previous_run": {"id": previous.id, "uuid": previous.uuid},
                    "from_version": moved["from"],
                    "to_version": version,
                    "chart": None,
                },
                plan=plan,
            )
        ]
    return []


def retune_title(engine: str, version: str) -> str:
    """The plan item that re-tunes a file for the engine version that serves: "Tune for vLLM
    0.34.0 and re-sweep"."""
    return f"Tune for {engine_label({'engine': engine, 'version': version})} and re-sweep"
