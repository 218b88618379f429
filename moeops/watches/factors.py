"""What changed between two runs of a deployment, as factors: each thing a launch recipe sets
(a flag, an environment variable, the kernel configs, the engine's command) with what the
engine reported of it folded in, and each other change with why a restart cannot bring it
back (topology, driver, an engine version the command did not change, the load).

    changed_factors(a, b) -> {"revertible": [{"key", "kind", "name", "a", "b", "phrase"}],
                              "fixed": [{"phrase", "why"}]}

a and b are run snapshots (moeops.runs.snapshots); "a"/"b" in a factor are a's and b's values
(None: unset). An alert names the phrases of both lists; a bisection tries the revertible ones.
"""

from domain import launch
from moeops.runs import snapshots

# Recipe flags that are not flags: the words before the first flag, and positional ones.
COMMAND = "command"
POSITIONAL = "arguments"
ENV_PREFIX = "env "
KERNEL_CONFIGS = "kernel configs"

WHY_FIXED = {
    "topology": "a restart cannot change the GPUs, their links, the driver or CUDA",
    "load": "the watch's load changed: the two runs are not the same measurement",
    "workload": "the workload changed: the two runs are not the same measurement",
    "deployment": "a recorded field: the launch recipe, not the record, starts the engine",
    "engine": "the engine's command did not change: the install it runs is not the recipe's "
    "to bring back",
    "args": "the engine reports it changed, but its command line did not change it",
    "env": "the engine reports it changed, but the recipe's environment did not",
    "kernel_config": "the engine loads another file, but the recipe's kernel configs and "
    "command did not change",
    "engine_paths": "the engine took another fast path at start-up, but its command line did "
    "not change: the engine's version, its install or the GPU decided it",
    "recipe": "positional arguments of the command line are not tried one by one",
}


def _recipe_factors(ra, rb):
    """The factors two recipe records (snapshots' "recipe") differ in."""
    out = []
    fa, fb = dict(ra.get("flags") or {}), dict(rb.get("flags") or {})
    for key in sorted(set(fa) | set(fb), key=lambda k: (k != COMMAND, k)):
        if key == POSITIONAL or fa.get(key) == fb.get(key):
            continue
        kind = "command" if key == COMMAND else "flag"
        name = "engine command" if kind == "command" else key
        out.append({"key": key, "kind": kind, "name": key, "a": fa.get(key), "b": fb.get(key),
                    "phrase": f"{name} {show(fa.get(key))} → {show(fb.get(key))}"})  # fmt: skip
    ea, eb = ra.get("env") or {}, rb.get("env") or {}
    for name in sorted(set(ea) | set(eb)):
        if ea.get(name) != eb.get(name):
            a, b = ea.get(name), eb.get(name)
            out.append({"key": ENV_PREFIX + name, "kind": "env", "name": name, "a": a, "b": b,
                        "phrase": f"environment {name} {show(a)} → {show(b)}"})  # fmt: skip
    ka, kb = sorted(ra.get("kernel_configs") or []), sorted(rb.get("kernel_configs") or [])
    if ka != kb:
        a, b = ", ".join(ka) or "none", ", ".join(kb) or "none"
        out.append({"key": KERNEL_CONFIGS, "kind": "kernel_configs", "name": KERNEL_CONFIGS,
                    "a": ka, "b": kb, "phrase": f"kernel configs {a} → {b}"})  # fmt: skip
    return out


def show(value):
    return snapshots.show_value(value) if value != "" else "(switch)"


def _flag_of(key, flags):
    """The flag among flags whose argument the engine reports as key (vLLM's dotted names
    too), or None."""
    for flag in flags:
        name = launch.arg_name(flag)
        if key in (flag, name) or key.endswith("." + name):
            return flag
    return None


def _explained(change, revertible, engine, recipe_flags):
    """Whether a change the engine reported follows from a recipe factor that changed.
    recipe_flags: every flag either recipe gives."""
    section, key = change["section"], change["key"]
    kinds = {f["kind"] for f in revertible}
    if "command" in kinds and section in ("engine", "args", "env", "kernel_config"):
        # another command may run another install: what it reports follows from it
        return True
    changed = {f["key"] for f in revertible if f["kind"] == "flag"}
    if section == "args":
        own = _flag_of(key, recipe_flags)
        if own is not None:
            return own in changed
        # an argument no flag sets is derived by the engine from those that do (vLLM's
        # compile ranges and batched tokens follow --max-num-seqs): it moved with the recipe
        return bool(kinds - {"kernel_configs"})
    if section == "engine" and key == "max_running_requests":
        return launch.cap_flag(engine, sorted(recipe_flags)) in changed
    if section == "engine" and key not in ("engine", "version"):
        # its model length and allreduce fusion are read from its arguments
        return bool(kinds - {"kernel_configs"})
    if section == "env":
        return (ENV_PREFIX + key) in {f["key"] for f in revertible}
    if section == "kernel_config":
        return bool(kinds & {"kernel_configs", "env"})
    if section == "engine_paths":
        # the launch decides the paths the engine takes: any flag or variable may move one
        return bool(kinds - {"kernel_configs"})
    return False


def changed_factors(a: dict, b: dict) -> dict:
    """The factors snapshots a and b differ in (module docstring); how a run was taken (moeops
    version, client host) and names left out."""
    ra, rb = (a or {}).get("recipe"), (b or {}).get("recipe")
    revertible = _recipe_factors(ra, rb) if ra and rb else []
    engine = ((b or {}).get("engine") or {}).get("engine") or ""
    recipe_flags = [
        flag
        for flag in {**(ra or {}).get("flags", {}), **(rb or {}).get("flags", {})}
        if flag.startswith("--")
    ]
    fixed = []
    for change in snapshots.snapshot_diff(a, b)["changes"]:
        factors = snapshots.differing_factors({"changes": [change]})
        if not factors or factors[0] in snapshots.INCIDENTAL_FACTORS:
            continue
        section = change["section"]
        if section == "recipe":
            if change["key"] != POSITIONAL:
                continue
        elif _explained(change, revertible, engine, recipe_flags):
            continue
        fixed.append({"phrase": snapshots.describe_change(change), "why": WHY_FIXED[section]})
    return {"revertible": revertible, "fixed": fixed}


def phrases(a: dict, b: dict) -> list[str]:
    """What changed from a to b, one phrase per factor: "--max-num-seqs 8 → 1"."""
    found = changed_factors(a, b)
    return [f["phrase"] for f in found["revertible"]] + [f["phrase"] for f in found["fixed"]]
