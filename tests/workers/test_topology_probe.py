import json
import sys
from types import SimpleNamespace

import pytest

from domain.topology import parse_nvidia_smi_topo
from tests import fakes
from tests.fakes import TOPOLOGY_SNAPSHOT_KEYS, python_module
from workers import topology
from workers.topology import probe

FIXTURES = fakes.FIXTURES / "topology"
NOT_SUPPORTED, INVALID_ARGUMENT, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND = 3, 2, 9, 12


class NVMLError(Exception):
    """Stands in for pynvml.NVMLError: carries NVML's return code as `value`."""

    messages = {
        NOT_SUPPORTED: "Not Supported",
        DRIVER_NOT_LOADED: "Driver Not Loaded",
        LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    }

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return self.messages.get(self.value, f"NVML error {self.value}")


def gpu(bus_id, **overrides):
    """One fake GPU: an H200 on PCIe Gen5 x16 without NVLink unless overridden."""
    return SimpleNamespace(
        **{
            "name": "NVIDIA H200",
            "uuid": f"GPU-{bus_id}",
            "bus_id": bus_id,
            "capability": (9, 0),
            "memory_mib": 143771,
            "power_mw": 700000,
            "pcie": (5, 1, 16, 16),
            # (remote PCI bus id, remote device type) per active link
            "nvlinks": [],
            "nvlink_slots": 0,
            "mode": 0,
            "cpu_mask": [(1 << 48) - 1],
            "node_mask": None,
            "numa_node_id": NOT_SUPPORTED,
            "failing": set(),
        }
        | overrides
    )


class FakeNvml:
    """A pynvml stand-in with the calls the probe makes, answering from fake GPUs."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, gpus, ancestors=None, p2p=None, init_error=None):
        self.gpus = gpus
        self.ancestors = ancestors or {}
        self.p2p = p2p or {}
        self.init_error = init_error
        self.shut_down = False
        self.p2p_indexes = set()

    def _answer(self, handle, call, value):
        if call in handle.failing:
            raise NVMLError(NOT_SUPPORTED)
        return value

    def nvmlInit(self):
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self):
        return "580.82.07"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle):
        return self._answer(handle, "name", handle.name)

    def nvmlDeviceGetUUID(self, handle):
        return handle.uuid

    def nvmlDeviceGetPciInfo(self, handle):
        return SimpleNamespace(busId=handle.bus_id.encode())

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return handle.capability

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=handle.memory_mib * 2**20, used=0, free=0)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._answer(handle, "power", handle.power_mw)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return handle.pcie[0]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return handle.pcie[1]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return handle.pcie[2]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return handle.pcie[3]

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if not handle.nvlink_slots:
            raise NVMLError(NOT_SUPPORTED)
        if link >= handle.nvlink_slots:
            raise NVMLError(INVALID_ARGUMENT)
        return 1 if link < len(handle.nvlinks) else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link):
        return SimpleNamespace(busId=handle.nvlinks[link][0].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link):
        return handle.nvlinks[link][1]

    def nvmlDeviceGetTopologyCommonAncestor(self, first, second):
        pair = frozenset((self.gpus.index(first), self.gpus.index(second)))
        return self.ancestors.get(pair, 50)

    def nvmlDeviceGetP2PStatus(self, first, second, caps_index):
        self.p2p_indexes.add(caps_index)
        answer = self.p2p.get((caps_index, self.gpus.index(first), self.gpus.index(second)), 0)
        if isinstance(answer, NVMLError):
            raise answer
        return answer

    def nvmlDeviceGetVirtualizationMode(self, handle):
        return handle.mode

    def nvmlDeviceGetCpuAffinity(self, handle, words):
        return handle.cpu_mask[:words] + [0] * (words - len(handle.cpu_mask))

    def nvmlDeviceGetMemoryAffinity(self, handle, words, scope):
        assert scope == 0  # NVML_AFFINITY_SCOPE_NODE
        if handle.node_mask is None:
            raise NVMLError(NOT_SUPPORTED)
        return handle.node_mask[:words] + [0] * (words - len(handle.node_mask))

    def nvmlDeviceGetNumaNodeId(self, handle):
        if handle.numa_node_id == NOT_SUPPORTED:
            raise NVMLError(NOT_SUPPORTED)
        return handle.numa_node_id


def write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def clock_sources(root, text):
    """The kernel's list of available clock sources (kvm-clock: a KVM guest)."""
    write(root, "sys/devices/system/clocksource/clocksource0/available_clocksource", text)


