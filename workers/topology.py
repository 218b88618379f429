"""Host topology: probe a GPU host, import `nvidia-smi topo` text, and compare snapshots.

A snapshot is a plain dict (JSON) with exactly these top-level keys:

    source          "probe" | "nvidia-smi"
    virtualization  {"kind": "bare_metal" | "vm" | "container" | "unknown",
                     "technology": "kvm" | "lxc" | "docker" | ... | None,
                     "evidence": ["/run/systemd/container: lxc", ...],
                     "layers": [{"kind": "vm", "technology": "kvm"},
                                {"kind": "container", "technology": "lxc"}]}
                    `kind`/`technology` name the layer a user sees (the innermost); `layers`
                    lists every virtualization layer found, outermost first ([] on bare metal).
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
    nics            [{"name": "NIC0", "device": "mlx5_0"}]
    hostname        str | None

Whatever cannot be read is None or "unknown", never guessed. Link cells use nvidia-smi's
codes (X, PIX, PXB, PHB, NODE, SYS, NV<n>; "same board" for two GPUs on one card); P2P
cells use its codes too (OK, CNS, GNS, TNS, NS, DR) with "unknown" for unknown. A code
neither legend documents (a newer driver's) is kept verbatim; the parser tells `topo -m`
text from `topo -p2p` text by the codes it holds and refuses one sent for the other.

This module imports nothing heavy at import time: the web tier imports the pure functions
`parse_nvidia_smi_topo`, `diff_snapshots` and `snapshot_fingerprint`; pynvml is imported
only inside `probe`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

P2P_KINDS = ("read", "write", "nvlink", "atomics")


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
# `nvidia-smi topo -p2p`'s legend; DR (disabled by regkey) is printed by newer drivers only.
_P2P_CODES = {"X", "OK", "CNS", "GNS", "TNS", "NS", "DR", "U"}
# A code either legend may add later (C2C, …) is kept; a cell of another shape is text that
# slipped into the matrix (an affinity value, a number), so the row is wrong.
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9#]{0,15}\Z")
_LEGEND_ENTRY = re.compile(r"\s*(\S+)\s*=\s*\S")
_NIC_LEGEND_ENTRY = re.compile(r"\s*(NIC\d+):\s*(\S+)\s*\Z")
_GPU_LABEL = re.compile(r"GPU\d+\Z")


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
        "gpus": [_unknown_gpu(int(label[3:])) for label in gpu_labels],
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

    missing = [label for label in labels if label not in rows]
    if missing:
        raise TopologyParseError(
            f"the matrix has rows for {len(rows)} of {len(labels)} devices; "
            f"missing {', '.join(missing)}",
            end + 1,
        )
    links, statuses = _codes_found(rows.values(), legend)
    if statuses and not links and not attributes:
        raise TopologyParseError(
            f"this is `nvidia-smi topo -p2p` output (P2P statuses such as "
            f"{', '.join(statuses[:3])}), not the link matrix of `nvidia-smi topo -m`; send it "
            f"as a P2P matrix",
            header_index + 1,
        )
    nics = [
        {"name": label, "device": nic_devices.get(label, None if label[:3] == "NIC" else label)}
        for label in labels
        if not _GPU_LABEL.match(label)
    ]
    return {
        "labels": labels,
        "cells": [rows[label] for label in labels],
        "affinity": affinity,
        "nics": nics,
    }


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
    legend = set()
    for index in range(end, len(lines)):
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

    rows: dict[str, list[str]] = {}
    for index in range(header_index + 1, end):
        line_number = index + 1
        tokens = lines[index].split()
        label, cells = tokens[0], tokens[1:]
        if label not in labels:
            raise TopologyParseError(
                f"row label {label!r} is not in the header", line_number, source
            )
        if label in rows:
            raise TopologyParseError(f"a second row for {label}", line_number, source)
        if len(cells) != len(labels):
            raise TopologyParseError(
                f"{label} row has {len(cells)} cells, the header names {len(labels)} GPUs",
                line_number,
                source,
            )
        for column, cell in zip(labels, cells, strict=True):
            if not _CODE.match(cell):
                raise TopologyParseError(
                    f"{cell!r} in {label} row, column {column} is no P2P status",
                    line_number,
                    source,
                )
        rows[label] = cells
    missing = [label for label in labels if label not in rows]
    if missing:
        raise TopologyParseError(
            f"the matrix has rows for {len(rows)} of {len(labels)} GPUs; "
            f"missing {', '.join(missing)}",
            end + 1,
            source,
        )
    links, statuses = _codes_found(rows.values(), legend)
    if links and not statuses:
        raise _not_p2p(f"link types such as {', '.join(links[:3])}", header_index + 1, source)
    rows = {label: ["unknown" if c == "U" else c for c in cells] for label, cells in rows.items()}
    return {"labels": labels, "matrix": [rows[label] for label in labels]}


def _unknown_gpu(index: int) -> dict:
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


# --------------------------------------------------------------------------- the probe

# nvmlGpuTopologyLevel_t; INTERNAL is two GPUs on one board (K80, GTX 690)
_TOPOLOGY_LEVELS = {0: "same board", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlGpuP2PCapsIndex_t; written out because pynvml's NVML_P2P_CAPS_INDEX_READ is a tuple
_P2P_CAPS_INDEX = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}
# nvmlGpuP2PStatus_t → nvidia-smi's codes
_P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "unknown"}
_VIRTUALIZATION_MODES = {0: "NONE", 1: "PASSTHROUGH", 2: "VGPU", 3: "HOST_VGPU", 4: "HOST_VSGA"}
_NVLINK_REMOTE_SWITCH = 2
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_INVALID_ARGUMENT = 2
_NVML_AFFINITY_SCOPE_NODE = 0
# DMI sys_vendor / product_name fragments → hypervisor, in the order they are tried
_DMI_HYPERVISORS = (
    ("Firecracker", "firecracker"),
    ("KVM", "kvm"),
    ("QEMU", "qemu"),
    ("Google Compute Engine", "google"),
    ("VMware", "vmware"),
    ("VirtualBox", "oracle"),
    ("innotek", "oracle"),
    ("Xen", "xen"),
    ("HVM domU", "xen"),
    ("OpenStack", "openstack"),
    ("Parallels", "parallels"),
    ("BHYVE", "bhyve"),
    ("Bochs", "bochs"),
    ("Apple Virtualization", "apple"),
)
# OEM IDs that VMMs write into the ACPI tables they generate
_ACPI_OEM_VMMS = {"FIRECK": "firecracker", "BOCHS": "qemu"}


def probe(root: str | os.PathLike = "/", nvml=None) -> dict:
    """Capture this host's topology snapshot through NVML and the files under `root`.

    `root` is where /proc, /sys, /run and /etc are read from (tests pass a fake folder);
    `systemd-detect-virt` runs and the hostname is asked of the kernel only when root is "/".
    `nvml` is a pynvml-like module; None imports pynvml. Without NVML (no library, no driver)
    the GPU list is empty and the virtualization evidence says why; the probe never raises.
    """
    root = Path(root)
    live = root == Path("/")
    snapshot = {
        "source": "probe",
        "virtualization": None,
        "driver_version": None,
        "cuda_version": None,
        "gpus": [],
        "links": {"labels": [], "matrix": []},
        "p2p": dict.fromkeys(P2P_KINDS),
        "affinity": [],
        "nics": _infiniband_nics(root),
        "hostname": socket.gethostname() if live else _read_text(root / "etc/hostname"),
    }
    evidence: list[str] = []
    modes: list[str] = []
    nvml, unavailable = _load_nvml(nvml)
    if unavailable:
        evidence.append(f"nvml unavailable: {unavailable}")
    else:
        try:
            modes = _probe_gpus(nvml, root, snapshot)
        finally:
            _nvml_call(nvml, "nvmlShutdown")
    snapshot["virtualization"] = _classify_virtualization(root, modes, live, evidence)
    return snapshot


def _load_nvml(nvml):
    """(module, None) with NVML initialised, or (None, reason) when it cannot be."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as error:
            return None, f"pynvml not importable ({error})"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        return None, str(error)
    return nvml, None


