import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.topology import diff_snapshots, parse_nvidia_smi_topo, snapshot_fingerprint
from tests import fakes

FIXTURES = fakes.FIXTURES / "topology"


def h200(index, **overrides):
    return {
        "index": index,
        "name": "NVIDIA H200",
        "uuid": f"GPU-{index}",
        "pci_bus_id": f"00000000:{index + 0x18:02X}:00.0",
        "compute_capability": "9.0",
        "sm": "SM90",
        "memory_total_mib": 143771,
        "power_limit_w": 700.0,
        "pcie": {"gen_max": 5, "gen_current": 5, "width_max": 16, "width_current": 16},
        "nvlinks_active": 18,
    } | overrides


def two_gpu_vm():
    """A probe snapshot of a 2× H200 KVM guest with NVLink and working P2P."""
    ok = {"labels": ["GPU0", "GPU1"], "matrix": [["X", "OK"], ["OK", "X"]]}
    return {
        "source": "probe",
        "virtualization": {
            "kind": "vm",
            "technology": "kvm",
            "evidence": [
                "nvml virtualization mode: PASSTHROUGH",
                "/proc/cpuinfo: hypervisor flag set",
            ],
            "layers": [{"kind": "vm", "technology": "kvm"}],
        },
        "driver_version": "570.1",
        "cuda_version": "12.8",
        "gpus": [h200(0), h200(1)],
        "links": {"labels": ["GPU0", "GPU1"], "matrix": [["X", "NV18"], ["NV18", "X"]]},
        "p2p": {
            "read": copy.deepcopy(ok),
            "write": copy.deepcopy(ok),
            "nvlink": copy.deepcopy(ok),
            "atomics": copy.deepcopy(ok),
        },
        "affinity": [
            {"gpu": "GPU0", "cpu": "0-47", "numa": "0", "gpu_numa": "N/A"},
            {"gpu": "GPU1", "cpu": "0-47", "numa": "0", "gpu_numa": "N/A"},
        ],
        "nics": [{"name": "mlx5_0", "device": "mlx5_0"}],
        "hostname": "glm5-host",
    }


def test_it_finds_nothing_between_equal_snapshots():
    assert diff_snapshots(two_gpu_vm(), two_gpu_vm()) == []
    assert snapshot_fingerprint(two_gpu_vm()) == snapshot_fingerprint(two_gpu_vm())


def test_it_ignores_capture_details_evidence_and_an_idle_link_downshift():
    new = two_gpu_vm() | {"captured_at": 1767225600.0, "raw_text": "GPU0 GPU1 ..."}
    new["virtualization"]["evidence"] = ["systemd-detect-virt --vm: kvm"]
    new["gpus"][0]["pcie"]["gen_current"] = 1

    assert diff_snapshots(two_gpu_vm(), new) == []
    assert snapshot_fingerprint(new) == snapshot_fingerprint(two_gpu_vm())


def test_it_ignores_the_order_of_devices_in_a_matrix():
    new = two_gpu_vm()
    new["p2p"]["read"] = {"labels": ["GPU1", "GPU0"], "matrix": [["X", "OK"], ["OK", "X"]]}

    assert diff_snapshots(two_gpu_vm(), new) == []
    assert snapshot_fingerprint(new) == snapshot_fingerprint(two_gpu_vm())


def test_it_tells_the_move_from_a_kvm_vm_to_an_lxc_container():
    new = two_gpu_vm()
    new["virtualization"] = {
        "kind": "container",
        "technology": "lxc",
        "evidence": ["/run/systemd/container: lxc"],
        "layers": [{"kind": "container", "technology": "lxc"}],
    }
    new["driver_version"] = "580.2"
    new["links"]["matrix"] = [["X", "SYS"], ["SYS", "X"]]
    new["p2p"]["read"]["matrix"] = [["X", "NS"], ["NS", "X"]]

    assert diff_snapshots(two_gpu_vm(), new) == [
        "virtualization: vm (kvm) → container (lxc)",
        "driver: 570.1 → 580.2",
        "link GPU0↔GPU1: NV18 → SYS",
        "P2P read GPU0↔GPU1: OK → not supported",
    ]
    assert snapshot_fingerprint(new) != snapshot_fingerprint(two_gpu_vm())


def test_it_tells_a_new_layer_under_the_same_container():
    old, new = two_gpu_vm(), two_gpu_vm()
    old["virtualization"] |= {
        "kind": "container",
        "technology": "lxc",
        "layers": [{"kind": "container", "technology": "lxc"}],
    }
    new["virtualization"] |= {
        "kind": "container",
        "technology": "lxc",
        "layers": [{"kind": "vm", "technology": "kvm"}, {"kind": "container", "technology": "lxc"}],
    }

    assert diff_snapshots(old, new) == [
        "virtualization layers: container (lxc) → vm (kvm), container (lxc)"
    ]


def test_it_tells_each_direction_of_an_asymmetric_p2p_change():
    new = two_gpu_vm()
    new["p2p"]["write"]["matrix"] = [["X", "CNS"], ["OK", "X"]]

    assert diff_snapshots(two_gpu_vm(), new) == ["P2P write GPU0→GPU1: OK → chipset not supported"]