def firecracker_dsdt(root):
    """A Firecracker guest's ACPI DSDT header: OEM FIRECK, table FCVMDSDT."""
    header = b"DSDT" + b"\x53\x17\x00\x00" + b"\x02\x77" + b"FIRECK" + b"FCVMDSDT"
    (root / "sys/firmware/acpi/tables").mkdir(parents=True)
    (root / "sys/firmware/acpi/tables/DSDT").write_bytes(header + b"\x00" * 12)


def cpuinfo(hypervisor):
    flags = "fpu vme de pse tsc msr pae mce cx8 apic sep" + (" hypervisor" if hypervisor else "")
    return "".join(f"processor\t: {n}\nflags\t\t: {flags}\n\n" for n in range(2))


def no_gpus():
    return FakeNvml([])


def virtualization(root, nvml=None):
    return probe(root, nvml=nvml or no_gpus())["virtualization"]


# --------------------------------------------------------------------------- GPUs through NVML


def test_it_reads_each_gpu_through_nvml(tmp_path):
    nvml = FakeNvml([gpu("00000000:18:00.0")])

    snapshot = probe(tmp_path, nvml=nvml)

    assert set(snapshot) == TOPOLOGY_SNAPSHOT_KEYS
    assert snapshot["source"] == "probe"
    assert snapshot["driver_version"] == "580.82.07"
    assert snapshot["cuda_version"] == "13.0"
    assert snapshot["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "uuid": "GPU-00000000:18:00.0",
            "pci_bus_id": "00000000:18:00.0",
            "compute_capability": "9.0",
            "sm": "SM90",
            "memory_total_mib": 143771,
            "power_limit_w": 700.0,
            "pcie": {"gen_max": 5, "gen_current": 1, "width_max": 16, "width_current": 16},
            "nvlinks_active": 0,
        }
    ]
    assert snapshot["links"] == {"labels": ["GPU0"], "matrix": [["X"]]}
    assert nvml.shut_down


@pytest.mark.parametrize(
    ("capability", "sm"), [((12, 0), "SM120"), ((10, 0), "SM100"), ((8, 9), "SM89")]
)
def test_it_names_the_sm_from_the_compute_capability(tmp_path, capability, sm):
    snapshot = probe(tmp_path, nvml=FakeNvml([gpu("00000000:01:00.0", capability=capability)]))

    assert snapshot["gpus"][0]["sm"] == sm
    assert snapshot["gpus"][0]["compute_capability"] == f"{capability[0]}.{capability[1]}"


def test_it_leaves_a_field_nvml_refuses_unknown(tmp_path):
    nvml = FakeNvml([gpu("00000000:01:00.0", failing={"power", "name"})])

    entry = probe(tmp_path, nvml=nvml)["gpus"][0]

    assert entry["power_limit_w"] is None
    assert entry["name"] is None
    assert entry["memory_total_mib"] == 143771


def test_it_counts_nvlinks_between_a_pair_from_their_remote_pci_addresses(tmp_path):
    buses = ["00000000:01:00.0", "00000000:21:00.0", "00000000:41:00.0", "00000000:61:00.0"]
    pairs = {0: 2, 1: 3, 2: 0, 3: 1}
    gpus = [
        gpu(bus, nvlinks=[(buses[pairs[i]], 0)] * 4, nvlink_slots=4) for i, bus in enumerate(buses)
    ]
    # PHB between neighbours, NODE across: the 4× RTX 3090 host of the fixture
    ancestors = {
        frozenset((0, 1)): 30,
        frozenset((2, 3)): 30,
        frozenset((0, 3)): 40,
        frozenset((1, 2)): 40,
    }

    snapshot = probe(tmp_path, nvml=FakeNvml(gpus, ancestors))

    imported = parse_nvidia_smi_topo((FIXTURES / "topo_m_4x3090_nvlink_pairs.txt").read_text())
    assert snapshot["links"] == imported["links"]
    assert [entry["nvlinks_active"] for entry in snapshot["gpus"]] == [4, 4, 4, 4]


def test_it_joins_nvswitch_attached_gpus_as_nvidia_smi_does(tmp_path):
    switches = ["00000000:A5:00.0", "00000000:A6:00.0", "00000000:A7:00.0", "00000000:A8:00.0"]
    links = [(switches[link % 4], 2) for link in range(18)]
    gpus = [gpu(f"00000000:{bus:02X}:00.0", nvlinks=links, nvlink_slots=18) for bus in range(8)]

    snapshot = probe(tmp_path, nvml=FakeNvml(gpus))

    matrix = snapshot["links"]["matrix"]
    assert all(matrix[i][j] == "NV18" for i in range(8) for j in range(8) if i != j)
    assert [entry["nvlinks_active"] for entry in snapshot["gpus"]] == [18] * 8


