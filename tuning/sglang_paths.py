"""SGLang's own decisions of its fast paths, for a GPU's compute capability and a TP size,
evaluated from the installed (or unpacked) engine's source without the GPU and without importing
the engine (tuning.engine_paths does the same for vLLM; docs/engines.md lists what is read).

FlashInfer's all-reduce + RMSNorm fusion: SGLang (0.5.23) decides it in two of its registered
post-process passes of sglang/srt/arg_groups/overrides.py, run here in the engine's order:
`_flashinfer_allreduce_fusion_auto_enable(view)` then `_enforce_disable_allreduce_fusion(view)`;
the fusion runs where `flashinfer_allreduce_fusion_backend` is set after both. What they ask:

- `get_platform().is_sm90` (and `is_sm100`, `is_blackwell`): the engine's own probes, as its
  `_PLATFORM_PROBES` (sglang/srt/runtime_context.py) names them in sglang/srt/utils/common.py
  (`partial(_check_cuda_device_version, device_capability_majors=[10], cuda_version=(12, 8))`),
  evaluated over a stand-in GPU of the asked capability and a torch built for a CUDA version
  (known, else each of TORCH_CUDA: an answer that depends on it reads "on where torch is built
  for CUDA 12.4 or newer");
- the server arguments (`view.tp_size`, `view.nnodes`, `view.moe_a2a_backend`, …): the launch's
  TP, the rest the engine's own defaults, read from its field declarations
  (sglang/srt/arg_groups/fields/*.py);
- `attn_dp_enabled_of(view)`: the engine's own function (runtime_context.py);
- `model_config_of(view).hf_config`: the model's config.json (architectures, model_type, …).

A name, an argument or a probe the stand-ins do not give, or a function gone from its file,
gives an "unknown" row naming the function, the version and the name: never a guess.
"""

from __future__ import annotations

import ast
import functools

from domain.engine_paths import CAPABILITIES, EnginePaths, Evidence, PathRow, capability_words
from tuning.engine_functions import (
    Capability,
    EngineFunctions,
    Fields,
    PathUnknown,
    StandInLogger,
)
from tuning.engine_source import EnginePackage, EngineSourceError

OVERRIDES_FILE = "srt/arg_groups/overrides.py"
RUNTIME_FILE = "srt/runtime_context.py"
COMMON_FILE = "srt/utils/common.py"
FIELDS_FOLDER = "srt/arg_groups/fields"
FUSION_PASSES = ("_flashinfer_allreduce_fusion_auto_enable", "_enforce_disable_allreduce_fusion")
# The CUDA versions torch is built for (its cu118 … cu130 wheels), oldest first: a probe that
# asks torch.version.cuda is evaluated over each where the engine's torch is not known.
TORCH_CUDA = ("11.8", "12.1", "12.4", "12.6", "12.8", "12.9", "13.0")


class _Unset:
    """A model config.json was not given: what the decision reads of it is unknown."""

    def __init__(self, path: str):
        self._path = path

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise PathUnknown(f"reads {self._path}.{name}: no config.json of the model was given")


class HfConfig:
    """The model's config.json as transformers' config reads it: a key it lacks is an
    AttributeError (so `getattr(hf_config, "model_type", None)` is None), as in the engine."""

    def __init__(self, config: dict):
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        self.__dict__.update({**text, **config})


class ServerArgs:
    """SGLang's server arguments as its passes read them (`view.tp_size`): the launch's values,
    else the engine's own default of the field, else the decision is unknown, naming it. reads:
    {field: value} of each one read, in order (the decision's conditions)."""

    def __init__(self, launch: dict, defaults: dict):
        self._launch = dict(launch)
        self._defaults = defaults
        self.reads: dict = {}

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._launch:
            value = self._launch[name]
        elif name in self._defaults:
            value = self._defaults[name]
        else:
            raise PathUnknown(f"reads the server argument {name}, whose default moeops cannot read")
        self.reads.setdefault(name, value)
        return value

    def apply(self, resolved: dict) -> None:
        """A pass's answer ({field: value}) over the view, as the engine applies it."""
        if not isinstance(resolved, dict):
            raise PathUnknown(f"a pass answered {resolved!r}, not a dict of fields")
        self._launch.update(resolved)


