import json

import pytest

from domain.topology import P2P_KINDS, TopologyParseError, parse_nvidia_smi_topo
from tests import fakes
from tests.fakes import TOPOLOGY_SNAPSHOT_KEYS, python_module

FIXTURES = fakes.FIXTURES / "topology"


# `nvidia-smi topo -p2p r` on 2× NVIDIA L4 whose chipset does not support P2P, as published
# (stas00/ml-engineering, network/README.md), without and with its legend
L4_CNS = "$ nvidia-smi topo -p2p r\n        GPU0    GPU1\n GPU0   X       CNS\n GPU1   CNS     X\n"
L4_CNS_LEGEND = L4_CNS + (
    "\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n  CNS  = Chipset not supported\n"
    "  GNS  = GPU not supported\n  TNS  = Topology not supported\n  NS   = Not supported\n"
    "  U    = Unknown\n"
)


def fixture(name):
    return (FIXTURES / name).read_text()


def cell(snapshot, a, b):
    labels = snapshot["links"]["labels"]
    return snapshot["links"]["matrix"][labels.index(a)][labels.index(b)]


def test_it_reads_an_8_gpu_nvswitch_host_with_its_nics():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_8xh100_nv18_8nics.txt"))

    assert set(snapshot) == TOPOLOGY_SNAPSHOT_KEYS
    assert snapshot["source"] == "nvidia-smi"
    assert snapshot["links"]["labels"] == [f"GPU{i}" for i in range(8)] + [
        f"NIC{i}" for i in range(8)
    ]
    assert cell(snapshot, "GPU0", "GPU7") == "NV18"
    assert cell(snapshot, "GPU3", "NIC3") == "PIX"
    assert cell(snapshot, "GPU3", "NIC4") == "SYS"
    assert cell(snapshot, "NIC7", "NIC4") == "NODE"
    assert [row[i] for i, row in enumerate(snapshot["links"]["matrix"])] == ["X"] * 16
    assert snapshot["nics"][0] == {"name": "NIC0", "device": "mlx5_0"}
    assert snapshot["nics"][7] == {"name": "NIC7", "device": "mlx5_7"}
    assert snapshot["affinity"][0] == {
        "gpu": "GPU0",
        "cpu": "0-47,96-143",
        "numa": "0",
        "gpu_numa": "N/A",
    }
    assert snapshot["affinity"][5]["cpu"] == "48-95,144-191"
    assert [gpu["index"] for gpu in snapshot["gpus"]] == list(range(8))


def test_it_leaves_what_topo_m_does_not_print_unknown():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_8xh100_nv18_8nics.txt"))

    gpu = snapshot["gpus"][0]
    assert gpu["name"] is None and gpu["uuid"] is None and gpu["nvlinks_active"] is None
    assert gpu["pcie"] == dict.fromkeys(["gen_max", "gen_current", "width_max", "width_current"])
    assert snapshot["virtualization"]["kind"] == "unknown"
    assert snapshot["driver_version"] is None and snapshot["hostname"] is None
    assert snapshot["p2p"] == dict.fromkeys(P2P_KINDS)


def test_it_reads_nvlink_pairs_next_to_pcie_links():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_4x3090_nvlink_pairs.txt"))

    assert cell(snapshot, "GPU0", "GPU2") == "NV4"
    assert cell(snapshot, "GPU1", "GPU3") == "NV4"
    assert cell(snapshot, "GPU0", "GPU1") == "PHB"
    assert cell(snapshot, "GPU0", "GPU3") == "NODE"
    assert snapshot["nics"] == []


def test_it_reads_nic_rows_that_sit_on_one_pcie_switch():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_3gpu_nv4_2nics.txt"))

    assert cell(snapshot, "GPU0", "GPU1") == "NV4"
    assert cell(snapshot, "NIC0", "NIC1") == "PIX"
    assert cell(snapshot, "GPU2", "NIC1") == "PHB"
    assert snapshot["nics"] == [
        {"name": "NIC0", "device": "mlx5_0"},
        {"name": "NIC1", "device": "mlx5_1"},
    ]
    assert snapshot["affinity"][2] == {
        "gpu": "GPU2",
        "cpu": "64-71",
        "numa": "1",
        "gpu_numa": "N/A",
    }


def test_it_reads_a_pcie_only_host():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_4gpu_pcie_phb.txt"))

    cells = {c for row in snapshot["links"]["matrix"] for c in row}
    assert cells == {"X", "PHB"}
    assert len(snapshot["gpus"]) == 4