@pytest.mark.parametrize(
    ("level", "cell"),
    [
        (0, "same board"),
        (10, "PIX"),
        (20, "PXB"),
        (30, "PHB"),
        (40, "NODE"),
        (50, "SYS"),
        (60, "unknown"),
    ],
)
def test_it_names_the_common_pcie_ancestor_of_a_pair(tmp_path, level, cell):
    gpus = [gpu("00000000:01:00.0"), gpu("00000000:02:00.0")]

    snapshot = probe(tmp_path, nvml=FakeNvml(gpus, {frozenset((0, 1)): level}))

    assert snapshot["links"]["matrix"] == [["X", cell], [cell, "X"]]


def test_it_reads_p2p_status_for_read_write_nvlink_and_atomics(tmp_path):
    gpus = [gpu("00000000:01:00.0"), gpu("00000000:02:00.0")]
    statuses = {
        (1, 0, 1): 1,  # write: chipset not supported
        (1, 1, 0): 1,
        (2, 0, 1): 5,  # nvlink: not supported
        (2, 1, 0): 5,
        (3, 0, 1): 2,  # atomics: GPU not supported
        (3, 1, 0): NVMLError(NOT_SUPPORTED),
    }
    nvml = FakeNvml(gpus, p2p=statuses)

    p2p = probe(tmp_path, nvml=nvml)["p2p"]

    assert p2p["read"] == {"labels": ["GPU0", "GPU1"], "matrix": [["X", "OK"], ["OK", "X"]]}
    assert p2p["write"]["matrix"] == [["X", "CNS"], ["CNS", "X"]]
    assert p2p["nvlink"]["matrix"] == [["X", "NS"], ["NS", "X"]]
    assert p2p["atomics"]["matrix"] == [["X", "GNS"], ["unknown", "X"]]
    assert nvml.p2p_indexes == {0, 1, 2, 3}


def test_it_reads_cpu_and_numa_affinity_through_nvml(tmp_path):
    mask = [0xFFFF_FFFF_FFFF, 0xFFFF_FFFF_0000_0000, 0xFFFF]  # CPUs 0-47 and 96-143
    nvml = FakeNvml([gpu("00000000:9A:00.0", cpu_mask=mask, node_mask=[0b10])])

    affinity = probe(tmp_path, nvml=nvml)["affinity"]

    assert affinity == [{"gpu": "GPU0", "cpu": "0-47,96-143", "numa": "1", "gpu_numa": "N/A"}]


def test_it_reads_the_numa_node_from_sysfs_where_nvml_cannot_say(tmp_path):
    write(tmp_path, "sys/bus/pci/devices/0000:9a:00.0/numa_node", "1\n")

    affinity = probe(tmp_path, nvml=FakeNvml([gpu("00000000:9A:00.0")]))["affinity"][0]

    assert affinity["numa"] == "1"


def test_it_reports_no_numa_node_as_nvidia_smi_does(tmp_path):
    write(tmp_path, "sys/bus/pci/devices/0000:00:07.0/numa_node", "-1\n")

    affinity = probe(tmp_path, nvml=FakeNvml([gpu("00000000:00:07.0")]))["affinity"][0]

    assert affinity["numa"] == "N/A"


def test_it_leaves_the_numa_node_unknown_without_sysfs(tmp_path):
    affinity = probe(tmp_path, nvml=FakeNvml([gpu("00000000:00:07.0")]))["affinity"][0]

    assert affinity["numa"] is None


def test_it_reads_the_numa_id_of_gpu_memory_on_coherent_hosts(tmp_path):
    nvml = FakeNvml([gpu("00000009:01:00.0", numa_node_id=4)])

    assert probe(tmp_path, nvml=nvml)["affinity"][0]["gpu_numa"] == "4"


