"""A GPU host's topology as both tiers read it: the snapshot format, `nvidia-smi topo` text
parsed into it, and two snapshots compared (what changed, a fingerprint). The worker's probe
(workers.topology) writes snapshots in this format; the web tier stores, imports and compares
them.

A snapshot is a plain dict (JSON) with exactly these top-level keys:

    source          "probe" | "nvidia-smi"
    virtualization  {"kind": "bare_metal" | "vm" | "container" | "unknown",
                     "technology": "kvm" | "lxc" | "docker" | ... | None,
                     "evidence": ["/run/systemd/container: lxc", ...],
                     "layers": [{"kind": "vm", "technology": "firecracker",
                                 "hypervisor": "kvm"},
                                {"kind": "container", "technology": "docker"}]}
                    `kind`/`technology` name the innermost layer (the one a process runs in);
                    `layers` lists every virtualization layer found, outermost first ([] on
                    bare metal, and in snapshots older than it, which name one layer only). A
                    VM layer's `technology` is its VMM where DMI or ACPI names one, and its
                    optional `hypervisor` the hypervisor under it (kvm). A VM layer anywhere,
                    not only the innermost, is what puts the GPUs behind a virtual PCIe tree.
    driver_version  "580.82.07" | None
    cuda_version    "13.0" | None
    gpus            [{"index", "name", "uuid", "pci_bus_id", "compute_capability" ("9.0"),
                      "sm" ("SM90"), "memory_total_mib", "power_limit_w",
                      "pcie": {"gen_max", "gen_current", "width_max", "width_current"},
                      "nvlinks_active"}]
    links           {"labels": ["GPU0", ..., "NIC0", ...], "matrix": [["X", "NV18", ...], ...]}
    p2p             {"read" | "write" | "nvlink" | "atomics":
                        {"labels": [...], "matrix": [["X", "OK", "CNS", ...]]} | None}
    affinity        [{"gpu": "GPU0", "cpu": "0-47", "numa": "0", "gpu_numa": "N/A"}]
    nics            [{"name": "NIC0", "device": "mlx5_0"}]; a NIC whose device cannot be read
                    has device None and a "note" saying why ("name unknown: the paste has no
                    legend")
    hostname        str | None

Whatever cannot be read is None or "unknown", never guessed. Link cells use nvidia-smi's
codes (X, PIX, PXB, PHB, NODE, SYS, NV<n>; "same board" for two GPUs on one card); P2P
cells use its codes too (OK, CNS, GNS, TNS, NS, DR) with "unknown" for unknown. A code
neither legend documents (a newer driver's) is kept verbatim; the parser tells `topo -m`
text from `topo -p2p` text by the codes it holds and refuses one sent for the other.

Pure code: no Django, no NVML.
"""

from __future__ import annotations

import hashlib
import json
import re

P2P_KINDS = ("read", "write", "nvlink", "atomics")
# What a person calls each kind of virtualization (a snapshot's "kind").
VIRTUALIZATION_WORDS = {
    "bare_metal": "Bare metal",
    "vm": "Virtual machine",
    "container": "Container",
    "unknown": "Unknown",
}
# A layer named inside a sentence: "container (docker) in a VM (kvm, firecracker)".
_LAYER_NOUNS = {"vm": "a VM", "container": "a container"}


def _layers(virtualization: dict) -> list[dict]:
    layers = virtualization.get("layers") if isinstance(virtualization, dict) else None
    return [layer for layer in layers or [] if isinstance(layer, dict)]


def _technologies(layer: dict) -> str:
    """ "(kvm, firecracker)": the hypervisor, then the technology, each once; "" for none."""
    names = [layer.get("hypervisor"), layer.get("technology")]
    names = [name for name in dict.fromkeys(names) if isinstance(name, str) and name]
    return f" ({', '.join(names)})" if names else ""


