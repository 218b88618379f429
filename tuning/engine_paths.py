"""The engine's own decisions of its fast paths, for a GPU's compute capability and a TP size,
evaluated from the installed (or unpacked) engine's source without the GPU and without importing
the engine.

As `tuning.engine_source` does for kernels, the decision functions are taken out of the
engine's files with `ast` (`tuning.engine_functions`) and run here with stand-ins for what
they ask: `current_platform` (its capability checks are the engine's own methods of `Platform`
in vllm/platforms/interface.py and cuda.py, over a stand-in that answers the asked
capability), `has_flashinfer` and `has_deep_gemm` (evaluated both ways where this host does not
know: an answer that depends on one reads "on where FlashInfer is installed"), `envs`, and a
configuration holding only what the function reads. The classes and helpers they use
(`DeviceCapability`, `UnquantizedMoeBackend`, `MoEActivation`, `is_quantized_kv_cache`) are
taken from the engine's files too. A function that reaches a name or an attribute the
stand-ins do not give, or that is gone from its file, gives an "unknown" row naming the
function, the version and the name: never a guess.

Decisions read (vLLM 0.32 to 0.34; docs/engines.md lists them):
- all-reduce + RMSNorm fusion: `enable_allreduce_rms_fusion(cfg)` in vllm/config/vllm.py, which
  the optimisation levels that name it (-O2, -O3) apply;
- the unquantised MoE backends in the engine's order: `_get_priority_backends(moe_config)` in
  vllm/model_executor/layers/fused_moe/oracle/unquantized.py;
- the attention backends in the engine's order: `_get_backend_priorities(...)` in
  vllm/platforms/cuda.py;
- custom all-reduce's world sizes: `CustomAllreduce._SUPPORTED_WORLD_SIZES` in
  vllm/distributed/device_communicators/custom_all_reduce.py;
- DeepGEMM: `is_deep_gemm_supported()` in vllm/utils/deep_gemm.py (from 0.34 it also asks for
  nvcc 12.9 or newer).

    python -m workers.cli engine-paths --engine vllm --capability 12.0 --tp 8 --json

Imports neither torch nor the engine.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from domain.engine_paths import CAPABILITIES, EnginePaths, Evidence, PathRow, capability_words
from tuning.engine_functions import (
    Capability,
    EngineFunctions,
    EnumNames,
    Fields,
    PathUnknown,
    StandInEnvs,
    StandInLogger,
    stand_in_platform,
)
from tuning.engine_source import EnginePackage, EngineSourceError, locate_package
from tuning.sglang_paths import sglang_paths

# What a decision may ask of the engine's surroundings, and the words of a condition on it.
TOGGLES = {
    "flashinfer": "FlashInfer is installed",
    "deep_gemm": "DeepGEMM is installed",
    "nvcc": "an nvcc of CUDA 12.9 or newer is found",
}
CPU_BUILD = "no CUDA GPU: the CPU build's paths"

FUSION_FILE = "config/vllm.py"
MOE_ORACLE_FILE = "model_executor/layers/fused_moe/oracle/unquantized.py"
ATTENTION_FILE = "platforms/cuda.py"
CUSTOM_ALLREDUCE_FILE = "distributed/device_communicators/custom_all_reduce.py"
DEEP_GEMM_FILE = "utils/deep_gemm.py"

# ---------------------------------------------------------------------------- the decisions


@dataclass
class ModelFacts:
    """What a decision reads of the model (its config.json): MLA attention, query heads,
    head size, the quantisation method."""

    use_mla: bool = False
    num_heads: int | None = None
    head_size: int | None = None
    quantization: str | None = None

    @classmethod
    def from_config(cls, config: dict | None, tp: int) -> ModelFacts:
        if not config:
            return cls()
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
        config = text or config
        heads = config.get("num_attention_heads")
        hidden = config.get("hidden_size")
        head_dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
        quant = config.get("quantization_config") or {}
        return cls(
            use_mla=bool(config.get("kv_lora_rank")),
            num_heads=heads // max(tp, 1) if isinstance(heads, int) else None,
            head_size=config.get("kv_lora_rank") or head_dim,
            quantization=quant.get("quant_method") if isinstance(quant, dict) else None,
        )


class VllmDecisions:
    """vLLM's decisions for one package, capability and TP (see the module docstring)."""

    def __init__(
        self,
        package: EnginePackage,
        *,
        tp: int,
        env: dict | None = None,
        model: ModelFacts | None = None,
        installed: dict | None = None,
        kv_cache_dtype: str = "auto",
    ):
        self.package = package
        self.tp = tp
        self.env = env
        self.model = model or ModelFacts()
        # {toggle: True/False} where this host knows it; an unknown one is evaluated both ways
        self.installed = {k: v for k, v in (installed or {}).items() if v is not None}
        self.kv_cache_dtype = kv_cache_dtype

    def _source(
        self, capability: Capability | None, installed: dict
    ) -> tuple[EngineFunctions, object]:
        """The engine's files with the stand-ins; installed: {toggle: bool} (TOGGLES)."""
        source = EngineFunctions(self.package, {})
        platform, device_capability = stand_in_platform(source, capability)
        nvcc = installed.get("nvcc", True)
        source.standins.update(
            current_platform=platform,
            has_flashinfer=lambda: installed.get("flashinfer", True),
            has_deep_gemm=lambda: installed.get("deep_gemm", True),
            _deep_gemm_nvcc_path=lambda: "/usr/local/cuda/bin/nvcc" if nvcc else None,
            _nvcc_version=lambda path: (12, 9) if nvcc else None,
            envs=StandInEnvs(self.env),
            logger=StandInLogger(),
            AttentionBackendEnum=EnumNames(),
            DeviceCapability=device_capability,
        )
        return source, device_capability

    def evaluate(self, capability: Capability | None, decide) -> tuple[object, list[str]]:
        """decide(source) under every combination of what may be installed beside the engine
        (TOGGLES; those this host knows fixed): (the answer, []) when all agree, else (None,
        the conditions under which it is true, in words)."""
        free = [name for name in TOGGLES if self.installed.get(name) is None]
        answers = {}
        for mask in range(2 ** len(free)):
            combo = dict(self.installed)
            combo.update({name: bool(mask >> i & 1) for i, name in enumerate(free)})
            source, _ = self._source(capability, combo)
            answers[tuple(combo[name] for name in free)] = decide(source)
        values = set(map(repr, answers.values()))
        if len(values) == 1:
            return next(iter(answers.values())), []
        # a toggle is a condition when every true answer has it on
        truthy = [combo for combo, answer in answers.items() if answer]
        needed = [TOGGLES[name] for i, name in enumerate(free) if all(c[i] for c in truthy)]
        return None, needed

    def fusion(self, capability: Capability | None) -> tuple[bool | None, list[str]]:
        """enable_allreduce_rms_fusion's answer, or None and what it depends on."""
        cfg = Fields("cfg", parallel_config=Fields("cfg.parallel_config", **self._parallel()))
        return self.evaluate(
            capability,
            lambda source: bool(source.load(FUSION_FILE, "enable_allreduce_rms_fusion")(cfg)),
        )

    def _where(self, relpath: str, function: str) -> str:
        return f"vllm/{relpath} {function}, {self.package.title}"

    def _unknown(self, key: str, relpath: str, function: str, why: str) -> PathRow:
        reason = f"{self.package.title}'s {function} ({relpath}) cannot be evaluated: {why}"
        evidence = Evidence(source="source", text=reason, where=self._where(relpath, function))
        return PathRow(key=key, state="unknown", reason=reason, evidence=[evidence])

    def _parallel(self) -> dict:
        return {"tensor_parallel_size": self.tp}

    def _levels_applying(self, function: str) -> list[str]:
        """The optimisation levels (-O2, -O3) whose defaults name the function."""
        source = EngineFunctions(self.package, {})
        levels = []
        for node in source.tree(FUSION_FILE).body:
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                name = getattr(target, "id", "")
                if name.startswith("OPTIMIZATION_LEVEL_0") and any(
                    isinstance(n, ast.Name) and n.id == function for n in ast.walk(node.value)
                ):
                    levels.append(f"-O{int(name.rsplit('_', 1)[1])}")
        return levels

    def _enabled_on(self, decide) -> list[str]:
        """The capabilities of CAPABILITIES where decide(capability) holds, with everything
        it may need installed and at least two GPUs."""
        everything = VllmDecisions(
            self.package,
            tp=max(self.tp, 2),
            env=self.env,
            model=self.model,
            installed=dict.fromkeys(TOGGLES, True),
            kv_cache_dtype=self.kv_cache_dtype,
        )
        return [str(c) for c in map(Capability.parse, CAPABILITIES) if decide(everything, c)[0]]

    def switch_row(
        self,
        capability: Capability | None,
        *,
        key: str,
        relpath: str,
        function: str,
        decide,
        what: str,
        apart: str,
        levels: list[str] | None = None,
    ) -> PathRow:
        """The row of a yes/no decision: decide(decisions, capability) → (answer or None,
        conditions). what: the path when on ("fuses the all-reduce with the RMSNorm"); apart:
        the path when off ("runs each layer's all-reduce and its RMSNorm apart")."""
        where = self._where(relpath, function)
        try:
            answer, needed = decide(self, capability)
            enabled_on = self._enabled_on(decide)
        except (PathUnknown, EngineSourceError, SyntaxError) as exc:
            return self._unknown(key, relpath, function, str(exc))
        title = self.package.title
        gpu = f"compute capability {capability}" if capability else "the CPU build"
        on_levels = f" at {', '.join(levels)}" if levels else ""
        if answer is None:
            state = "depends"
            condition = " and ".join(needed) or "what is installed beside it"
            reason = f"{title} {what} on {gpu} at TP {self.tp}{on_levels} where {condition}"
            value = f"on where {condition}"
            text = f"{function} on {gpu}, TP {self.tp}: True where {condition}, else False"
        elif answer:
            state, value = "on", "on"
            reason = f"{title} {what} on {gpu} at TP {self.tp}{on_levels}"
            text = f"{function} on {gpu}, TP {self.tp}: True"
        else:
            state, value = "off", "off"
            if capability is None:
                why = "it is a CUDA path"
            elif enabled_on and str(capability) not in enabled_on:
                why = f"it is enabled only on compute capability {capability_words(enabled_on)}"
            elif not enabled_on:
                why = "its function enables it on none of the capabilities moeops asks about"
            else:
                why = "its function answers no here"
            reason = f"{title} {apart} on {gpu} at TP {self.tp}: {why}"
            text = f"{function} on {gpu}, TP {self.tp}: False"
        return PathRow(
            key=key,
            state=state,
            value=value,
            reason=reason,
            enabled_on=enabled_on,
            evidence=[Evidence(source="source", text=text, where=where)],
        )

    def fusion_row(self, capability: Capability | None) -> PathRow:
        function = "enable_allreduce_rms_fusion"
        try:
            levels = self._levels_applying(function)
        except (EngineSourceError, SyntaxError):
            levels = []
        if self.tp <= 1:
            where = self._where(FUSION_FILE, function)
            return PathRow(
                key="allreduce_rms_fusion",
                state="off",
                value="off",
                reason=f"{self.package.title} has no all-reduce to fuse at TP 1",
                evidence=[Evidence(source="source", text="TP 1", where=where)],
            )
        return self.switch_row(
            capability,
            key="allreduce_rms_fusion",
            relpath=FUSION_FILE,
            function=function,
            decide=lambda decisions, cap: decisions.fusion(cap),
            what="fuses each layer's all-reduce with its RMSNorm",
            apart="runs each layer's all-reduce and its RMSNorm apart",
            levels=levels,
        )

    def deep_gemm(self, capability: Capability | None) -> tuple[bool | None, list[str]]:
        """is_deep_gemm_supported()'s answer, or None and what it depends on."""
        return self.evaluate(
            capability,
            lambda source: bool(source.load(DEEP_GEMM_FILE, "is_deep_gemm_supported")()),
        )

    def deep_gemm_row(self, capability: Capability | None) -> PathRow:
        return self.switch_row(
            capability,
            key="deep_gemm",
            relpath=DEEP_GEMM_FILE,
            function="is_deep_gemm_supported",
            decide=lambda decisions, cap: decisions.deep_gemm(cap),
            what="runs DeepGEMM's kernels (fp8 block-quantised MoE and linear layers)",
            apart="runs no DeepGEMM kernel",
        )

    # -- MoE backend

    def moe_row(self, capability: Capability | None) -> PathRow:
        function = "_get_priority_backends"
        where = self._where(MOE_ORACLE_FILE, function)
        if self.model.quantization:
            return self._unknown(
                "moe_backend",
                MOE_ORACLE_FILE,
                function,
                f"the model is quantised ({self.model.quantization}); moeops evaluates the "
                "unquantised MoE oracle only",
            )
        try:
            source, _ = self._source(capability, {**dict.fromkeys(TOGGLES, True), **self.installed})
            order = self.moe_order(source)
        except (PathUnknown, EngineSourceError, SyntaxError) as exc:
            return self._unknown("moe_backend", MOE_ORACLE_FILE, function, str(exc))
        gpu = f"compute capability {capability}" if capability else "the CPU build"
        reason = (
            f"{self.package.title} tries the MoE backends on {gpu} in the order {order} and "
            f"takes the first whose kernel supports the model: {order[0]} first"
        )
        return PathRow(
            key="moe_backend",
            state="on" if len(order) == 1 else "depends",
            value=order[0],
            reason=reason,
            evidence=[Evidence(source="source", text=f"{function} → {order}", where=where)],
        )

    def moe_order(self, source: EngineFunctions) -> list[str]:
        activation = source.load(
            "model_executor/layers/fused_moe/activation.py", "MoEActivation"
        ).SILU
        parallel = Fields(
            "moe_config.moe_parallel_config",
            dp_size=1,
            ep_size=1,
            tp_size=self.tp,
            use_deepep_v2_kernels=False,
        )
        moe_config = Fields("moe_config", moe_parallel_config=parallel, activation=activation)
        order = source.load(MOE_ORACLE_FILE, "_get_priority_backends")(moe_config)
        return [getattr(b, "value", b) for b in order]

    # -- attention

    def attention_row(self, capability: Capability | None) -> PathRow:
        function = "_get_backend_priorities"
        where = self._where(ATTENTION_FILE, function)
        if capability is None:
            return PathRow(
                key="attention_backend",
                state="unknown",
                reason=f"{CPU_BUILD}: vLLM chooses CUDA attention backends only on a CUDA GPU",
                evidence=[Evidence(source="source", text=CPU_BUILD, where=where)],
            )
        try:
            installed = {**dict.fromkeys(TOGGLES, True), **self.installed}
            source, device_capability = self._source(capability, installed)
            decide = source.load(ATTENTION_FILE, function)
            order = list(
                decide(
                    self.model.use_mla,
                    device_capability(capability.major, capability.minor),
                    num_heads=self.model.num_heads,
                    kv_cache_dtype=self.kv_cache_dtype,
                    head_size=self.model.head_size,
                )
            )
        except (PathUnknown, EngineSourceError, SyntaxError, TypeError) as exc:
            return self._unknown("attention_backend", ATTENTION_FILE, function, str(exc))
        kind = "MLA" if self.model.use_mla else "attention"
        reason = (
            f"{self.package.title} tries the {kind} backends on compute capability {capability} "
            f"in the order {order} and takes the first that supports the model: {order[0]} first"
        )
        return PathRow(
            key="attention_backend",
            state="depends",
            value=order[0],
            reason=reason,
            evidence=[Evidence(source="source", text=f"{function} → {order}", where=where)],
        )

    # -- custom all-reduce

    def custom_allreduce_row(self, capability: Capability | None) -> PathRow:
        name = "CustomAllreduce._SUPPORTED_WORLD_SIZES"
        where = f"vllm/{CUSTOM_ALLREDUCE_FILE} {name}, {self.package.title}"
        if capability is None:
            return PathRow(
                key="custom_allreduce",
                state="off",
                value="CUDA only",
                reason=f"{CPU_BUILD}: custom all-reduce is a CUDA path",
                evidence=[Evidence(source="source", text=CPU_BUILD, where=where)],
            )
        try:
            sizes = EngineFunctions(self.package, {}).class_constant(
                CUSTOM_ALLREDUCE_FILE, "CustomAllreduce", "_SUPPORTED_WORLD_SIZES"
            )
        except (PathUnknown, EngineSourceError, SyntaxError) as exc:
            return self._unknown("custom_allreduce", CUSTOM_ALLREDUCE_FILE, name, str(exc))
        text = f"{name} = {sizes}"
        if self.tp <= 1:
            state, reason = "off", "one GPU: no all-reduce"
        elif self.tp not in sizes:
            state = "off"
            reason = (
                f"{self.package.title} runs custom all-reduce on {sizes} GPUs only: at TP "
                f"{self.tp} NCCL runs the all-reduce"
            )
        else:
            state = "depends"
            reason = (
                f"{self.package.title} runs custom all-reduce at TP {self.tp} where the GPUs "
                "reach each other peer to peer (it checks at start-up; the log says when not)"
            )
        return PathRow(
            key="custom_allreduce",
            state=state,
            value=f"world sizes {sizes}",
            reason=reason,
            evidence=[Evidence(source="source", text=text, where=where)],
        )

    def rows(self, capability: Capability | None) -> list[PathRow]:
        return [
            self.custom_allreduce_row(capability),
            self.fusion_row(capability),
            self.moe_row(capability),
            self.deep_gemm_row(capability),
            self.attention_row(capability),
        ]