def field_defaults(source: EngineFunctions) -> dict:
    """{field: default} of the engine's server-argument declarations (`tp_size: A[int, …] = 1`
    in sglang/srt/arg_groups/fields/*.py), the literal ones only."""
    folder = source.package.package_dir / FIELDS_FOLDER
    defaults = {}
    for path in sorted(folder.glob("*.py")):
        for node in source.tree(f"{FIELDS_FOLDER}/{path.name}").body:
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    try:
                        defaults.setdefault(item.target.id, ast.literal_eval(item.value))
                    except (ValueError, TypeError, SyntaxError):
                        continue
    return defaults


def stand_in_platform(source: EngineFunctions, capability: Capability | None):
    """`get_platform()`'s answer for capability: each fact the engine's `_PLATFORM_PROBES`
    names, evaluated by the engine's own probe of sglang/srt/utils/common.py."""
    probes = source.literal(RUNTIME_FILE, "_PLATFORM_PROBES")
    if not isinstance(probes, dict):
        raise PathUnknown(f"{source.package.title}'s {RUNTIME_FILE} sets no _PLATFORM_PROBES")
    title = source.package.title

    class StandInPlatform:
        def __getattr__(self, name):
            probe = probes.get(name)
            if probe is None:
                raise PathUnknown(f"asks get_platform().{name}, which {title} probes not")
            if probe in source.standins:
                return source.standins[probe]()
            return source.assigned(COMMON_FILE, probe)()

    return StandInPlatform()