def test_it_reads_tab_separated_output_with_a_nic_named_by_its_device():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_8gpu_pcie_mlx5_tabs.txt"))

    assert snapshot["links"]["labels"][-1] == "mlx5_0"
    assert cell(snapshot, "GPU0", "GPU1") == "PIX"
    assert cell(snapshot, "GPU0", "GPU2") == "PXB"
    assert cell(snapshot, "GPU0", "GPU4") == "SYS"
    assert cell(snapshot, "GPU5", "mlx5_0") == "PHB"
    assert snapshot["nics"] == [{"name": "mlx5_0", "device": "mlx5_0"}]
    # this driver printed a CPU Affinity column only
    assert snapshot["affinity"][4] == {
        "gpu": "GPU4",
        "cpu": "14-27",
        "numa": None,
        "gpu_numa": None,
    }


def test_it_reads_the_pre_2017_legend_with_soc_cells():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_6xk80_soc_legend.txt"))

    assert cell(snapshot, "GPU0", "GPU2") == "SOC"
    assert cell(snapshot, "GPU2", "GPU4") == "PHB"
    assert snapshot["affinity"][2]["cpu"] == "8-15,24-31"


def test_it_reads_a_matrix_pasted_without_its_legend():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_4gpu_pxb_sys_tabs.txt"))

    assert cell(snapshot, "GPU0", "GPU1") == "PXB"
    assert cell(snapshot, "GPU2", "GPU3") == "PIX"
    assert snapshot["affinity"][3] == {
        "gpu": "GPU3",
        "cpu": "28-55,84-111",
        "numa": "1",
        "gpu_numa": None,
    }


def test_it_reads_a_one_gpu_host():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_1xh100_pcie_1nic.txt"))

    assert snapshot["links"] == {
        "labels": ["GPU0", "NIC0"],
        "matrix": [["X", "PHB"], ["PHB", "X"]],
    }
    assert len(snapshot["gpus"]) == 1
    assert snapshot["affinity"] == [{"gpu": "GPU0", "cpu": "0-251", "numa": "0", "gpu_numa": "N/A"}]


def test_it_reads_double_tabs_between_affinity_columns():
    snapshot = parse_nvidia_smi_topo(fixture("topo_m_2x5090_phb_tabs.txt"))

    assert snapshot["affinity"][1] == {"gpu": "GPU1", "cpu": "0-63", "numa": "0", "gpu_numa": "N/A"}


def test_it_reads_p2p_matrices_per_kind():
    snapshot = parse_nvidia_smi_topo(
        fixture("topo_m_2x5090_phb_tabs.txt"),
        {"read": fixture("p2p_2x5090_gns.txt"), "write": fixture("p2p_2x3090_ok.txt")},
    )

    assert snapshot["p2p"]["read"] == {
        "labels": ["GPU0", "GPU1"],
        "matrix": [["X", "GNS"], ["GNS", "X"]],
    }
    assert snapshot["p2p"]["write"]["matrix"] == [["X", "OK"], ["OK", "X"]]
    assert snapshot["p2p"]["nvlink"] is None and snapshot["p2p"]["atomics"] is None


def test_it_reads_real_p2p_output_of_a_chipset_without_p2p():
    snapshot = parse_nvidia_smi_topo(
        fixture("topo_m_2x5090_phb_tabs.txt"), {"read": L4_CNS, "write": L4_CNS_LEGEND}
    )

    assert snapshot["p2p"]["read"]["matrix"] == [["X", "CNS"], ["CNS", "X"]]
    assert snapshot["p2p"]["write"]["matrix"] == [["X", "CNS"], ["CNS", "X"]]


def test_it_reads_every_code_of_both_legends():
    links = ["X", "SYS", "NODE", "PHB", "PXB", "PIX", "NV12"]
    statuses = ["X", "OK", "CNS", "GNS", "TNS", "NS", "U"]
    header = "\t" + "\t".join(f"GPU{i}" for i in range(7)) + "\n"

    def square(codes):
        # row i holds code i in every column but its own, where X is
        rows = [
            f"GPU{i}\t" + "\t".join("X" if i == j else codes[max(i, j)] for j in range(7))
            for i in range(7)
        ]
        return header + "\n".join(rows) + "\n"

    snapshot = parse_nvidia_smi_topo(square(links), {"atomics": square(statuses)})

    assert {c for row in snapshot["links"]["matrix"] for c in row} == set(links)
    assert {c for row in snapshot["p2p"]["atomics"]["matrix"] for c in row} == {
        *statuses[:-1],
        "unknown",
    }


