"""An engine's own account of itself, from the bodies it serves.

- SGLang: GET /get_server_info, its version and every server argument (bench_serving result
  files embed the same object under "server_info");
- vLLM: GET /server_info?config_format=json (with VLLM_SERVER_DEV_MODE=1), its whole
  configuration under "vllm_config" and its VLLM_* environment under "vllm_env".

`identity(engine, ...)` turns what was read into the dict a run's snapshot keeps under "engine":
{"engine", "version", "models", "max_model_len", "max_running_requests",
 "max_running_requests_source", "args" ({dotted name: value}), "args_source", "env",
 "allreduce_fusion", "metric_names", "notes"}.
"""

import math

from domain.numbers import is_integer

# The stand-in engine's owned_by in /v1/models: it serves it, the worker recognises it by it.
STANDIN_OWNER = "moeops-standin"
ENGINE_LABELS = {"sglang": "SGLang", "vllm": "vLLM", "standin": "stand-in", "other": "Other"}
# Values that differ at every start of the same engine with the same arguments.
VOLATILE_ARGS = frozenset({"instance_id"})
VOLATILE_ENV = frozenset({"VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME"})
# SGLang reports these next to its server arguments; they are state, not arguments.
SGLANG_NOT_ARGS = frozenset(
    {"internal_states", "version", "prefill", "decode", "status", "max_total_num_tokens"}
)
# Where each engine reports its running-request cap, first found wins.
CAP_KEYS = {
    "vllm": ("scheduler_config.max_num_seqs",),
    "sglang": ("max_running_requests",),
    "standin": ("max_running_requests",),
}
# The FlashInfer allreduce-fusion switch as each engine reports it.
ALLREDUCE_FUSION_KEYS = {
    "vllm": ("compilation_config.pass_config.fuse_allreduce_rms",),
    # SGLang 0.5.23 reports the fusion it resolved as a backend (None: off); earlier versions
    # a switch
    "sglang": ("flashinfer_allreduce_fusion_backend", "enable_flashinfer_allreduce_fusion"),
}
# The flag that sets the running-request cap, per engine.
CAP_FLAGS = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}


def plain(value):
    """value with non-finite floats as strings: JSON's NaN and Infinity do not fit jsonb."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def flatten(tree: dict, prefix: str = "") -> dict:
    """Nested dicts as one dict of dotted keys ("scheduler_config.max_num_seqs"); lists kept."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = plain(value)
    return out


def sglang_args(info: dict) -> dict:
    """SGLang's server arguments from its /get_server_info body."""
    return plain({k: v for k, v in info.items() if k not in SGLANG_NOT_ARGS})


def vllm_args(config: dict) -> dict:
    """vLLM's configuration (/server_info's vllm_config) as dotted arguments."""
    return {k: v for k, v in flatten(config).items() if k not in VOLATILE_ARGS}


def differing(reported: dict, defaults: dict) -> dict:
    """{key: the default} of each key whose reported value is not its default (None where the
    defaults have no such key)."""
    return {
        key: defaults.get(key)
        for key, value in reported.items()
        if key not in defaults or defaults[key] != value
    }


def vllm_env(env: dict) -> dict:
    return {k: plain(v) for k, v in env.items() if k not in VOLATILE_ENV}


def _int(value):
    return value if is_integer(value) else None


def _cap(value):
    """value when it can be a running-request cap: a positive integer (JSON's true is not 1)."""
    return value if _int(value) is not None and value > 0 else None


def reported_running_cap(identity: dict) -> int | None:
    """The running-request cap (requests run at once) an identity dict reports, such as a run's
    snapshot "engine"; None when it reports none."""
    return _cap(identity.get("max_running_requests"))


def nested_int(node, key):
    """The first integer under key, looking into SGLang's internal_states and a prefill/decode
    router's decode[] before prefill[] (the decode side caps the running batch)."""
    if isinstance(node, list):
        return next((v for item in node if (v := nested_int(item, key)) is not None), None)
    if not isinstance(node, dict):
        return None
    if _int(node.get(key)) is not None:
        return node[key]
    for nested in ("internal_states", "decode", "prefill"):
        if nested in node and (v := nested_int(node[nested], key)) is not None:
            return v
    return None


def identity(
    engine,
    *,
    version=None,
    args=None,
    args_source=None,
    env=None,
    models=(),
    metric_names=(),
    notes=(),
    server_info=None,
) -> dict:
    """The snapshot's "engine" dict; the cap and the fusion flag are read from args."""
    args = args or {}
    out = {
        "engine": engine,
        "version": version,
        "models": list(models),
        "max_model_len": None,
        "max_running_requests": None,
        "max_running_requests_source": None,
        "args": args,
        "args_source": args_source,
        "env": env or {},
        "allreduce_fusion": None,
        "metric_names": list(metric_names),
        "notes": list(notes),
    }
    for key in CAP_KEYS.get(engine, ()):
        cap = _cap(args.get(key))
        if cap is not None:
            out["max_running_requests"] = cap
            out["max_running_requests_source"] = f"{args_source} {key}"
            break
    else:
        nested = _cap(nested_int(server_info, "max_running_requests")) if server_info else None
        if nested is not None:
            out["max_running_requests"] = nested
            out["max_running_requests_source"] = f"{args_source} max_running_requests"
    for key in ALLREDUCE_FUSION_KEYS.get(engine, ()):
        if key.endswith("_backend") and key in args:
            out["allreduce_fusion"] = args[key] is not None
            break
        if isinstance(args.get(key), bool):
            out["allreduce_fusion"] = args[key]
            break
    lens = [_int(m.get("max_model_len")) for m in out["models"]]
    lens = [n for n in lens if n]
    reported = _int(args.get("model_config.max_model_len")) or _int(args.get("context_length"))
    out["max_model_len"] = lens[0] if lens else reported
    return out


def from_sglang_server_info(info: dict, *, source: str) -> dict:
    """identity() of an SGLang /get_server_info body (or a result file's server_info)."""
    version = info.get("version")
    return identity(
        "sglang",
        version=version if isinstance(version, str) else None,
        args=sglang_args(info),
        args_source=source,
        server_info=info,
    )


def label(identity_or_engine) -> str:
    """ "vLLM 0.32.0" for an identity dict, or the engine's display name for its key."""
    if isinstance(identity_or_engine, str):
        return ENGINE_LABELS.get(identity_or_engine, identity_or_engine)
    engine = identity_or_engine.get("engine") or ""
    version = identity_or_engine.get("version") or ""
    return f"{ENGINE_LABELS.get(engine, engine)} {version}".strip()
