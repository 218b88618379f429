"""Probe this GPU host's topology (NVML, /proc, /sys: GPUs, links, P2P, NUMA affinity, NICs and
virtualization layers) into the snapshot format of domain.topology, and the command line:

    python -m workers.topology probe [--root DIR]
    python -m workers.topology parse FILE [--p2p-read FILE ...]

Whatever cannot be read is None or "unknown", never guessed; pynvml is imported only inside
`probe`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from domain.topology import P2P_KINDS, TopologyParseError, parse_nvidia_smi_topo, unknown_gpu

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
    gpu = unknown_gpu(index)
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


@dataclass
class _VirtSigns:
    """What the evidence says so far: each reader adds its lines and what they point to."""

    evidence: list
    in_vm: bool = False
    vmm: list = field(default_factory=list)  # named by DMI or ACPI tables
    hypervisor: list = field(default_factory=list)  # systemd-detect-virt, clocksource, Xen
    containers: list = field(default_factory=list)
    not_virtualized: bool = False


def _classify_virtualization(root: Path, nvml_modes: list[str], live: bool, evidence: list) -> dict:
    """Classify bare metal / VM / container from every kind of evidence, keeping all of it.

    A VM's technology names its VMM where DMI or ACPI does (firecracker, amazon, ...), else
    the hypervisor (kvm from systemd-detect-virt or kvm-clock); QEMU accelerated by KVM is
    reported as kvm, as systemd-detect-virt does.
    """
    signs = _VirtSigns(evidence)
    _nvml_signs(signs, nvml_modes)
    if live and shutil.which("systemd-detect-virt"):
        _detect_virt_signs(signs)
    _container_signs(signs, root)
    _cpu_signs(signs, root)
    _firmware_signs(signs, root)
    layers = _layers(signs)
    if layers:
        kind, technology = layers[-1]["kind"], layers[-1]["technology"]
    else:
        kind, technology = ("bare_metal" if signs.not_virtualized else "unknown"), None
    return {"kind": kind, "technology": technology, "evidence": evidence, "layers": layers}


def _nvml_signs(signs: _VirtSigns, nvml_modes: list[str]) -> None:
    for mode in dict.fromkeys(nvml_modes):
        signs.evidence.append(f"nvml virtualization mode: {mode}")
        if mode in ("PASSTHROUGH", "VGPU"):
            signs.in_vm = True
        elif mode in ("NONE", "HOST_VGPU", "HOST_VSGA"):
            signs.not_virtualized = True


def _detect_virt_signs(signs: _VirtSigns) -> None:
    answer, line = _detect_virt("--vm")
    signs.evidence.append(line)
    if answer == "none":
        signs.not_virtualized = True
    elif answer:
        signs.hypervisor.append(answer)
    answer, line = _detect_virt("--container")
    signs.evidence.append(line)
    if answer and answer != "none":
        signs.containers.append(answer)


def _container_signs(signs: _VirtSigns, root: Path) -> None:
    marker = _read_text(root / "run/systemd/container")
    if marker:
        signs.evidence.append(f"/run/systemd/container: {marker}")
        signs.containers.append(marker)
    try:
        environ = (root / "proc/1/environ").read_bytes().split(b"\0")
    except PermissionError:
        signs.evidence.append("/proc/1/environ: unreadable (permission denied)")
        environ = []
    except OSError:
        environ = []
    for variable in environ:
        if variable.startswith(b"container="):
            value = variable.decode(errors="replace").partition("=")[2]
            signs.evidence.append(f"/proc/1/environ: container={value}")
            signs.containers.append(value or None)
    for marker_file, technology in ((".dockerenv", "docker"), ("run/.containerenv", "podman")):
        if (root / marker_file).exists():
            signs.evidence.append(f"/{marker_file} present")
            signs.containers.append(technology)


def _cpu_signs(signs: _VirtSigns, root: Path) -> None:
    cpuinfo = _read_text(root / "proc/cpuinfo")
    # x86 lists CPU flags on "flags" lines; ARM has no hypervisor flag to look for
    flag_lines = [line for line in (cpuinfo or "").splitlines() if line.startswith("flags")]
    if any("hypervisor" in line.split() for line in flag_lines):
        signs.evidence.append("/proc/cpuinfo: hypervisor flag set")
        signs.in_vm = True
    elif flag_lines:
        signs.evidence.append("/proc/cpuinfo: no hypervisor flag")
        signs.not_virtualized = True


def _firmware_signs(signs: _VirtSigns, root: Path) -> None:
    """DMI and ACPI name a VMM; the clocksource and /sys/hypervisor name a hypervisor."""
    dmi = root / "sys/class/dmi/id"
    vendor, product = _read_text(dmi / "sys_vendor"), _read_text(dmi / "product_name")
    if vendor is None and product is None:
        signs.evidence.append("/sys/class/dmi/id: no sys_vendor or product_name")
    else:
        signs.evidence.append(f"/sys/class/dmi/id: sys_vendor {vendor!r}, product_name {product!r}")
        signs.vmm.append(_dmi_hypervisor(vendor or "", product or ""))
    for table in ("DSDT", "FACP"):
        try:
            header = (root / "sys/firmware/acpi/tables" / table).read_bytes()[:24]
        except OSError:
            continue
        oem_id = header[10:16].decode(errors="replace").strip()
        oem_table = header[16:24].decode(errors="replace").strip()
        signs.evidence.append(f"ACPI {table}: OEM {oem_id} {oem_table}")
        signs.vmm.append(_ACPI_OEM_VMMS.get(oem_id))
        break
    clocksources = _read_text(
        root / "sys/devices/system/clocksource/clocksource0/available_clocksource"
    )
    if clocksources and "kvm-clock" in clocksources.split():
        signs.evidence.append("clocksource: kvm-clock available")
        signs.hypervisor.append("kvm")
    xen = _read_text(root / "sys/hypervisor/type")
    if xen:
        signs.evidence.append(f"/sys/hypervisor/type: {xen}")
        signs.hypervisor.append(xen)


def _layers(signs: _VirtSigns) -> list[dict]:
    """The layers the GPUs sit in, outermost first: a VM, then a container in it."""
    vmm = [name for name in signs.vmm if name]
    hypervisor = signs.hypervisor
    layers = []
    if signs.in_vm or vmm or hypervisor:
        technology = (vmm + hypervisor + [None])[0]
        if technology == "qemu" and "kvm" in hypervisor:
            technology = "kvm"
        layer = {"kind": "vm", "technology": technology}
        # a VMM named by DMI or ACPI runs on a hypervisor: Firecracker on kvm
        if hypervisor and hypervisor[0] != technology:
            layer["hypervisor"] = hypervisor[0]
        layers.append(layer)
    if signs.containers:
        layers.append(
            {"kind": "container", "technology": next(filter(None, signs.containers), None)}
        )
    return layers


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