def test_it_records_an_unknown_p2p_status_as_unknown():
    text = " \tGPU0\tGPU1\t\n GPU0\tX\tU\t\n GPU1\tNS\tX\t\n"

    snapshot = parse_nvidia_smi_topo(fixture("topo_m_2x5090_phb_tabs.txt"), {"atomics": text})

    assert snapshot["p2p"]["atomics"]["matrix"] == [["X", "unknown"], ["NS", "X"]]


def test_it_strips_the_underline_nvidia_smi_writes_to_a_terminal():
    text = fixture("topo_m_4gpu_pcie_phb.txt").replace("GPU0", "\x1b[4mGPU0", 1)
    text = text.replace("GPU NUMA ID", "GPU NUMA ID\x1b[0m", 1)

    snapshot = parse_nvidia_smi_topo(text)

    assert snapshot["links"]["labels"] == ["GPU0", "GPU1", "GPU2", "GPU3"]


def test_it_reads_the_underlined_output_captured_on_an_h200():
    snapshot = parse_nvidia_smi_topo(
        fixture("topo_m_1xh200_firecracker_ansi.txt"),
        {"nvlink": fixture("p2p_1xh200_nvlink_ansi.txt")},
    )

    assert snapshot["links"] == {"labels": ["GPU0"], "matrix": [["X"]]}
    assert snapshot["affinity"] == [{"gpu": "GPU0", "cpu": "0-15", "numa": "0", "gpu_numa": "N/A"}]
    assert snapshot["p2p"]["nvlink"] == {"labels": ["GPU0"], "matrix": [["X"]]}


def test_it_accepts_windows_line_ends_and_an_echoed_command():
    text = "$ nvidia-smi topo -m\r\n" + fixture("topo_m_4gpu_pcie_phb.txt").replace("\n", "\r\n")

    snapshot = parse_nvidia_smi_topo(text)

    assert cell(snapshot, "GPU3", "GPU0") == "PHB"


def test_it_accepts_a_link_type_its_legend_defines():
    text = (
        "        GPU0    GPU1    CPU Affinity\n"
        "GPU0     X      C2C     0-71\n"
        "GPU1    C2C      X      0-71\n"
        "\n"
        "Legend:\n"
        "\n"
        "  X    = Self\n"
        "  C2C  = Connection over a chip-to-chip link\n"
    )

    assert cell(parse_nvidia_smi_topo(text), "GPU0", "GPU1") == "C2C"


def parse_error(text, p2p=None):
    with pytest.raises(TopologyParseError) as caught:
        parse_nvidia_smi_topo(text, p2p)
    return caught.value


def test_it_names_the_line_of_a_row_with_missing_cells():
    lines = fixture("topo_m_8xh100_nv18_8nics.txt").splitlines(keepends=True)
    lines[4] = "GPU3    NV18    NV18    NV18     X\n"

    error = parse_error("".join(lines))

    assert error.line_number == 5
    assert "GPU3 row has 4 cells, the header names 16 devices" in str(error)
    assert str(error).startswith("topology matrix, line 5: ")


def test_it_keeps_a_link_type_its_legend_lacks_verbatim():
    text = fixture("topo_m_4gpu_pcie_phb.txt").replace(
        "GPU2    PHB     PHB      X      PHB", "GPU2    PHB     PHB      X      QPI", 1
    )

    assert cell(parse_nvidia_smi_topo(text), "GPU2", "GPU3") == "QPI"


def test_it_names_a_cell_that_is_no_link_type():
    text = fixture("topo_m_4gpu_pcie_phb.txt").replace(
        "GPU2    PHB     PHB      X      PHB", "GPU2    PHB     PHB      X      0-15", 1
    )

    error = parse_error(text)

    assert error.line_number == 4
    assert "'0-15' in GPU2 row, column GPU3 is no link type" in str(error)


@pytest.mark.parametrize("name", ["p2p_2x5090_gns.txt", "p2p_2x3090_ok.txt", "L4_CNS"])
def test_it_rejects_p2p_output_sent_as_the_link_matrix(name):
    text = L4_CNS if name == "L4_CNS" else fixture(name)

    error = parse_error(text)

    assert error.source == "topology matrix"
    assert "this is `nvidia-smi topo -p2p` output (P2P statuses such as" in str(error)
    assert "send it as a P2P matrix" in str(error)


def test_it_rejects_link_matrix_output_sent_as_p2p():
    matrix = "        GPU0    GPU1\nGPU0     X      PHB\nGPU1    PHB      X\n"

    error = parse_error(fixture("topo_m_2x5090_phb_tabs.txt"), {"read": matrix})

    assert error.source == "p2p read"
    assert "this is `nvidia-smi topo -m` output (link types such as PHB)" in str(error)