def test_it_tells_gpu_field_changes_with_units():
    new = two_gpu_vm()
    new["gpus"][1] |= {"power_limit_w": 600.0, "nvlinks_active": 0}
    new["gpus"][1]["pcie"]["width_current"] = 8

    assert diff_snapshots(two_gpu_vm(), new) == [
        "GPU1 power limit: 700.0 W → 600.0 W",
        "GPU1 active NVLinks: 18 → 0",
        "GPU1 PCIe width: 16 → 8",
    ]


def test_it_tells_an_added_gpu_once():
    old = two_gpu_vm()
    new = two_gpu_vm()
    new["gpus"].append(h200(2))
    new["links"] = {
        "labels": ["GPU0", "GPU1", "GPU2"],
        "matrix": [["X", "NV18", "NV18"], ["NV18", "X", "NV18"], ["NV18", "NV18", "X"]],
    }
    new["affinity"].append({"gpu": "GPU2", "cpu": "48-95", "numa": "1", "gpu_numa": "N/A"})

    assert diff_snapshots(old, new) == ["GPU2 added (NVIDIA H200)"]


def test_it_tells_affinity_nic_and_p2p_capture_changes():
    new = two_gpu_vm()
    new["affinity"][0]["cpu"] = "0-95"
    new["nics"] = [{"name": "mlx5_0", "device": "mlx5_0"}, {"name": "mlx5_1", "device": "mlx5_1"}]
    new["p2p"]["atomics"] = None

    assert diff_snapshots(two_gpu_vm(), new) == [
        "mlx5_1 added (mlx5_1)",
        "P2P atomics: captured → not captured",
        "GPU0 CPU affinity: 0-47 → 0-95",
    ]


def test_it_shows_unread_values_as_unknown():
    new = two_gpu_vm() | {"cuda_version": None}

    assert diff_snapshots(two_gpu_vm(), new) == ["CUDA: 12.8 → unknown"]


def test_it_compares_an_import_with_a_probe_of_the_same_host():
    imported = parse_nvidia_smi_topo((FIXTURES / "topo_m_2x5090_phb_tabs.txt").read_text())
    probed = copy.deepcopy(imported) | {"source": "probe", "driver_version": "580.95.05"}

    assert diff_snapshots(imported, probed) == [
        "driver: unknown → 580.95.05",
        "source: nvidia-smi → probe",
    ]


def test_a_probe_agrees_with_nvidia_smi_on_the_links_and_affinity_of_the_same_h200():
    imported = parse_nvidia_smi_topo(
        (FIXTURES / "topo_m_1xh200_firecracker_ansi.txt").read_text(),
        {"nvlink": (FIXTURES / "p2p_1xh200_nvlink_ansi.txt").read_text()},
    )
    probed = json.loads((FIXTURES / "probe_1xh200_firecracker.json").read_text())

    changes = diff_snapshots(imported, probed)

    assert "virtualization: unknown → container (docker)" in changes
    assert "GPU0 power limit: unknown → 700.0 W" in changes
    assert not [line for line in changes if line.startswith(("link", "GPU0 CPU", "GPU0 NUMA"))]
    assert not [line for line in changes if line.startswith("P2P nvlink")]


def test_it_reads_snapshots_that_miss_keys():
    assert diff_snapshots({}, {}) == []
    assert diff_snapshots({}, {"hostname": "a"}) == ["hostname: unknown → a"]


LINK_CODES = st.sampled_from(["X", "NV18", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS"])
P2P_CODES = st.sampled_from(["OK", "CNS", "GNS", "TNS", "NS", "DR", "unknown"])


@settings(max_examples=60, deadline=None)
@given(
    row=st.integers(0, 15),
    column=st.integers(0, 15),
    link=LINK_CODES,
    p2p=P2P_CODES,
    kind=st.sampled_from(["read", "write", "nvlink", "atomics"]),
)
def test_a_fingerprint_changes_exactly_when_the_diff_says_something(row, column, link, p2p, kind):
    old = parse_nvidia_smi_topo((FIXTURES / "topo_m_8xh100_nv18_8nics.txt").read_text())
    old["p2p"][kind] = {"labels": ["GPU0", "GPU1"], "matrix": [["X", "OK"], ["OK", "X"]]}
    new = copy.deepcopy(old)
    new["links"]["matrix"][row][column] = link
    new["p2p"][kind]["matrix"][row % 2][1 - row % 2] = p2p

    changed = diff_snapshots(old, new)

    assert (changed == []) == (snapshot_fingerprint(old) == snapshot_fingerprint(new))


@pytest.mark.parametrize(
    "key", ["source", "driver_version", "cuda_version", "hostname", "gpus", "nics", "affinity"]
)
def test_a_changed_top_level_part_changes_the_fingerprint(key):
    new = two_gpu_vm()
    new[key] = [] if isinstance(new[key], list) else "changed"

    assert diff_snapshots(two_gpu_vm(), new) != []
    assert snapshot_fingerprint(new) != snapshot_fingerprint(two_gpu_vm())