def virtualization_words(virtualization: dict) -> str:
    """A snapshot's virtualization for people, innermost layer first: "Container (docker) in a
    VM (kvm, firecracker)", "Virtual machine (kvm)", "Bare metal". A snapshot that names no
    layers (an older one, `nvidia-smi` text) reads from its kind and technology alone."""
    virtualization = virtualization if isinstance(virtualization, dict) else {}
    layers = _layers(virtualization)
    if not layers:
        kind = virtualization.get("kind") or "unknown"
        return VIRTUALIZATION_WORDS.get(kind, kind) + _technologies(virtualization)
    inner, *outer = reversed(layers)
    kind = inner.get("kind") or "unknown"
    words = VIRTUALIZATION_WORDS.get(kind, kind) + _technologies(inner)
    for layer in outer:
        kind = layer.get("kind") or "unknown"
        words += f" in {_LAYER_NOUNS.get(kind, kind)}{_technologies(layer)}"
    return words


def vm_layer(virtualization: dict) -> dict | None:
    """The VM layer the GPUs sit in ({"kind": "vm", "technology", ...}), however deep it lies
    (a container in a VM is in a VM), or None; a snapshot without layers answers by its kind."""
    virtualization = virtualization if isinstance(virtualization, dict) else {}
    layers = _layers(virtualization)
    if not layers and virtualization.get("kind") == "vm":
        return {"kind": "vm", "technology": virtualization.get("technology")}
    return next((layer for layer in layers if layer.get("kind") == "vm"), None)


class TopologyParseError(ValueError):
    """Malformed `nvidia-smi topo` text; `line_number` is 1-based within the text at fault."""

    def __init__(self, message: str, line_number: int | None, source: str = "topology matrix"):
        self.message = message
        self.line_number = line_number
        self.source = source
        where = f"{source}, line {line_number}" if line_number else source
        super().__init__(f"{where}: {message}")


# --------------------------------------------------------------------------- the parser

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_ATTRIBUTE_COLUMNS = (
    ("CPU Affinity", "cpu"),
    ("NUMA Affinity", "numa"),
    ("GPU NUMA ID", "gpu_numa"),
)
# `nvidia-smi topo -m`'s legend (NV# is NV1, NV2, …); SOC is what drivers before 2017 printed
# for SYS.
_LINK_CODES = {"X", "SYS", "SOC", "NODE", "PHB", "PXB", "PIX", "NV#"}
_NVLINK_CELL = re.compile(r"NV\d+\Z")
# The entries of a whole `topo -m` legend, as each generation prints it (a newer driver's may
# add more): one that lacks any of these was cut off.
_WHOLE_LEGENDS = (
    ("X", "SYS", "NODE", "PHB", "PXB", "PIX", "NV#"),
    ("X", "SOC", "PHB", "PXB", "PIX"),
)
_NIC_LABEL = re.compile(r"NIC\d+\Z")
# `nvidia-smi topo -p2p`'s legend; DR (disabled by regkey) is printed by newer drivers only.
_P2P_CODES = {"X", "OK", "CNS", "GNS", "TNS", "NS", "DR", "U"}
# A code either legend may add later (C2C, …) is kept; a cell of another shape is text that
# slipped into the matrix (an affinity value, a number), so the row is wrong.
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9#]{0,15}\Z")
_LEGEND_ENTRY = re.compile(r"\s*(\S+)\s*=\s*\S")
_NIC_LEGEND_ENTRY = re.compile(r"\s*(NIC\d+):\s*(\S+)\s*\Z")
_GPU_LABEL = re.compile(r"GPU\d+\Z")
# Why a numbered NIC of a paste without its legend has no device (the snapshot's NIC "note").
NIC_NAME_UNKNOWN = "name unknown: the paste has no legend"