def test_it_names_the_line_where_the_matrix_stops_short():
    text = "".join(fixture("topo_m_4gpu_pcie_phb.txt").splitlines(keepends=True)[:3])

    error = parse_error(text)

    assert error.line_number == 4
    assert "rows for 2 of 4 devices; missing GPU2, GPU3" in str(error)


def test_it_rejects_text_that_is_not_a_topo_matrix():
    error = parse_error("Sat Nov 29 12:00:00 2025\n+-----------------------+\n")

    assert error.line_number == 1
    assert "expected the header row" in str(error)


def test_it_rejects_empty_text():
    assert parse_error("\n\n").line_number == 1


@pytest.mark.parametrize(
    ("row", "written", "line_number", "said"),
    [
        # cells shifted
        (
            "GPU1    PHB      X      PHB     PHB     0-15",
            "GPU1     X      PHB     PHB     PHB     0-15",
            3,
            "GPU1 row has 'PHB' where it meets its own column",
        ),
        # a GPU row missing an affinity value
        (
            "GPU2    PHB     PHB      X      PHB     0-15    0               N/A",
            "GPU2    PHB     PHB      X      PHB     0-15    0",
            4,
            "GPU2 row has 2 values after the matrix, the header names 3",
        ),
    ],
)
def test_it_names_a_malformed_row(row, written, line_number, said):
    text = fixture("topo_m_4gpu_pcie_phb.txt").replace(row, written, 1)

    error = parse_error(text)

    assert error.line_number == line_number
    assert said in str(error)


def test_it_names_a_row_label_the_header_lacks():
    text = fixture("topo_m_4gpu_pcie_phb.txt").replace("GPU3    PHB", "GPU9    PHB", 1)

    assert parse_error(text).line_number == 5


def test_it_names_stray_text_after_the_matrix():
    text = fixture("topo_m_1xh100_pcie_1nic.txt") + "\nulimit soft: 1048576\n"

    error = parse_error(text)

    assert "found 'ulimit soft: 1048576'" in str(error)
    assert error.line_number == len(text.splitlines())


def test_it_keeps_a_p2p_status_its_legend_lacks_verbatim():
    p2p = " \tGPU0\tGPU1\t\n GPU0\tX\tMAYBE\t\n GPU1\tOK\tX\t\n"

    snapshot = parse_nvidia_smi_topo(fixture("topo_m_2x5090_phb_tabs.txt"), {"nvlink": p2p})

    assert snapshot["p2p"]["nvlink"]["matrix"] == [["X", "MAYBE"], ["OK", "X"]]


def test_it_names_the_p2p_text_and_line_at_fault():
    p2p = " \tGPU0\tGPU1\t\n GPU0\tX\t1.5\t\n GPU1\tOK\tX\t\n"

    error = parse_error(fixture("topo_m_2x5090_phb_tabs.txt"), {"nvlink": p2p})

    assert error.source == "p2p nvlink"
    assert str(error) == "p2p nvlink, line 2: '1.5' in GPU0 row, column GPU1 is no P2P status"


def test_it_rejects_p2p_text_from_another_host():
    p2p = " \tGPU0\tGPU1\tGPU2\t\n GPU0\tX\tOK\tOK\t\n GPU1\tOK\tX\tOK\t\n GPU2\tOK\tOK\tX\t\n"

    error = parse_error(fixture("topo_m_2x5090_phb_tabs.txt"), {"read": p2p})

    assert error.line_number == 1
    assert "differ from the topology matrix's" in str(error)


def test_it_refuses_an_unknown_p2p_kind():
    with pytest.raises(ValueError, match="unknown P2P kind 'prop'"):
        parse_nvidia_smi_topo(fixture("topo_m_2x5090_phb_tabs.txt"), {"prop": ""})


def run_cli(*args):
    return python_module("workers.topology", *args)


def test_the_parse_command_prints_the_snapshot_as_json():
    done = run_cli(
        "parse",
        str(FIXTURES / "topo_m_2x5090_phb_tabs.txt"),
        "--p2p-read",
        str(FIXTURES / "p2p_2x5090_gns.txt"),
    )

    assert done.returncode == 0, done.stderr
    snapshot = json.loads(done.stdout)
    assert snapshot["source"] == "nvidia-smi"
    assert snapshot["p2p"]["read"]["matrix"][0] == ["X", "GNS"]


