"""A snapshot's virtualization in words, innermost layer first, and the VM layer that decides
P2P however deep it lies; snapshots that name one layer only read as before."""

import json

import pytest

from domain.topology import virtualization_words, vm_layer
from tests import fakes

FIRECRACKER = json.loads((fakes.FIXTURES / "topology/probe_1xh200_firecracker.json").read_text())


def test_a_container_in_a_vm_is_said_as_such():
    virtualization = FIRECRACKER["virtualization"]

    assert virtualization_words(virtualization) == "Container (docker) in a VM (firecracker)"
    assert vm_layer(virtualization) == {"kind": "vm", "technology": "firecracker"}


def test_a_vm_layer_names_its_hypervisor_before_its_vmm():
    virtualization = {
        "kind": "container",
        "technology": "docker",
        "layers": [
            {"kind": "vm", "technology": "firecracker", "hypervisor": "kvm"},
            {"kind": "container", "technology": "docker"},
        ],
    }

    assert virtualization_words(virtualization) == ("Container (docker) in a VM (kvm, firecracker)")


@pytest.mark.parametrize(
    ("virtualization", "words", "in_vm"),
    [
        # one value, as snapshots before layers (and nvidia-smi imports) hold it
        ({"kind": "vm", "technology": "kvm"}, "Virtual machine (kvm)", True),
        ({"kind": "container", "technology": "lxc", "evidence": []}, "Container (lxc)", False),
        ({"kind": "bare_metal", "technology": None, "layers": []}, "Bare metal", False),
        ({}, "Unknown", False),
        ({"kind": "vm", "technology": "kvm", "layers": [{"kind": "vm", "technology": "kvm"}]},
         "Virtual machine (kvm)", True),
    ],
)  # fmt: skip
def test_a_snapshot_of_one_layer_reads_as_before(virtualization, words, in_vm):
    assert virtualization_words(virtualization) == words
    assert (vm_layer(virtualization) is not None) is in_vm