def parse_nvidia_smi_topo(matrix_text: str, p2p_texts: dict[str, str] | None = None) -> dict:
    """Parse `nvidia-smi topo -m` text (and optionally `topo -p2p r|w|n|a`) into a snapshot.

    `p2p_texts` maps a kind ("read", "write", "nvlink", "atomics") to that command's text.
    Accepts every legend generation (SOC-era, PCIe-switch wording, NIC legend), tabs or
    spaces, NIC rows and columns (NIC<n> or device names such as mlx5_0) and any subset of
    the CPU Affinity / NUMA Affinity / GPU NUMA ID columns. Raises TopologyParseError naming
    the line on malformed text.
    """
    matrix = _parse_matrix(_lines(matrix_text))
    gpu_labels = [label for label in matrix["labels"] if _GPU_LABEL.match(label)]
    p2p = dict.fromkeys(P2P_KINDS)
    for kind, text in (p2p_texts or {}).items():
        if kind not in P2P_KINDS:
            raise ValueError(f"unknown P2P kind {kind!r}; expected one of {', '.join(P2P_KINDS)}")
        p2p[kind] = _parse_p2p(_lines(text), kind, gpu_labels)
    return {
        "source": "nvidia-smi",
        "virtualization": {"kind": "unknown", "technology": None, "evidence": [], "layers": []},
        "driver_version": None,
        "cuda_version": None,
        "gpus": [unknown_gpu(int(label[3:])) for label in gpu_labels],
        "links": {"labels": matrix["labels"], "matrix": matrix["cells"]},
        "p2p": p2p,
        "affinity": matrix["affinity"],
        "nics": matrix["nics"],
        "hostname": None,
    }


def _lines(text: str) -> list[str]:
    # nvidia-smi underlines the header with ANSI escapes when it writes to a terminal
    return _ANSI_ESCAPE.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _first_content_line(lines: list[str]) -> int:
    """Index of the first line that is neither blank nor the echoed command."""
    for index, line in enumerate(lines):
        if line.strip() and "nvidia-smi" not in line:
            return index
    return len(lines)


def _split_header(line: str, line_number: int) -> tuple[list[str], list[str]]:
    """Split the matrix header into device labels and attribute column keys."""
    tokens = line.split()
    labels: list[str] = []
    attributes: list[str] = []
    position = 0
    while position < len(tokens):
        for title, key in _ATTRIBUTE_COLUMNS:
            words = title.split()
            if tokens[position : position + len(words)] == words:
                attributes.append(key)
                position += len(words)
                break
        else:
            if attributes:
                raise TopologyParseError(
                    f"unexpected column title {tokens[position]!r} after the affinity columns",
                    line_number,
                )
            labels.append(tokens[position])
            position += 1
    if not labels or labels[0] != "GPU0":
        raise TopologyParseError(
            f"expected the header row of `nvidia-smi topo -m` (GPU0 GPU1 … CPU Affinity), "
            f"found {line.strip()!r}",
            line_number,
        )
    if len(set(labels)) != len(labels):
        raise TopologyParseError("the header names a device twice", line_number)
    return labels, attributes


def _every_row(rows, labels, noun, line_number, source="topology matrix"):
    """Refuses a matrix without a row for each of its header's labels (`noun`: what they are)."""
    missing = [label for label in labels if label not in rows]
    if missing:
        raise TopologyParseError(
            f"the matrix has rows for {len(rows)} of {len(labels)} {noun}; "
            f"missing {', '.join(missing)}",
            line_number,
            source,
        )


