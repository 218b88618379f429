"""An engine's command line as moeops changes it, and what the engine says it runs with.

A launch recipe's argv is a list (no shell). `set_flags(argv, {"--max-num-seqs": "16"})`
replaces each flag's value where the flag is given (`--flag value` or `--flag=value`) and adds
it at the end where it is not; `reported(args, "--max-num-seqs")` finds the value the engine
reports for that flag among its arguments (vLLM's dotted `scheduler_config.max_num_seqs`,
SGLang's `max_running_requests`), so that a restart can be checked against the engine itself.
"""

import json

from domain.engine import CAP_FLAGS

# Flags that take no value (present: on).
SWITCHES = frozenset({"--enforce-eager", "--trust-remote-code", "--disable-log-requests"})
# Flags whose value is a count moeops knows the form of: the running-request caps.
COUNT_FLAGS = frozenset(CAP_FLAGS.values())


def cap_flag(engine: str, argv: list[str]) -> str | None:
    """The flag that sets the engine's running-request cap: vLLM's or SGLang's own; for an
    engine moeops does not know (the stand-in, an SGLang-style server), the one of those its
    command line (or list of flags) gives; None when it gives neither."""
    if engine in CAP_FLAGS:
        return CAP_FLAGS[engine]
    return next((f for f in CAP_FLAGS.values() if flag_value(argv, f) is not None), None)


class FlagError(ValueError):
    """A flag or value that cannot go into an argv; the message names it."""


def _check(flag, value):
    if not isinstance(flag, str) or not flag.startswith("--") or len(flag) < 3 or "=" in flag:
        raise FlagError(f"{flag!r} is not a long flag such as --max-num-seqs")
    if value is not None and not isinstance(value, str):
        raise FlagError(f"{flag}: the value must be text, not {type(value).__name__}")
    check_value(flag, value)


def check_value(flag: str, value: str | None) -> None:
    """Raise FlagError naming flag when value is not one the engine would take, for the flags
    moeops knows (COUNT_FLAGS: a whole number, 1 or more); an engine refuses it only at start."""
    whole = value is not None and value.isascii() and value.isdigit() and int(value) >= 1
    if flag in COUNT_FLAGS and value is not None and not whole:
        raise FlagError(f"{flag} takes a whole number, 1 or more, not “{value}”")


def check_values(argv: list[str]) -> None:
    """check_value of each flag argv gives that moeops knows the form of."""
    for flag in sorted(COUNT_FLAGS):
        check_value(flag, flag_value(argv, flag))


def _takes_value(argv: list[str], index: int) -> bool:
    """Whether the flag at argv[index] takes the next part as its value: the flag is no switch
    and a next part is there that is not a flag itself."""
    following = argv[index + 1] if index + 1 < len(argv) else None
    return argv[index] not in SWITCHES and following is not None and not following.startswith("--")


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value argv gives flag (the last one, as argparse takes it); None when absent, ""
    for a switch."""
    found = None
    for index, part in enumerate(argv):
        if part == flag:
            found = argv[index + 1] if _takes_value(argv, index) else ""
        elif part.startswith(flag + "="):
            found = part[len(flag) + 1 :]
    return found


def flags(argv: list[str]) -> dict[str, str]:
    """argv as {flag: value} ("" for a switch), what comes before the first flag under
    "command": how two recipes' command lines are compared."""
    out, index = {}, 0
    command = []
    while index < len(argv) and not argv[index].startswith("--"):
        command.append(argv[index])
        index += 1
    out["command"] = " ".join(command)
    while index < len(argv):
        part = argv[index]
        if part.startswith("--") and "=" in part:
            flag, _, value = part.partition("=")
            out[flag] = value
        elif part.startswith("--"):
            if _takes_value(argv, index):
                out[part] = argv[index + 1]
                index += 1
            else:
                out[part] = ""
        else:
            out.setdefault("arguments", "")
            out["arguments"] = (out["arguments"] + " " + part).strip()
        index += 1
    return out


def set_flags(argv: list[str], changes: dict[str, str | None]) -> list[str]:
    """argv with each flag of changes set to its value (None removes the flag); a new list."""
    out = list(argv)
    for flag, value in changes.items():
        _check(flag, value)
        kept, index = [], 0
        while index < len(out):
            part = out[index]
            if part == flag:
                index += 2 if _takes_value(out, index) else 1
                continue
            if part.startswith(flag + "="):
                index += 1
                continue
            kept.append(part)
            index += 1
        out = kept
        if value is not None:
            out.extend([flag] if flag in SWITCHES else [flag, value])
    return out


def arg_name(flag: str) -> str:
    """--max-num-seqs -> max_num_seqs, the name engines give the argument."""
    return flag.lstrip("-").replace("-", "_")


def reported(args: dict | None, flag: str):
    """The engine's reported value for flag: the argument of that name, else the one dotted
    key that ends with it (vLLM nests its arguments by config); None when not reported."""
    args = args or {}
    name = arg_name(flag)
    if name in args:
        return args[name]
    matches = [key for key in args if key.endswith("." + name)]
    return args[matches[0]] if len(matches) == 1 else None


def same_value(reported_value, asked: str) -> bool:
    """Whether what the engine reports is the value the flag asked for (as text, as argparse
    read it: "16" is 16, "true" is True)."""
    if isinstance(reported_value, bool):
        return asked.lower() in (("true", "1", "") if reported_value else ("false", "0"))
    if isinstance(reported_value, int | float):
        try:
            return float(asked) == float(reported_value)
        except ValueError:
            return False
    return str(reported_value) == asked


# What moeops asks of a vLLM started for profiling a level (workers.step_profile): its torch
# profiler writing into a folder on the engine's host, with no Python stacks, shapes or memory
# (they cost the CPU build 100× a step) and no front-end trace, which counts no engine steps
# and would record the API server's whole window.
PROFILER_FLAG = "--profiler-config"
PROFILES_FOLDER = "/var/tmp/moeops-profiles"
VLLM_PROFILER_CONFIG = {
    "profiler": "torch",
    "torch_profiler_dir": PROFILES_FOLDER,
    "torch_profiler_with_stack": False,
    "torch_profiler_record_shapes": False,
    "torch_profiler_with_memory": False,
    "ignore_frontend": True,
}


def profiler_flag_value(folder: str = PROFILES_FOLDER) -> str:
    """The value of vLLM's --profiler-config that lets moeops profile a level, writing into
    folder."""
    return json.dumps({**VLLM_PROFILER_CONFIG, "torch_profiler_dir": folder}, separators=(",", ":"))