def test_the_parse_command_names_the_file_and_line_of_an_error(tmp_path):
    broken = tmp_path / "topo.txt"
    broken.write_text("        GPU0    GPU1\nGPU0     X\n")

    done = run_cli("parse", str(broken))

    assert done.returncode == 2
    assert done.stderr.startswith(f"{broken}: topology matrix, line 2: GPU0 row has 1 cells")


def _cuts_inside_the_legends(name):
    """The fixture's text cut after each line from its "Legend:" on, short of its last entry."""
    lines = fixture(name).splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == "Legend:")
    last = max(i for i, line in enumerate(lines) if line.strip())
    return ["".join(lines[: end + 1]) for end in range(start, last)]


@pytest.mark.parametrize(
    "text",
    [
        *_cuts_inside_the_legends("topo_m_8xh100_nv18_8nics.txt"),
        *_cuts_inside_the_legends("topo_m_6xk80_soc_legend.txt"),
        *_cuts_inside_the_legends("topo_m_4gpu_pcie_phb.txt"),
    ],
)
def test_it_refuses_text_cut_off_inside_its_legend(text):
    error = parse_error(text)

    assert error.source == "topology matrix"
    assert "cut off" in error.message or "no NIC legend" in error.message
    assert "send the whole output of `nvidia-smi topo -m`" in error.message


def test_a_cut_nic_legend_names_the_nics_it_leaves_unnamed():
    text = fixture("topo_m_8xh100_nv18_8nics.txt").split("  NIC3: mlx5_3")[0]

    error = parse_error(text)

    assert error.message.startswith(
        "the NIC legend is cut off: nothing says which device NIC3…NIC7 are (NIC0: mlx5_0)"
    )


# An 8-GPU box pasted without its legend, as teams paste it: every GPU pair SYS, two NICs.
_EIGHT_SYS_TWO_NICS = "\n".join(
    [
        "\t"
        + "\t".join([f"GPU{i}" for i in range(8)] + ["NIC0", "NIC1"])
        + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID",
        *(
            f"GPU{i}\t"
            + "\t".join(" X " if j == i else "SYS" for j in range(8))
            + ("\tPIX\tSYS" if i < 4 else "\tSYS\tPIX")
            + ("\t0-31\t0\t\tN/A" if i < 4 else "\t32-63\t1\t\tN/A")
            for i in range(8)
        ),
        "NIC0\t" + "\t".join(["PIX"] * 4 + ["SYS"] * 4) + "\t X \tSYS",
        "NIC1\t" + "\t".join(["SYS"] * 4 + ["PIX"] * 4) + "\tSYS\t X ",
        "",
    ]
)


def test_a_paste_without_any_legend_is_read_with_its_nics_names_unknown():
    snapshot = parse_nvidia_smi_topo(_EIGHT_SYS_TWO_NICS)

    assert snapshot["links"]["labels"][-2:] == ["NIC0", "NIC1"]
    assert snapshot["links"]["matrix"][0] == ["X"] + ["SYS"] * 7 + ["PIX", "SYS"]
    assert snapshot["affinity"][5] == {
        "gpu": "GPU5",
        "cpu": "32-63",
        "numa": "1",
        "gpu_numa": "N/A",
    }
    assert snapshot["nics"] == [
        {"name": "NIC0", "device": None, "note": "name unknown: the paste has no legend"},
        {"name": "NIC1", "device": None, "note": "name unknown: the paste has no legend"},
    ]


def test_the_8_nic_file_pasted_without_its_legends_is_read_and_a_cut_before_its_nic_legend_is_not():
    whole = fixture("topo_m_8xh100_nv18_8nics.txt")

    snapshot = parse_nvidia_smi_topo(whole.split("Legend:")[0])

    assert [nic["name"] for nic in snapshot["nics"]] == [f"NIC{i}" for i in range(8)]
    assert {nic["device"] for nic in snapshot["nics"]} == {None}
    assert (
        snapshot["affinity"][4]["cpu"] == "48-95,144-191" and snapshot["affinity"][4]["numa"] == "1"
    )
    # the legend there, the NIC legend not: nvidia-smi prints it, so the text was cut
    assert parse_error(whole.split("NIC Legend:")[0]).message.startswith(
        "the NIC legend is cut off: nothing says which device NIC0…NIC7 are"
    )
    # a paste without its legend whose header names the devices themselves names them
    named = parse_nvidia_smi_topo(fixture("topo_m_8gpu_pcie_mlx5_tabs.txt"))
    assert named["nics"] == [{"name": "mlx5_0", "device": "mlx5_0"}]