def _parse_matrix(lines: list[str]) -> dict:
    header_index = _first_content_line(lines)
    if header_index == len(lines):
        raise TopologyParseError("no `nvidia-smi topo -m` matrix in the text", 1)
    labels, attributes = _split_header(lines[header_index], header_index + 1)

    end = header_index + 1
    while end < len(lines) and lines[end].strip() and lines[end].strip() != "Legend:":
        end += 1
    legend, nic_devices = _parse_legends(lines, end, labels)

    rows: dict[str, list[str]] = {}
    affinity = []
    for index in range(header_index + 1, end):
        line_number = index + 1
        tokens = lines[index].split()
        label = tokens[0]
        if label not in labels:
            raise TopologyParseError(f"row label {label!r} is not in the header", line_number)
        if label in rows:
            raise TopologyParseError(f"a second row for {label}", line_number)
        cells = tokens[1 : 1 + len(labels)]
        values = tokens[1 + len(labels) :]
        if len(cells) < len(labels):
            raise TopologyParseError(
                f"{label} row has {len(cells)} cells, the header names {len(labels)} devices",
                line_number,
            )
        for column, cell in zip(labels, cells, strict=True):
            if not _CODE.match(cell):
                raise TopologyParseError(
                    f"{cell!r} in {label} row, column {column} is no link type", line_number
                )
        if cells[labels.index(label)] != "X":
            raise TopologyParseError(
                f"{label} row has {cells[labels.index(label)]!r} where it meets its own column "
                f"(expected X); are cells missing?",
                line_number,
            )
        if _GPU_LABEL.match(label):
            if len(values) != len(attributes):
                raise TopologyParseError(
                    f"{label} row has {len(values)} values after the matrix, the header names "
                    f"{len(attributes)} ({_attribute_titles(attributes)})",
                    line_number,
                )
            found = dict(zip(attributes, values, strict=True))
            affinity.append({"gpu": label} | {key: found.get(key) for _, key in _ATTRIBUTE_COLUMNS})
        elif values:
            raise TopologyParseError(
                f"{label} row has {len(values)} values after the matrix; only GPU rows carry "
                f"affinity columns",
                line_number,
            )
        rows[label] = cells

    _every_row(rows, labels, "devices", end + 1)
    links, statuses = _codes_found(rows.values(), legend)
    if statuses and not links and not attributes:
        raise TopologyParseError(
            f"this is `nvidia-smi topo -p2p` output (P2P statuses such as "
            f"{', '.join(statuses[:3])}), not the link matrix of `nvidia-smi topo -m`; send it "
            f"as a P2P matrix",
            header_index + 1,
        )
    has_legend = _check_whole_legends(lines, end, labels, legend, nic_devices)
    nics = [_nic(label, nic_devices, has_legend) for label in labels if not _GPU_LABEL.match(label)]
    return {
        "labels": labels,
        "cells": [rows[label] for label in labels],
        "affinity": affinity,
        "nics": nics,
    }


def _nic(label: str, nic_devices: dict, has_legend: bool) -> dict:
    """A NIC of the snapshot: a header's device name (mlx5_0) is its device; a number (NIC0) is
    named by the NIC legend, and a paste with no legend leaves its device unknown, saying why."""
    if not _NIC_LABEL.match(label):
        return {"name": label, "device": label}
    if label in nic_devices or has_legend:
        return {"name": label, "device": nic_devices.get(label)}
    return {"name": label, "device": None, "note": NIC_NAME_UNKNOWN}


def _attribute_titles(attributes: list[str]) -> str:
    titles = {key: title for title, key in _ATTRIBUTE_COLUMNS}
    return ", ".join(titles[key] for key in attributes) or "no affinity columns"


def _parse_legends(lines: list[str], start: int, labels: list[str]) -> tuple[set[str], dict]:
    """Read the `Legend:` and `NIC Legend:` sections after the matrix rows."""
    codes: set[str] = set()
    nic_devices: dict[str, str] = {}
    section = None
    for index in range(start, len(lines)):
        line = lines[index]
        stripped = line.strip()
        if not stripped:
            continue
        if stripped == "Legend:":
            section = "legend"
        elif stripped == "NIC Legend:":
            section = "nic"
        elif section == "legend" and _LEGEND_ENTRY.match(line):
            codes.add(_LEGEND_ENTRY.match(line).group(1))
        elif section == "nic" and _NIC_LEGEND_ENTRY.match(line):
            nic, device = _NIC_LEGEND_ENTRY.match(line).groups()
            if nic not in labels:
                raise TopologyParseError(
                    f"the NIC legend names {nic}, absent from the matrix", index + 1
                )
            nic_devices[nic] = device
        else:
            expected = {
                None: "the legend",
                "legend": "a legend entry such as 'PIX  = …'",
                "nic": "a NIC legend entry such as 'NIC0: mlx5_0'",
            }[section]
            raise TopologyParseError(f"expected {expected}, found {stripped!r}", index + 1)
    return codes, nic_devices