class SglangDecisions:
    """SGLang's decisions for one package, capability and TP (see the module docstring).
    model_config: the model's config.json; torch_cuda: the CUDA version the engine's torch is
    built for ("12.9"), None where not known."""

    def __init__(
        self,
        package: EnginePackage,
        *,
        tp: int,
        model_config: dict | None = None,
        torch_cuda: str | None = None,
    ):
        self.package = package
        self.tp = tp
        self.model_config = model_config
        self.torch_cuda = torch_cuda

    def _source(self, capability: Capability | None, cuda: str) -> EngineFunctions:
        source = EngineFunctions(self.package, {})
        sm = capability.major * 10 + capability.minor if capability else 0
        torch = Fields("torch", version=Fields("torch.version", cuda=cuda if capability else None))
        source.standins.update(
            is_cuda=lambda: capability is not None,
            get_device_sm=lambda: sm,
            torch=torch,
            partial=functools.partial,
            logger=StandInLogger(),
            get_platform=lambda: platform,
            model_config_of=lambda view: self._model_config(),
        )
        platform = stand_in_platform(source, capability)
        return source

    def _model_config(self):
        if not self.model_config:
            return Fields("model_config", hf_config=_Unset("model_config.hf_config"))
        return Fields("model_config", hf_config=HfConfig(self.model_config))

    def fusion_once(self, capability: Capability | None, cuda: str, tp: int) -> tuple:
        """(the fusion backend after the engine's two passes, or None; the server arguments
        they read, {field: value})."""
        source = self._source(capability, cuda)
        view = ServerArgs({"tp_size": tp}, field_defaults(source))
        for name in FUSION_PASSES:
            decide = source.load(OVERRIDES_FILE, name)
            try:
                view.apply(decide(view))
            except PathUnknown:
                raise
            except Exception as exc:
                raise PathUnknown(f"{name} fails here: {type(exc).__name__}: {exc}") from None
        return view.flashinfer_allreduce_fusion_backend, view.reads

    def fusion(self, capability: Capability | None, tp: int | None = None, cuda=None):
        """(backend or None, conditions in words, server arguments read): evaluated over each
        of TORCH_CUDA where the engine's torch is not known; a backend some of them give reads
        as the condition "torch is built for CUDA X or newer"."""
        tp = self.tp if tp is None else tp
        versions = [cuda or self.torch_cuda] if (cuda or self.torch_cuda) else list(TORCH_CUDA)
        answers = [self.fusion_once(capability, version, tp) for version in versions]
        backends = [backend for backend, _ in answers]
        reads = answers[-1][1]
        if len(set(backends)) == 1:
            return backends[0], [], reads
        first = next(i for i, backend in enumerate(backends) if backend is not None)
        if any(backend is None for backend in backends[first:]):
            return None, ["what torch's CUDA version is"], reads
        return None, [f"torch is built for CUDA {versions[first]} or newer"], reads

    def _where(self, function: str) -> str:
        return f"sglang/{OVERRIDES_FILE} {function}, {self.package.title}"

    def _unknown(self, key: str, function: str, why: str) -> PathRow:
        reason = f"{self.package.title}'s {function} ({OVERRIDES_FILE}) cannot be evaluated: {why}"
        evidence = Evidence(source="source", text=reason, where=self._where(function))
        return PathRow(key=key, state="unknown", reason=reason, evidence=[evidence])

    def _enabled_on(self) -> list[str]:
        """The capabilities of CAPABILITIES where the fusion runs at TP ≥ 2 with the newest
        torch CUDA."""
        tp = max(self.tp, 2)
        return [
            str(cap)
            for cap in map(Capability.parse, CAPABILITIES)
            if self.fusion(cap, tp=tp, cuda=self.torch_cuda or TORCH_CUDA[-1])[0] is not None
        ]

    def fusion_row(self, capability: Capability | None) -> PathRow:
        function = FUSION_PASSES[0]
        key = "allreduce_rms_fusion"
        try:
            backend, needed, reads = self.fusion(capability)
            enabled_on = self._enabled_on()
        except (PathUnknown, EngineSourceError, SyntaxError) as exc:
            return self._unknown(key, function, str(exc))
        title = self.package.title
        gpu = f"compute capability {capability}" if capability else "the CPU build"
        arch = self._architecture()
        read = ", ".join(f"{name}={value!r}" for name, value in reads.items())
        asked = f"{function} then {FUSION_PASSES[1]} on {gpu}, TP {self.tp}"
        if backend is None and needed:
            condition = " and ".join(needed)
            state, value = "depends", f"on where {condition}"
            reason = (
                f"{title} fuses each layer's all-reduce with its RMSNorm in FlashInfer on {gpu} "
                f"at TP {self.tp} for {arch} where {condition}, with {read}"
            )
            text = f"{asked}: set where {condition}, else None ({read})"
        elif backend is not None:
            state, value = "on", f"flashinfer ({backend})"
            reason = (
                f"{title} fuses each layer's all-reduce with its RMSNorm in FlashInfer (backend "
                f"{backend}) on {gpu} at TP {self.tp}: {arch} is among the architectures it "
                f"fuses, with {read}"
            )
            text = f"{asked}: flashinfer_allreduce_fusion_backend={backend!r} ({read})"
        else:
            state, value = "off", "off"
            if self.tp <= 1:
                why = "one GPU: no all-reduce to fuse"
            elif capability is None:
                why = "it is a CUDA path"
            elif enabled_on and str(capability) not in enabled_on:
                why = f"it is enabled only on compute capability {capability_words(enabled_on)}"
            elif not enabled_on:
                why = f"it enables it for {arch} on none of the capabilities moeops asks about"
            else:
                why = f"its passes answer no here ({read})"
            reason = (
                f"{title} runs each layer's all-reduce and its RMSNorm apart on {gpu} at TP "
                f"{self.tp}: {why}"
            )
            text = f"{asked}: flashinfer_allreduce_fusion_backend=None ({read})"
        return PathRow(
            key=key,
            state=state,
            value=value,
            reason=reason,
            enabled_on=enabled_on,
            evidence=[Evidence(source="source", text=text, where=self._where(function))],
        )

    def _architecture(self) -> str:
        architectures = (self.model_config or {}).get("architectures") or ["the model"]
        return str(architectures[0])

    def rows(self, capability: Capability | None) -> list[PathRow]:
        return [self.fusion_row(capability)]


def sglang_paths(
    package: EnginePackage,
    out: EnginePaths,
    capability: Capability | None,
    *,
    model_config: dict | None,
    torch_cuda: str | None,
) -> EnginePaths:
    """out with SGLang's rows for capability (see source_paths)."""
    decisions = SglangDecisions(
        package, tp=out.tp or 1, model_config=model_config, torch_cuda=torch_cuda
    )
    out.rows = decisions.rows(capability)
    return out