def test_it_lists_infiniband_devices_and_reads_the_hostname_under_root(tmp_path):
    for device in ("mlx5_1", "mlx5_0"):
        (tmp_path / "sys/class/infiniband" / device).mkdir(parents=True)
    write(tmp_path, "etc/hostname", "gpu-node-07\n")

    snapshot = probe(tmp_path, nvml=no_gpus())

    assert snapshot["nics"] == [
        {"name": "mlx5_0", "device": "mlx5_0"},
        {"name": "mlx5_1", "device": "mlx5_1"},
    ]
    assert snapshot["hostname"] == "gpu-node-07"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
        (DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_it_says_why_without_nvml_and_lists_no_gpus(tmp_path, code, reason):
    snapshot = probe(tmp_path, nvml=FakeNvml([gpu("00000000:01:00.0")], init_error=code))

    assert snapshot["gpus"] == []
    assert snapshot["links"] == {"labels": [], "matrix": []}
    assert snapshot["p2p"] == {"read": None, "write": None, "nvlink": None, "atomics": None}
    assert snapshot["driver_version"] is None
    assert f"nvml unavailable: {reason}" in snapshot["virtualization"]["evidence"]


def test_it_says_why_when_pynvml_cannot_be_imported(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)

    snapshot = probe(tmp_path)

    assert snapshot["gpus"] == []
    assert snapshot["virtualization"]["evidence"][0].startswith(
        "nvml unavailable: pynvml not importable"
    )


def test_the_probe_command_prints_the_snapshot_as_json(tmp_path):
    write(tmp_path, "etc/hostname", "lab-host\n")
    write(tmp_path, "run/systemd/container", "lxc\n")

    done = python_module("workers.topology", "probe", "--root", str(tmp_path))

    assert done.returncode == 0, done.stderr
    snapshot = json.loads(done.stdout)
    assert snapshot["source"] == "probe"
    assert snapshot["hostname"] == "lab-host"
    assert snapshot["virtualization"]["kind"] == "container"


# --------------------------------------------------------------------------- virtualization


def test_it_classifies_bare_metal_from_cpu_flags_and_dmi(tmp_path):
    write(tmp_path, "proc/cpuinfo", cpuinfo(hypervisor=False))
    write(tmp_path, "sys/class/dmi/id/sys_vendor", "Supermicro\n")
    write(tmp_path, "sys/class/dmi/id/product_name", "SYS-821GE-TNHR\n")

    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"], found["layers"]) == ("bare_metal", None, [])
    assert "/proc/cpuinfo: no hypervisor flag" in found["evidence"]
    assert (
        "/sys/class/dmi/id: sys_vendor 'Supermicro', product_name 'SYS-821GE-TNHR'"
        in found["evidence"]
    )


def test_it_classifies_bare_metal_from_nvml_virtualization_mode_none(tmp_path):
    found = virtualization(tmp_path, FakeNvml([gpu("00000000:01:00.0", mode=0)]))

    assert found["kind"] == "bare_metal"
    assert "nvml virtualization mode: NONE" in found["evidence"]


def test_it_classifies_a_vm_from_nvml_pass_through(tmp_path):
    nvml = FakeNvml([gpu("00000000:01:00.0", mode=1), gpu("00000000:02:00.0", mode=1)])

    found = virtualization(tmp_path, nvml)

    assert (found["kind"], found["technology"]) == ("vm", None)
    assert found["evidence"].count("nvml virtualization mode: PASSTHROUGH") == 1


def test_it_classifies_a_vm_from_the_hypervisor_cpu_flag(tmp_path):
    write(tmp_path, "proc/cpuinfo", cpuinfo(hypervisor=True))

    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"]) == ("vm", None)
    assert "/proc/cpuinfo: hypervisor flag set" in found["evidence"]


@pytest.mark.parametrize(
    ("vendor", "product", "technology"),
    [
        ("QEMU", "Standard PC (Q35 + ICH9, 2009)", "qemu"),
        ("Red Hat", "KVM", "kvm"),
        ("Amazon EC2", "p5.48xlarge", "amazon"),
        ("Google", "Google Compute Engine", "google"),
        ("Microsoft Corporation", "Virtual Machine", "microsoft"),
        ("VMware, Inc.", "VMware20,1", "vmware"),
        ("Firecracker", "Firecracker VM", "firecracker"),
    ],
)
def test_it_names_the_hypervisor_from_dmi(tmp_path, vendor, product, technology):
    write(tmp_path, "sys/class/dmi/id/sys_vendor", vendor + "\n")
    write(tmp_path, "sys/class/dmi/id/product_name", product + "\n")

    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"]) == ("vm", technology)
    assert found["layers"] == [{"kind": "vm", "technology": technology}]


def test_it_names_firecracker_from_its_acpi_tables(tmp_path):
    firecracker_dsdt(tmp_path)
    clock_sources(tmp_path, "tsc kvm-clock \n")

    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"]) == ("vm", "firecracker")
    assert "ACPI DSDT: OEM FIRECK FCVMDSDT" in found["evidence"]
    assert "clocksource: kvm-clock available" in found["evidence"]


def test_a_container_in_a_firecracker_vm_keeps_both_layers_and_the_hypervisor(tmp_path):
    firecracker_dsdt(tmp_path)
    clock_sources(tmp_path, "kvm-clock")
    write(tmp_path, ".dockerenv", "")

    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"]) == ("container", "docker")
    assert found["layers"] == [
        {"kind": "vm", "technology": "firecracker", "hypervisor": "kvm"},
        {"kind": "container", "technology": "docker"},
    ]


def test_it_names_kvm_from_the_kvm_clock_source(tmp_path):
    clock_sources(tmp_path, "kvm-clock tsc acpi_pm\n")

    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"]) == ("vm", "kvm")


def test_it_calls_qemu_accelerated_by_kvm_a_kvm_vm(tmp_path):
    write(tmp_path, "sys/class/dmi/id/sys_vendor", "QEMU\n")
    write(tmp_path, "sys/class/dmi/id/product_name", "Standard PC (Q35 + ICH9, 2009)\n")
    clock_sources(tmp_path, "kvm-clock tsc\n")

    assert virtualization(tmp_path)["technology"] == "kvm"


def test_it_takes_an_ec2_metal_instance_for_bare_metal(tmp_path):
    write(tmp_path, "proc/cpuinfo", cpuinfo(hypervisor=False))
    write(tmp_path, "sys/class/dmi/id/sys_vendor", "Amazon EC2\n")
    write(tmp_path, "sys/class/dmi/id/product_name", "p5.metal\n")

    assert virtualization(tmp_path)["kind"] == "bare_metal"


def test_it_classifies_lxc_from_run_systemd_container(tmp_path):
    write(tmp_path, "run/systemd/container", "lxc\n")

    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"]) == ("container", "lxc")
    assert "/run/systemd/container: lxc" in found["evidence"]


def test_it_classifies_lxc_from_the_environment_of_pid_1(tmp_path):
    path = tmp_path / "proc/1/environ"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PATH=/usr/bin\0container=lxc\0TERM=linux\0")

    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"]) == ("container", "lxc")
    assert "/proc/1/environ: container=lxc" in found["evidence"]


@pytest.mark.parametrize(
    ("marker", "technology"), [(".dockerenv", "docker"), ("run/.containerenv", "podman")]
)
def test_it_classifies_docker_and_podman_from_their_marker_files(tmp_path, marker, technology):
    write(tmp_path, marker, "")

    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"]) == ("container", technology)


def test_it_reports_an_lxc_container_inside_a_kvm_vm_with_both_layers(tmp_path):
    write(tmp_path, "proc/cpuinfo", cpuinfo(hypervisor=True))
    write(tmp_path, "sys/class/dmi/id/sys_vendor", "Red Hat\n")
    write(tmp_path, "sys/class/dmi/id/product_name", "KVM\n")
    write(tmp_path, "run/systemd/container", "lxc\n")
    nvml = FakeNvml([gpu("00000000:01:00.0", mode=1)])

    found = virtualization(tmp_path, nvml)

    assert (found["kind"], found["technology"]) == ("container", "lxc")
    assert found["layers"] == [
        {"kind": "vm", "technology": "kvm"},
        {"kind": "container", "technology": "lxc"},
    ]
    assert "nvml virtualization mode: PASSTHROUGH" in found["evidence"]
    assert "/proc/cpuinfo: hypervisor flag set" in found["evidence"]


def test_it_says_unknown_when_nothing_is_readable(tmp_path):
    found = virtualization(tmp_path)

    assert (found["kind"], found["technology"], found["layers"]) == ("unknown", None, [])
    assert "/sys/class/dmi/id: no sys_vendor or product_name" in found["evidence"]


def test_it_runs_systemd_detect_virt_only_on_the_live_root(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(topology.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(topology.subprocess, "run", lambda *a, **k: calls.append(a))

    virtualization(tmp_path)

    assert calls == []


def test_it_puts_systemd_detect_virt_answers_first_on_the_live_root(monkeypatch):
    answers = {"--vm": "kvm\n", "--container": "lxc\n"}
    monkeypatch.setattr(topology.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(
        topology.subprocess,
        "run",
        lambda command, **kwargs: SimpleNamespace(stdout=answers[command[1]], returncode=0),
    )

    found = virtualization("/")

    # the VM's technology also depends on this machine's ACPI tables, so only its kind is checked
    assert [layer["kind"] for layer in found["layers"]] == ["vm", "container"]
    assert found["layers"][-1] == {"kind": "container", "technology": "lxc"}
    assert found["evidence"][:2] == [
        "systemd-detect-virt --vm: kvm",
        "systemd-detect-virt --container: lxc",
    ]