def _check_whole_legends(lines, start, labels, legend, nic_devices) -> bool:
    """Refuse text cut off inside its legends: stored, a cut NIC legend would read as every NIC's
    device changed to unknown. Text pasted without any legend is whole (its link codes say
    what they are); the NICs it numbers keep their names unknown. True when it has a legend."""
    last = max((i for i in range(start, len(lines)) if lines[i].strip()), default=start - 1) + 1
    titles = {lines[i].strip() for i in range(start, len(lines))}
    if not titles & {"Legend:", "NIC Legend:"}:
        return False
    if "Legend:" in titles:
        # measured against the generation whose entries it has; one that has none past X
        # (a legend of codes moeops does not know) is judged by having any at all
        cut = [
            [code for code in whole if code not in legend]
            for whole in _WHOLE_LEGENDS
            if legend & set(whole[1:])
        ]
        if not legend - {"X"} or (cut and all(cut)):
            missing = min(cut, key=len) if cut else list(_WHOLE_LEGENDS[0][1:])
            raise TopologyParseError(
                f"the legend is cut off: it lacks {', '.join(missing)}; send the whole output "
                f"of `nvidia-smi topo -m`",
                last,
            )
    numbered = [label for label in labels if _NIC_LABEL.match(label)]
    unnamed = [label for label in numbered if label not in nic_devices]
    if unnamed:
        # nvidia-smi prints the NIC legend last: a legend without it was cut before it
        raise TopologyParseError(
            f"the NIC legend is cut off: nothing says which device {_span(unnamed)} "
            f"{'is' if len(unnamed) == 1 else 'are'} (NIC0: mlx5_0); send the whole output of "
            f"`nvidia-smi topo -m`",
            last,
        )
    return True


def _span(labels: list[str]) -> str:
    """ "NIC3" or "NIC3…NIC7": the labels, first and last."""
    return labels[0] if len(labels) == 1 else f"{labels[0]}…{labels[-1]}"


def _codes_found(rows, legend: set[str]) -> tuple[list[str], list[str]]:
    """(link types, P2P statuses) that the cells and the legend hold, the diagonal's X aside:
    the two outputs share no other code, which tells them apart."""
    codes = {cell for row in rows for cell in row} | legend
    links = sorted(c for c in codes if c != "X" and (c in _LINK_CODES or _NVLINK_CELL.match(c)))
    statuses = sorted(c for c in codes if c != "X" and c in _P2P_CODES)
    return links, statuses


def _not_p2p(found: list[str], line_number: int, source: str) -> TopologyParseError:
    return TopologyParseError(
        f"this is `nvidia-smi topo -m` output ({found}), not `nvidia-smi topo -p2p`; send it "
        f"as the topology matrix",
        line_number,
        source,
    )


def _parse_p2p(lines: list[str], kind: str, gpu_labels: list[str]) -> dict:
    source = f"p2p {kind}"
    header_index = _first_content_line(lines)
    if header_index == len(lines):
        raise TopologyParseError("no `nvidia-smi topo -p2p` matrix in the text", 1, source)
    if any(title in lines[header_index] for title, _ in _ATTRIBUTE_COLUMNS):
        raise _not_p2p("affinity columns", header_index + 1, source)
    labels = lines[header_index].split()
    if not labels or labels[0] != "GPU0" or not all(_GPU_LABEL.match(label) for label in labels):
        raise TopologyParseError(
            f"expected the header row of `nvidia-smi topo -p2p` (GPU0 GPU1 …), "
            f"found {lines[header_index].strip()!r}",
            header_index + 1,
            source,
        )
    if gpu_labels and labels != gpu_labels:
        raise TopologyParseError(
            f"its GPUs ({' '.join(labels)}) differ from the topology matrix's "
            f"({' '.join(gpu_labels)})",
            header_index + 1,
            source,
        )
    end = header_index + 1
    while end < len(lines) and lines[end].strip() and lines[end].strip() != "Legend:":
        end += 1
    legend = _p2p_legend(lines, end, source)
    rows: dict[str, list[str]] = {}
    for index in range(header_index + 1, end):
        label, cells = _p2p_row(lines[index], index + 1, labels, source)
        if label in rows:
            raise TopologyParseError(f"a second row for {label}", index + 1, source)
        rows[label] = cells
    _every_row(rows, labels, "GPUs", end + 1, source)
    links, statuses = _codes_found(rows.values(), legend)
    if links and not statuses:
        raise _not_p2p(f"link types such as {', '.join(links[:3])}", header_index + 1, source)
    rows = {label: ["unknown" if c == "U" else c for c in cells] for label, cells in rows.items()}
    return {"labels": labels, "matrix": [rows[label] for label in labels]}