def _nvml_call(nvml, name: str, *args):
    """nvml.<name>(*args), or None when this NVML lacks the call or refuses it."""
    function = getattr(nvml, name, None)
    if function is None:
        return None
    try:
        return function(*args)
    except nvml.NVMLError:
        return None


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _pci_address(bus_id) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) from NVML's "00000000:18:00.0" or sysfs' "0000:18:00.0"."""
    match = re.fullmatch(
        r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])", _text(bus_id) or ""
    )
    return tuple(int(part, 16) for part in match.groups()) if match else None


def _probe_gpus(nvml, root: Path, snapshot: dict) -> list[str]:
    """Fill the NVML parts of `snapshot`; return each GPU's virtualization mode name."""
    snapshot["driver_version"] = _text(_nvml_call(nvml, "nvmlSystemGetDriverVersion"))
    cuda = _nvml_call(nvml, "nvmlSystemGetCudaDriverVersion")
    snapshot["cuda_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
    count = _nvml_call(nvml, "nvmlDeviceGetCount") or 0
    handles = [_nvml_call(nvml, "nvmlDeviceGetHandleByIndex", index) for index in range(count)]
    gpus, remotes, modes = [], [], []
    for index, handle in enumerate(handles):
        gpu, links = _probe_gpu(nvml, index, handle)
        gpus.append(gpu)
        remotes.append(links)
        mode = _nvml_call(nvml, "nvmlDeviceGetVirtualizationMode", handle)
        if mode is not None:
            modes.append(_VIRTUALIZATION_MODES.get(mode, f"mode {mode}"))
        snapshot["affinity"].append(_probe_affinity(nvml, root, handle, gpu))
    labels = [f"GPU{gpu['index']}" for gpu in gpus]
    snapshot["gpus"] = gpus
    snapshot["links"] = {"labels": labels, "matrix": _link_matrix(nvml, handles, gpus, remotes)}
    snapshot["p2p"] = {
        kind: {"labels": labels, "matrix": _p2p_matrix(nvml, handles, caps_index)}
        for kind, caps_index in _P2P_CAPS_INDEX.items()
    }
    return modes


def _probe_gpu(nvml, index: int, handle) -> tuple[dict, list[tuple]]:
    """One GPU's entry and, for each active NVLink, (remote PCI address, remote is a switch)."""
    gpu = _unknown_gpu(index)
    if handle is None:
        return gpu, []
    pci = _nvml_call(nvml, "nvmlDeviceGetPciInfo", handle)
    capability = _nvml_call(nvml, "nvmlDeviceGetCudaComputeCapability", handle)
    memory = _nvml_call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    power_mw = _nvml_call(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)
    gpu |= {
        "name": _text(_nvml_call(nvml, "nvmlDeviceGetName", handle)),
        "uuid": _text(_nvml_call(nvml, "nvmlDeviceGetUUID", handle)),
        "pci_bus_id": _text(pci.busId) if pci is not None else None,
        "compute_capability": f"{capability[0]}.{capability[1]}" if capability else None,
        "sm": f"SM{capability[0]}{capability[1]}" if capability else None,
        "memory_total_mib": memory.total // 2**20 if memory is not None else None,
        "power_limit_w": power_mw / 1000 if power_mw is not None else None,
        "pcie": {
            "gen_max": _nvml_call(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "gen_current": _nvml_call(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "width_max": _nvml_call(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle),
            "width_current": _nvml_call(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        },
    }
    link_state = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
    active, answered, refused_otherwise = [], False, link_state is None
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18) if link_state else 0):
        try:
            state = link_state(handle, link)
        except nvml.NVMLError as error:
            # links past the GPU's own count answer "not supported" or "invalid argument"
            code = getattr(error, "value", None)
            refused_otherwise |= code not in (
                _NVML_ERROR_NOT_SUPPORTED,
                _NVML_ERROR_INVALID_ARGUMENT,
            )
            continue
        answered = True
        if state:
            remote = _nvml_call(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            kind = _nvml_call(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            address = _pci_address(remote.busId) if remote is not None else None
            active.append((address, kind == _NVLINK_REMOTE_SWITCH))
    gpu["nvlinks_active"] = len(active) if answered or not refused_otherwise else None
    return gpu, active


def _link_matrix(nvml, handles: list, gpus: list[dict], remotes: list[list[tuple]]) -> list:
    """nvidia-smi's link matrix: NV<n> where NVLinks join a pair, else the PCIe ancestor.

    NVLinks between two GPUs are counted from the remote PCI address of each active link.
    Links that end at an NVSwitch join every pair of switch-attached GPUs; such a pair
    shows the smaller of the two GPUs' switch link counts, as nvidia-smi does (NV18 on HGX H100).
    """
    addresses = [_pci_address(gpu["pci_bus_id"]) for gpu in gpus]
    switch_links = [sum(1 for _, to_switch in links if to_switch) for links in remotes]
    matrix = []
    for i, handle in enumerate(handles):
        row = []
        for j, other in enumerate(handles):
            direct = max(
                sum(1 for address, _ in remotes[i] if address and address == addresses[j]),
                sum(1 for address, _ in remotes[j] if address and address == addresses[i]),
            )
            if i == j:
                row.append("X")
            elif direct:
                row.append(f"NV{direct}")
            elif switch_links[i] and switch_links[j]:
                row.append(f"NV{min(switch_links[i], switch_links[j])}")
            else:
                level = None
                if handle is not None and other is not None:
                    level = _nvml_call(nvml, "nvmlDeviceGetTopologyCommonAncestor", handle, other)
                row.append(_TOPOLOGY_LEVELS.get(level, "unknown"))
        matrix.append(row)
    return matrix


def _p2p_matrix(nvml, handles: list, caps_index: int) -> list:
    matrix = []
    for i, handle in enumerate(handles):
        row = []
        for j, other in enumerate(handles):
            status = None
            if i != j and handle is not None and other is not None:
                status = _nvml_call(nvml, "nvmlDeviceGetP2PStatus", handle, other, caps_index)
            row.append("X" if i == j else _P2P_STATUS.get(status, "unknown"))
        matrix.append(row)
    return matrix


def _probe_affinity(nvml, root: Path, handle, gpu: dict) -> dict:
    """CPU and NUMA affinity as nvidia-smi shows them, and the GPU NUMA ID (coherent memory).

    NUMA affinity comes from NVML's memory affinity, as in nvidia-smi; where NVML cannot say,
    from the GPU's numa_node in sysfs.
    """
    cpus = numa = None
    if handle is not None:
        # NVML fills as many 64-bit words as asked; 16 covers 1024 CPUs, cpu_count larger hosts
        words = max(16, -(-(os.cpu_count() or 1) // 64))
        mask = _nvml_call(nvml, "nvmlDeviceGetCpuAffinity", handle, words)
        nodes = _nvml_call(
            nvml, "nvmlDeviceGetMemoryAffinity", handle, words, _NVML_AFFINITY_SCOPE_NODE
        )
        # an empty mask says nothing about the GPU's CPUs or nodes
        cpus = (_id_ranges(mask) or None) if mask is not None else None
        numa = (_id_ranges(nodes) or None) if nodes is not None else None
    address = _pci_address(gpu["pci_bus_id"])
    if numa is None and address:
        domain, bus, device, function = address
        sysfs = root / f"sys/bus/pci/devices/{domain:04x}:{bus:02x}:{device:02x}.{function}"
        node = _read_text(sysfs / "numa_node")
        # the kernel writes -1 when the platform reports no NUMA node; nvidia-smi prints N/A
        numa = "N/A" if node == "-1" else node
    gpu_numa = None
    numa_node_id = getattr(nvml, "nvmlDeviceGetNumaNodeId", None)
    if handle is not None and numa_node_id is not None:
        try:
            gpu_numa = str(numa_node_id(handle))
        except nvml.NVMLError as error:
            # only GPUs whose memory is a NUMA node (Grace Hopper, Blackwell) have an id
            if getattr(error, "value", None) == _NVML_ERROR_NOT_SUPPORTED:
                gpu_numa = "N/A"
    return {"gpu": f"GPU{gpu['index']}", "cpu": cpus, "numa": numa, "gpu_numa": gpu_numa}


def _id_ranges(mask) -> str:
    """'0-47,96-143' from NVML's array of 64-bit CPU (or NUMA node) mask words."""
    cpus = [
        word_index * 64 + bit
        for word_index, word in enumerate(mask)
        for bit in range(64)
        if word >> bit & 1
    ]
    ranges: list[str] = []
    start = previous = None
    for cpu in cpus + [None]:
        if previous is not None and cpu == previous + 1:
            previous = cpu
            continue
        if start is not None:
            ranges.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = cpu
    return ",".join(ranges)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _infiniband_nics(root: Path) -> list[dict]:
    folder = root / "sys/class/infiniband"
    try:
        names = sorted(entry.name for entry in folder.iterdir())
    except OSError:
        return []
    return [{"name": name, "device": name} for name in names]


def _detect_virt(flag: str) -> tuple[str | None, str]:
    """systemd-detect-virt --vm / --container: (its answer or None, the evidence line)."""
    try:
        done = subprocess.run(
            ["systemd-detect-virt", flag], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"systemd-detect-virt {flag}: failed ({error})"
    answer = done.stdout.strip() or None
    return answer, f"systemd-detect-virt {flag}: {answer}"


def _classify_virtualization(root: Path, nvml_modes: list[str], live: bool, evidence: list) -> dict:
    """Classify bare metal / VM / container from every kind of evidence, keeping all of it.

    A VM's technology names its VMM where DMI or ACPI does (firecracker, amazon, ...), else
    the hypervisor (kvm from systemd-detect-virt or kvm-clock); QEMU accelerated by KVM is
    reported as kvm, as systemd-detect-virt does.
    """
    in_vm = False
    vmm: list[str] = []  # named by DMI or ACPI tables
    hypervisor: list[str] = []  # named by systemd-detect-virt, the clocksource, /sys/hypervisor
    containers: list[str | None] = []
    not_virtualized = False

    for mode in dict.fromkeys(nvml_modes):
        evidence.append(f"nvml virtualization mode: {mode}")
        if mode in ("PASSTHROUGH", "VGPU"):
            in_vm = True
        elif mode in ("NONE", "HOST_VGPU", "HOST_VSGA"):
            not_virtualized = True

    if live and shutil.which("systemd-detect-virt"):
        answer, line = _detect_virt("--vm")
        evidence.append(line)
        if answer == "none":
            not_virtualized = True
        elif answer:
            hypervisor.append(answer)
        answer, line = _detect_virt("--container")
        evidence.append(line)
        if answer and answer != "none":
            containers.append(answer)

    marker = _read_text(root / "run/systemd/container")
    if marker:
        evidence.append(f"/run/systemd/container: {marker}")
        containers.append(marker)
    try:
        environ = (root / "proc/1/environ").read_bytes().split(b"\0")
    except PermissionError:
        evidence.append("/proc/1/environ: unreadable (permission denied)")
        environ = []
    except OSError:
        environ = []
    for variable in environ:
        if variable.startswith(b"container="):
            value = variable.decode(errors="replace").partition("=")[2]
            evidence.append(f"/proc/1/environ: container={value}")
            containers.append(value or None)
    for marker_file, technology in ((".dockerenv", "docker"), ("run/.containerenv", "podman")):
        if (root / marker_file).exists():
            evidence.append(f"/{marker_file} present")
            containers.append(technology)

    cpuinfo = _read_text(root / "proc/cpuinfo")
    # x86 lists CPU flags on "flags" lines; ARM has no hypervisor flag to look for
    flag_lines = [line for line in (cpuinfo or "").splitlines() if line.startswith("flags")]
    if any("hypervisor" in line.split() for line in flag_lines):
        evidence.append("/proc/cpuinfo: hypervisor flag set")
        in_vm = True
    elif flag_lines:
        evidence.append("/proc/cpuinfo: no hypervisor flag")
        not_virtualized = True

    dmi = root / "sys/class/dmi/id"
    vendor, product = _read_text(dmi / "sys_vendor"), _read_text(dmi / "product_name")
    if vendor is None and product is None:
        evidence.append("/sys/class/dmi/id: no sys_vendor or product_name")
    else:
        evidence.append(f"/sys/class/dmi/id: sys_vendor {vendor!r}, product_name {product!r}")
        vmm.append(_dmi_hypervisor(vendor or "", product or ""))
    for table in ("DSDT", "FACP"):
        try:
            header = (root / "sys/firmware/acpi/tables" / table).read_bytes()[:24]
        except OSError:
            continue
        oem_id = header[10:16].decode(errors="replace").strip()
        oem_table = header[16:24].decode(errors="replace").strip()
        evidence.append(f"ACPI {table}: OEM {oem_id} {oem_table}")
        vmm.append(_ACPI_OEM_VMMS.get(oem_id))
        break
    clocksources = _read_text(
        root / "sys/devices/system/clocksource/clocksource0/available_clocksource"
    )
    if clocksources and "kvm-clock" in clocksources.split():
        evidence.append("clocksource: kvm-clock available")
        hypervisor.append("kvm")
    xen = _read_text(root / "sys/hypervisor/type")
    if xen:
        evidence.append(f"/sys/hypervisor/type: {xen}")
        hypervisor.append(xen)

    vmm = [name for name in vmm if name]
    layers = []
    if in_vm or vmm or hypervisor:
        technology = (vmm + hypervisor + [None])[0]
        if technology == "qemu" and "kvm" in hypervisor:
            technology = "kvm"
        layers.append({"kind": "vm", "technology": technology})
    if containers:
        layers.append({"kind": "container", "technology": next(filter(None, containers), None)})
    if layers:
        kind, technology = layers[-1]["kind"], layers[-1]["technology"]
    else:
        kind, technology = ("bare_metal" if not_virtualized else "unknown"), None
    return {"kind": kind, "technology": technology, "evidence": evidence, "layers": layers}


def _dmi_hypervisor(vendor: str, product: str) -> str | None:
    """The hypervisor a DMI vendor/product names, or None for physical hardware."""
    if vendor == "Amazon EC2":
        # EC2 bare-metal instance types (c5.metal, p5.metal) carry the same vendor
        return None if product.endswith(".metal") else "amazon"
    if vendor == "Microsoft Corporation" and product == "Virtual Machine":
        return "microsoft"
    for fragment, technology in _DMI_HYPERVISORS:
        if fragment in vendor or fragment in product:
            return technology
    return None


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
    changes = []
    old_gpus, new_gpus = before["gpus"], after["gpus"]
    for label in sorted(old_gpus.keys() | new_gpus.keys(), key=_label_order):
        if label not in new_gpus:
            changes.append(f"{label} removed ({_shown(old_gpus[label]['name'])})")
        elif label not in old_gpus:
            changes.append(f"{label} added ({_shown(new_gpus[label]['name'])})")
        else:
            fields = [(field, title, unit) for field, title, unit in _GPU_FIELDS]
            fields += [(field, title, "") for field, title in _PCIE_FIELDS]
            for field, title, unit in fields:
                old_value, new_value = old_gpus[label][field], new_gpus[label][field]
                if old_value != new_value:
                    changes.append(
                        f"{label} {title}: {_shown(old_value, unit)} → {_shown(new_value, unit)}"
                    )
    old_nics, new_nics = before["nics"], after["nics"]
    for name in sorted(old_nics.keys() | new_nics.keys(), key=_label_order):
        if name not in new_nics:
            changes.append(f"{name} removed ({_shown(old_nics[name])})")
        elif name not in old_nics:
            changes.append(f"{name} added ({_shown(new_nics[name])})")
        elif old_nics[name] != new_nics[name]:
            changes.append(f"{name} device: {_shown(old_nics[name])} → {_shown(new_nics[name])}")
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


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """`python -m workers.topology probe [--root DIR]` or `parse FILE [--p2p-read FILE ...]`."""
    parser = argparse.ArgumentParser(
        prog="python -m workers.topology", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    probe_command = commands.add_parser(
        "probe", help="probe this host through NVML and /proc, /sys"
    )
    probe_command.add_argument("--root", default="/", help="read /proc, /sys, /run from here")
    parse_command = commands.add_parser("parse", help="import `nvidia-smi topo -m` output")
    parse_command.add_argument("file", type=Path, help="`nvidia-smi topo -m` output")
    for kind in P2P_KINDS:
        parse_command.add_argument(
            f"--p2p-{kind}",
            type=Path,
            metavar="FILE",
            help=f"`nvidia-smi topo -p2p {kind[0]}` output",
        )
    arguments = parser.parse_args(argv)

    if arguments.command == "probe":
        snapshot = probe(arguments.root)
    else:
        p2p_files = {kind: getattr(arguments, f"p2p_{kind}") for kind in P2P_KINDS}
        p2p_files = {kind: path for kind, path in p2p_files.items() if path}
        try:
            snapshot = parse_nvidia_smi_topo(
                arguments.file.read_text(),
                {kind: path.read_text() for kind, path in p2p_files.items()},
            )
        except TopologyParseError as error:
            path = (
                arguments.file if error.source == "topology matrix" else p2p_files[error.source[4:]]
            )
            print(f"{path}: {error}", file=sys.stderr)
            return 2
        except OSError as error:
            print(error, file=sys.stderr)
            return 2
    json.dump(snapshot, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