def source_paths(
    engine: str,
    *,
    capability: str | None,
    tp: int,
    source_dir=None,
    python: str | None = None,
    model_config: dict | None = None,
    env: dict | None = None,
    installed: dict | None = None,
    kv_cache_dtype: str = "auto",
) -> EnginePaths:
    """The engine's decisions for a compute capability ("12.0"; None: no CUDA GPU, the CPU
    build's paths) and TP, from the installed package (found with the engine's Python) or
    source_dir. installed: {"flashinfer" | "deep_gemm" | "nvcc": bool} where known (TOGGLES),
    and "torch_cuda": the CUDA version of the engine's torch ("12.9"; SGLang's probes ask it);
    a decision that depends on one not known reads "on where FlashInfer is installed". Never
    raises for the engine: what cannot be read is an "unknown" row or a
    note with the reason."""
    cap = Capability.parse(capability) if capability else None
    out = EnginePaths(engine=engine, capability=str(cap) if cap else None, tp=tp)
    if cap is None:
        out.notes.append(CPU_BUILD)
    try:
        package = locate_package(engine, source_dir=source_dir, python=python)
    except EngineSourceError as exc:
        out.notes.append(f"the engine's source cannot be read: {exc}")
        out.rows = [
            PathRow(
                key=key,
                state="unknown",
                reason=f"the engine's source cannot be read: {exc}",
                evidence=[Evidence(source="source", text=str(exc))],
            )
            for key in ("allreduce_rms_fusion", "moe_backend", "attention_backend")
        ]
        return out
    out.version = package.version
    if engine == "sglang":
        return sglang_paths(
            package,
            out,
            cap,
            model_config=model_config,
            torch_cuda=(installed or {}).get("torch_cuda"),
        )
    decisions = VllmDecisions(
        package,
        tp=tp,
        env=env,
        model=ModelFacts.from_config(model_config, tp),
        installed=installed,
        kv_cache_dtype=kv_cache_dtype,
    )
    out.rows = decisions.rows(cap)
    return out