def _p2p_legend(lines: list[str], start: int, source: str) -> set[str]:
    """The codes the legend of a `topo -p2p` text names, from line index `start` on."""
    legend = set()
    for index in range(start, len(lines)):
        stripped = lines[index].strip()
        if not stripped or stripped == "Legend:":
            continue
        entry = _LEGEND_ENTRY.match(lines[index])
        if not entry:
            raise TopologyParseError(
                f"expected a legend entry such as 'OK   = Status Ok', found {stripped!r}",
                index + 1,
                source,
            )
        legend.add(entry.group(1))
    return legend


def _p2p_row(line: str, line_number: int, labels: list[str], source: str) -> tuple:
    """(label, cells) of one row of a `topo -p2p` matrix whose header names `labels`."""
    tokens = line.split()
    label, cells = tokens[0], tokens[1:]
    if label not in labels:
        raise TopologyParseError(f"row label {label!r} is not in the header", line_number, source)
    if len(cells) != len(labels):
        raise TopologyParseError(
            f"{label} row has {len(cells)} cells, the header names {len(labels)} GPUs",
            line_number,
            source,
        )
    for column, cell in zip(labels, cells, strict=True):
        if not _CODE.match(cell):
            raise TopologyParseError(
                f"{cell!r} in {label} row, column {column} is no P2P status", line_number, source
            )
    return label, cells


def unknown_gpu(index: int) -> dict:
    """A GPU entry of the snapshot with nothing known but its index."""
    return {
        "index": index,
        "name": None,
        "uuid": None,
        "pci_bus_id": None,
        "compute_capability": None,
        "sm": None,
        "memory_total_mib": None,
        "power_limit_w": None,
        "pcie": {"gen_max": None, "gen_current": None, "width_max": None, "width_current": None},
        "nvlinks_active": None,
    }


# --------------------------------------------------------------------------- diff and fingerprint

_GPU_FIELDS = (
    ("name", "name", ""),
    ("uuid", "UUID", ""),
    ("pci_bus_id", "PCI bus id", ""),
    ("compute_capability", "compute capability", ""),
    ("memory_total_mib", "memory", " MiB"),
    ("power_limit_w", "power limit", " W"),
    ("nvlinks_active", "active NVLinks", ""),
)
# gen_current is left out: idle GPUs drop their link to Gen1 to save power, which is no change
_PCIE_FIELDS = (
    ("gen_max", "PCIe max gen"),
    ("width_max", "PCIe max width"),
    ("width_current", "PCIe width"),
)
_AFFINITY_FIELDS = (("cpu", "CPU affinity"), ("numa", "NUMA affinity"), ("gpu_numa", "GPU NUMA ID"))
_P2P_WORDS = {
    "OK": "OK",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
}


