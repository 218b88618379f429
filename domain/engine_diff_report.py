"""What changed in an engine's fused-MoE kernel between two versions, from the records
`python -m tuning engine-diff` makes of each (tuning.engine_diff_cli.describe): the lines it prints
and the engine-diff page shows, and the check of a record pushed or uploaded. Pure: both tiers
read it. The records are made by tuning.engine_diff_cli, which reads the engine's own files
through the kernel backends that the web tier must not load; so the two stay two modules."""

from domain.engine_paths import decision_changes

# A version's record (tuning.engine_diff_cli.describe): key → what its value must be.
VERSION_KEYS = {
    "version": str,
    "launcher": list,
    "kernel": list,
    "kernel_sha256": str,
    "source_sha256": (str, type(None)),
    "switches": dict,
    "defaults": dict,
    "file": str,
    "shipped": (dict, type(None)),
    "down_file": (str, type(None)),
    "shipped_down": (dict, type(None)),
}
# A version's path decisions (tuning.engine_diff_cli.path_decisions), in records made since they
# were added: key → what its value must be.
PATHS_KEYS = {"capability": (str, type(None)), "tp": int, "rows": list}
# The whole report (tuning.engine_diff_cli.report): the engine, shape and GPU, and both versions.
REPORT_KEYS = {"engine": str, "shape": dict, "device_name": str, "old": dict, "new": dict}


class ReportError(ValueError):
    """An engine-diff report that is not one `python -m tuning engine-diff --json` writes; the
    message names the field."""


def checked_report(report) -> dict:
    """report, checked to be what `python -m tuning engine-diff --json` writes (REPORT_KEYS,
    each version VERSION_KEYS); raises ReportError naming the first field that is not."""
    if not isinstance(report, dict):
        raise ReportError("an engine-diff report is a JSON object")
    _check(report, REPORT_KEYS, "")
    for side in ("old", "new"):
        _check(report[side], VERSION_KEYS, f"{side}.")
        if "paths" in report[side]:
            if not isinstance(report[side]["paths"], dict):
                raise ReportError(f"{side}.paths has the wrong type")
            _check(report[side]["paths"], PATHS_KEYS, f"{side}.paths.")
    return report


def _check(obj: dict, keys: dict, prefix: str) -> None:
    for key, kind in keys.items():
        if key not in obj:
            raise ReportError(f"{prefix}{key} is missing")
        if not isinstance(obj[key], kind):
            raise ReportError(f"{prefix}{key} has the wrong type")


def side_by_side(old: dict | None, new: dict | None) -> list[tuple[str, str, str, bool]]:
    """[(batch size, old entry, new entry, changed)] of two {M: entry} maps (either None: no
    file), batch sizes ascending, entries as one line of text each."""
    old, new = old or {}, new or {}
    sizes = sorted({int(m) for m in (*old, *new)})
    rows = []
    for m in sizes:
        left = old.get(str(m), old.get(m))
        right = new.get(str(m), new.get(m))
        rows.append((str(m), _entry(left), _entry(right), left != right))
    return rows


def compare(old: dict, new: dict) -> list[str]:
    """Lines of text: what differs between two describe() results, the newer second."""
    title = f"{old['version']} → {new['version']}"
    lines = [f"engine-diff {title}"]
    for label, key in (("launcher", "launcher"), ("kernel", "kernel")):
        added = [p for p in new[key] if p not in old[key]]
        removed = [p for p in old[key] if p not in new[key]]
        if added or removed:
            change = ", ".join([*(f"+{p}" for p in added), *(f"-{p}" for p in removed)])
            lines.append(f"{label} parameters: {change}")
        else:
            lines.append(f"{label} parameters: unchanged")
    same = old["kernel_sha256"] == new["kernel_sha256"]
    lines.append(
        "kernel source: "
        + ("unchanged" if same else f"{old['kernel_sha256'][:12]} → {new['kernel_sha256'][:12]}")
    )
    lines.append(f"entry switches: {old['switches'] or 'none'} → {new['switches'] or 'none'}")
    renamed = "" if old["file"] == new["file"] else f" → {new['file']}"
    lines.append(f"file: {old['file']}{renamed}")
    if old["down_file"] != new["down_file"]:
        lines.append(f"_down file: {old['down_file'] or 'none'} → {new['down_file'] or 'none'}")
    for label, key in (
        ("default rule", "defaults"),
        ("shipped file", "shipped"),
        ("shipped _down file", "shipped_down"),
    ):
        lines += _entries(label, old[key], new[key])
    return lines + _paths(old.get("paths"), new.get("paths"))


def _paths(old: dict | None, new: dict | None) -> list[str]:
    """Lines of the path decisions that changed (records with "paths" on both sides)."""
    if not old or not new:
        return []
    where = f"compute capability {new['capability'] or 'none'}, TP {new['tp']}"
    try:
        changed = decision_changes(old["rows"], new["rows"])
    except ValueError:
        return [f"path decisions ({where}): a record's rows cannot be read"]
    if not changed:
        return [f"path decisions ({where}): unchanged"]
    return [f"path decisions ({where}):", *(f"  {line}" for line in changed)]


def _entries(label: str, old: dict | None, new: dict | None) -> list[str]:
    if old is None and new is None:
        return [f"{label}: none in either"]
    if old is None or new is None:
        lines = [f"{label}: {_present(old)} → {_present(new)}"]
        return lines + [f"  M={m}: {_entry(e)}" for m, e in (old or new).items()]
    changed = [m for m in new if old.get(m) != new[m]]
    if not changed:
        return [f"{label}: the same at every batch size"]
    lines = [f"{label}: differs at M = {', '.join(map(str, changed))}"]
    for m in changed:
        lines.append(f"  M={m}: {_entry(old.get(m))} → {_entry(new[m])}")
    return lines


def _present(entries: dict | None) -> str:
    return "none" if entries is None else "present"


def _entry(entry: dict | None) -> str:
    if entry is None:
        return "none"
    return " ".join(f"{k}={v}" for k, v in entry.items())