def _material(snapshot: dict) -> dict:
    """What describes the host in a snapshot; capture details and unknown keys are dropped."""
    virtualization = snapshot.get("virtualization") or {}
    gpus = {}
    for gpu in snapshot.get("gpus") or []:
        pcie = gpu.get("pcie") or {}
        entry = {field: gpu.get(field) for field, _, _ in _GPU_FIELDS}
        gpus[f"GPU{gpu.get('index')}"] = entry | {
            field: pcie.get(field) for field, _ in _PCIE_FIELDS
        }
    p2p = snapshot.get("p2p") or {}
    return {
        "source": snapshot.get("source"),
        "virtualization": {
            "kind": virtualization.get("kind"),
            "technology": virtualization.get("technology"),
            "layers": [
                (layer.get("kind"), layer.get("technology"))
                for layer in virtualization.get("layers") or []
            ],
        },
        "driver_version": snapshot.get("driver_version"),
        "cuda_version": snapshot.get("cuda_version"),
        "hostname": snapshot.get("hostname"),
        "gpus": gpus,
        "nics": {nic.get("name"): nic.get("device") for nic in snapshot.get("nics") or []},
        "links": _cells(snapshot.get("links")),
        "p2p": {kind: _cells(p2p.get(kind)) if p2p.get(kind) else None for kind in P2P_KINDS},
        "affinity": {
            entry.get("gpu"): {field: entry.get(field) for field, _ in _AFFINITY_FIELDS}
            for entry in snapshot.get("affinity") or []
        },
    }


def _cells(block: dict | None) -> dict:
    """{"devices": sorted labels, "pairs": {"A|B": cell}} so that label order does not matter."""
    labels = (block or {}).get("labels") or []
    matrix = (block or {}).get("matrix") or []
    pairs = {}
    for row_label, row in zip(labels, matrix, strict=False):
        for column_label, cell in zip(labels, row, strict=False):
            if row_label != column_label:
                pairs[f"{row_label}|{column_label}"] = cell
    return {"devices": sorted(labels), "pairs": pairs}


def snapshot_fingerprint(snapshot: dict) -> str:
    """Stable sha256 hex digest of what describes the host (not capture time, evidence, raw text).

    Two snapshots have the same fingerprint exactly when `diff_snapshots` finds no difference.
    """
    canonical = json.dumps(_material(snapshot), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _shown(value, unit: str = "") -> str:
    return "unknown" if value is None else f"{value}{unit}"


def _layer(kind, technology) -> str:
    kind = _shown(kind).replace("_", " ")
    return f"{kind} ({technology})" if technology else kind


def diff_snapshots(old: dict, new: dict) -> list[str]:
    """What changed from `old` to `new`, one human sentence each; [] when the host is the same.

    e.g. "virtualization: vm (kvm) → container (lxc)", "driver: 570.1 → 580.2",
    "link GPU0↔GPU1: NV18 → SYS", "P2P read GPU0↔GPU1: OK → not supported".
    """
    before, after = _material(old), _material(new)
    changes: list[str] = []
    old_virt, new_virt = before["virtualization"], after["virtualization"]
    if (old_virt["kind"], old_virt["technology"]) != (new_virt["kind"], new_virt["technology"]):
        changes.append(
            f"virtualization: {_layer(old_virt['kind'], old_virt['technology'])} → "
            f"{_layer(new_virt['kind'], new_virt['technology'])}"
        )
    elif old_virt["layers"] != new_virt["layers"]:
        old_layers = ", ".join(_layer(*layer) for layer in old_virt["layers"]) or "none"
        new_layers = ", ".join(_layer(*layer) for layer in new_virt["layers"]) or "none"
        changes.append(f"virtualization layers: {old_layers} → {new_layers}")
    for key, title in (
        ("driver_version", "driver"),
        ("cuda_version", "CUDA"),
        ("hostname", "hostname"),
        ("source", "source"),
    ):
        if before[key] != after[key]:
            changes.append(f"{title}: {_shown(before[key])} → {_shown(after[key])}")
    changes += _diff_devices(before, after)
    # devices already reported as added or removed are not repeated for every matrix
    reported = (before["gpus"].keys() ^ after["gpus"].keys()) | (
        before["nics"].keys() ^ after["nics"].keys()
    )
    changes += _diff_matrix("link", before["links"], after["links"], str, reported)
    for kind in P2P_KINDS:
        old_block, new_block = before["p2p"][kind], after["p2p"][kind]
        if (old_block is None) != (new_block is None):
            state = (
                ("not captured", "captured") if old_block is None else ("captured", "not captured")
            )
            changes.append(f"P2P {kind}: {state[0]} → {state[1]}")
        elif old_block is not None:
            changes += _diff_matrix(f"P2P {kind}", old_block, new_block, _p2p_word, reported)
    for gpu in sorted(before["affinity"].keys() & after["affinity"].keys(), key=_label_order):
        for field, title in _AFFINITY_FIELDS:
            old_value, new_value = before["affinity"][gpu][field], after["affinity"][gpu][field]
            if old_value != new_value:
                changes.append(f"{gpu} {title}: {_shown(old_value)} → {_shown(new_value)}")
    changed_rows = (before["affinity"].keys() ^ after["affinity"].keys()) - reported
    for gpu in sorted(changed_rows, key=_label_order):
        state = "added" if gpu in after["affinity"] else "removed"
        changes.append(f"{gpu} affinity {state}")
    return changes


def _label_order(label) -> tuple:
    """GPU2 before GPU10: sort by the text before the number, then the number."""
    match = re.fullmatch(r"(\D*)(\d+)", str(label))
    return (match.group(1), int(match.group(2)), "") if match else (str(label), -1, str(label))


def _p2p_word(code) -> str:
    return _P2P_WORDS.get(code, str(code))


def _diff_devices(before: dict, after: dict) -> list[str]:
    def gpu_changes(label, old, new):
        fields = [(field, title, unit) for field, title, unit in _GPU_FIELDS]
        fields += [(field, title, "") for field, title in _PCIE_FIELDS]
        return [
            f"{label} {title}: {_shown(old[field], unit)} → {_shown(new[field], unit)}"
            for field, title, unit in fields
            if old[field] != new[field]
        ]

    def nic_changes(name, old, new):
        return [f"{name} device: {_shown(old)} → {_shown(new)}"] if old != new else []

    gpus = _diff_named(before["gpus"], after["gpus"], lambda gpu: gpu["name"], gpu_changes)
    return gpus + _diff_named(before["nics"], after["nics"], lambda nic: nic, nic_changes)


def _diff_named(old: dict, new: dict, name_of, changes_of) -> list[str]:
    """The lines for two {label: device} tables, in label order: a device removed or added
    (shown by name_of(device)), else changes_of(label, old device, new device)."""
    changes = []
    for label in sorted(old.keys() | new.keys(), key=_label_order):
        if label not in new:
            changes.append(f"{label} removed ({_shown(name_of(old[label]))})")
        elif label not in old:
            changes.append(f"{label} added ({_shown(name_of(new[label]))})")
        else:
            changes += changes_of(label, old[label], new[label])
    return changes


def _diff_matrix(title: str, old: dict, new: dict, word, reported: set) -> list[str]:
    """Sentences for changed cells; a pair that changed alike both ways is one "A↔B" sentence."""
    changes = []
    added = sorted(set(new["devices"]) - set(old["devices"]) - reported, key=_label_order)
    removed = sorted(set(old["devices"]) - set(new["devices"]) - reported, key=_label_order)
    if added:
        changes.append(f"{title} matrix gained {', '.join(added)}")
    if removed:
        changes.append(f"{title} matrix lost {', '.join(removed)}")
    shared = sorted(set(old["devices"]) & set(new["devices"]), key=_label_order)
    for i, a in enumerate(shared):
        for b in shared[i + 1 :]:
            there = (old["pairs"].get(f"{a}|{b}"), new["pairs"].get(f"{a}|{b}"))
            back = (old["pairs"].get(f"{b}|{a}"), new["pairs"].get(f"{b}|{a}"))
            if there[0] == there[1] and back[0] == back[1]:
                continue
            if there[0] == back[0] and there[1] == back[1]:
                changes.append(f"{title} {a}↔{b}: {word(there[0])} → {word(there[1])}")
                continue
            for (x, y), (was, now) in (((a, b), there), ((b, a), back)):
                if was != now:
                    changes.append(f"{title} {x}→{y}: {word(was)} → {word(now)}")
    return changes
