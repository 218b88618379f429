import datetime as dt
import json
import time

import pytest
from django.utils import timezone
from django.utils.html import escape

from domain.topology import parse_nvidia_smi_topo
from moeops.examples import load_example_data
from moeops.fleet import services as fleet_services
from moeops.fleet.models import Host
from tests import fakes
from tests import page_base as pb

pytestmark = pytest.mark.django_db
FIXTURES = fakes.FIXTURES / "topology"
TOPO_8XH100 = (FIXTURES / "topo_m_8xh100_nv18_8nics.txt").read_text()


@pytest.fixture
def host(client):
    pb.sign_in(client)
    row = pb.host("h100-x8")
    parsed = parse_nvidia_smi_topo(TOPO_8XH100)
    earlier = timezone.now() - dt.timedelta(days=2)
    old = pb.snapshot(
        row, "vm", "kvm", captured_at=earlier, links=parsed["links"], driver_version="570.1"
    )
    links = parsed["links"]
    changed = {"labels": links["labels"], "matrix": [list(r) for r in links["matrix"]]}
    changed["matrix"][0][1] = changed["matrix"][1][0] = "SYS"
    p2p = {"read": {"labels": ["GPU0", "GPU1"], "matrix": [["X", "OK"], ["CNS", "X"]]}}
    new = pb.snapshot(row, "container", "lxc", links=changed, p2p=p2p, driver_version="580.2")
    return row, old, new


def test_the_link_matrix_is_a_heatmap_of_nvidia_smi_codes(client, host):
    row, _, new = host
    html = client.get(f"/hosts/{row.name}/").content.decode()
    trace = pb.figure(html, "topo-links-data")["data"][0]
    assert trace["type"] == "heatmap"
    assert trace["y"][:2] == ["GPU0", "GPU1"]
    assert trace["text"][0][:3] == ["X", "SYS", "NV18"]
    # NVLink ranks best, SYS worst, the diagonal has no color
    assert trace["z"][0][:3] == [None, 0, 6]
    p2p = pb.figure(html, "topo-p2p-read-data")["data"][0]
    assert p2p["z"] == [[None, 1], [0, None]]


def test_history_says_what_changed_between_snapshots(client, host):
    row, _, _ = host
    html = client.get(f"/hosts/{row.name}/").content.decode()
    assert "virtualization: vm (kvm) → container (lxc)" in html
    assert "driver: 570.1 → 580.2" in html
    assert "link GPU0↔GPU1: NV18 → SYS" in html
    assert "First snapshot of this host." in html


def test_sweeps_are_listed_under_the_snapshot_they_ran_on(client, host):
    row, old, new = host
    deployment = pb.deployment(host_row=row)
    pb.run(deployment, "under kvm", topology_snapshot=old)
    pb.run(deployment, "under lxc", topology_snapshot=new)
    html = client.get(f"/hosts/{row.name}/").content.decode()
    history = html.split("Snapshot history")[1]
    first, second = history.split('class="snapshot card"')[1:3]
    assert "under lxc" in first and "under kvm" not in first
    assert "under kvm" in second


def test_the_hosts_list_shows_the_current_topology(client, host):
    html = client.get("/hosts/").content.decode()
    assert "Container (lxc)" in html and "host.h100-x8" in html


def test_the_write_up_host_has_gpus_and_no_invented_matrices(client):
    pb.sign_in(client)
    load_example_data()
    html = client.get("/hosts/rtx-pro-6000-x8/").content.decode()
    assert html.count("NVIDIA RTX PRO 6000 Blackwell") >= 8
    assert "No link or P2P matrix in the current snapshot" in html
    assert "virtualization: vm (kvm) → container (lxc)" in html


def test_gpu_table_takes_the_probe_first_and_the_hosts_rows_for_the_rest(client, host):
    row, _, new = host
    new.gpus = [
        {
            "index": 0,
            "name": None,
            "sm": "SM90",
            "pci_bus_id": "00000000:18:00.0",
            "pcie": {"gen_max": 5, "width_max": 16, "gen_current": 1, "width_current": 16},
            "nvlinks_active": 18,
        }
    ]
    new.save()
    html = client.get(f"/hosts/{row.name}/").content.decode()
    gpu0 = html.split("<tbody>")[1].split("</tr>")[0]
    assert "NVIDIA H200" in gpu0  # the probe could not read the name; the host's row knows it
    assert "00000000:18:00.0" in gpu0 and "Gen5 x16 / Gen1 x16" in gpu0 and ">18<" in gpu0
    assert html.count("NVIDIA H200") >= 8


def test_a_worker_cut_off_from_its_broker_is_said_so_even_after_it_went_quiet(client, host):
    row, _, _ = host
    error = "Error 111 connecting to 10.0.0.5:6379. Connection refused."
    broker = {"reachable": False, "url": "redis://10.0.0.5:6379", "error": error}
    fleet_services.host_heartbeat_record(
        host=row, status={"broker": {**broker, "since": time.time() - 185}}
    )

    why = f"redis://10.0.0.5:6379 ({error[:-1]}, for 3\xa0minutes)"
    absence = row.worker_absence()
    assert absence == (
        f"The worker of host h100-x8 is running but cannot reach its broker {why}; "
        "what is sent to it waits until it can."
    )
    assert escape(absence) in client.get("/hosts/h100-x8/").content.decode()

    # its heartbeats stop (it gave up retrying): its last word stays with the host
    Host.objects.filter(pk=row.pk).update(worker_seen_at=timezone.now() - dt.timedelta(hours=1))
    row.refresh_from_db()
    assert row.worker_absence() == (
        "The worker of host h100-x8 was last seen 1\xa0hour ago; what is sent to it waits until "
        f"it is back. Its last heartbeat said it could not reach its broker {why}."
    )

    # back in reach, or a worker that does not say: nothing is wrong
    for said in ({"broker": {**broker, "reachable": True}}, {}):
        fleet_services.host_heartbeat_record(host=row, status=said)
        assert row.worker_absence() == ""
        html = client.get("/hosts/h100-x8/").content.decode()
        assert 'id="worker-absent"' not in html and "worker seen 0\xa0minutes ago" in html
    # a start no date can hold is left out, not a 500
    fleet_services.host_heartbeat_record(host=row, status={"broker": {**broker, "since": 1e300}})
    assert f"broker redis://10.0.0.5:6379 ({error[:-1]});" in row.worker_absence()


def test_the_hosts_list_shows_a_worker_cut_off_from_its_broker_as_absent(client, host):
    row, _, _ = host
    broker = {"reachable": False, "url": "redis://10.0.0.5:6379", "error": "Connection refused"}
    fleet_services.host_heartbeat_record(host=row, status={"broker": broker})

    html = client.get("/hosts/").content.decode()
    cell = html.split("<tbody>")[1].split("</tr>")[0].split("</td>")[3]
    assert f'title="{escape(row.worker_absence())}"' in cell
    assert "status-failed" in cell and "status-healthy" not in cell
    assert "0\xa0minutes ago" in cell and "broker out of reach" in cell

    fleet_services.host_heartbeat_record(host=row, status={"broker": {**broker, "reachable": True}})
    cell = client.get("/hosts/").content.decode().split("<tbody>")[1].split("</td>")[3]
    assert "status-healthy" in cell and "title=" not in cell and "broker" not in cell


def test_a_container_in_a_vm_shows_both_layers_and_what_the_vm_means_for_p2p(client):
    pb.sign_in(client)
    row = pb.host("local", gpus=1)
    probed = json.loads((FIXTURES / "probe_1xh200_firecracker.json").read_text())
    fleet_services.topology_record(host=row, snapshot=probed)

    html = client.get("/hosts/local/").content.decode()

    assert '<strong id="virtualization">Container (docker) in a VM (firecracker)</strong>' in html
    assert "The GPUs are passed through to a VM" in html
    assert "Container (docker) in a VM (firecracker)" in client.get("/hosts/").content.decode()


def test_a_vm_with_no_gpus_is_not_said_to_pass_gpus_through(client):
    pb.sign_in(client)
    row = pb.host("local", gpus=0)
    probed = json.loads((FIXTURES / "probe_1xh200_firecracker.json").read_text())
    no_gpus = {**probed, "gpus": [], "links": None, "p2p": None, "affinity": []}
    fleet_services.topology_record(host=row, snapshot=no_gpus)

    html = client.get("/hosts/local/").content.decode()

    assert '<strong id="virtualization">Container (docker) in a VM (firecracker)</strong>' in html
    assert "passed through to a VM" not in html


def test_a_snapshot_stored_with_one_virtualization_value_still_reads(client, host):
    row, old, _ = host
    old.delete()  # the current one: a container of one layer, stored before layers were kept

    html = client.get(f"/hosts/{row.name}/").content.decode()

    assert '<strong id="virtualization">Container (lxc)</strong>' in html
    assert "passed through to a VM" not in html


def _topo_pasted(client, cut_at=None):
    """8×H100 `nvidia-smi topo -m` text, cut off before `cut_at` where given, pasted on the page
    of host h100-x8 by a signed-in member: (the host, the answer)."""
    pb.sign_in(client)
    row = pb.host("h100-x8")
    text = TOPO_8XH100.split(cut_at)[0] if cut_at else TOPO_8XH100
    answer = client.post(
        "/hosts/h100-x8/topology/", {"matrix_text": text, "p2p_kind": "read", "p2p_text": ""}
    )
    return row, answer


def test_the_host_page_imports_pasted_topo_text_as_a_snapshot(client):
    row, answer = _topo_pasted(client)

    assert answer.status_code == 302 and answer["Location"] == "/hosts/h100-x8/#topology"
    current = row.current_topology()
    assert current.source == "nvidia-smi" and current.raw_text == TOPO_8XH100
    assert current.nics[7] == {"name": "NIC7", "device": "mlx5_7"}
    assert current.provenance == "pasted by alice"


def test_the_host_page_reads_topo_text_pasted_without_its_legend_and_says_why_nics_are_unnamed(
    client,
):
    row, answer = _topo_pasted(client, cut_at="Legend:")

    assert answer.status_code == 302
    current = row.current_topology()
    assert current.affinity[7]["cpu"] == "48-95,144-191"
    assert current.nics[0] == {
        "name": "NIC0",
        "device": None,
        "note": "name unknown: the paste has no legend",
    }
    html = client.get("/hosts/h100-x8/").content.decode()
    assert 'NIC7 <span class="muted small">(name unknown: the paste has no legend)</span>' in html


def test_the_host_page_refuses_topo_text_cut_off_in_its_legend_with_a_sentence(client):
    row, answer = _topo_pasted(client, cut_at="NIC Legend:")

    assert answer.status_code == 400
    html = answer.content.decode()
    assert escape("the NIC legend is cut off: nothing says which device NIC0…NIC7 are") in html
    assert "Traceback" not in html and "TopologyParseError" not in html
    assert not row.topology_snapshots.exists()


def test_the_host_page_names_the_p2p_text_at_fault(client):
    pb.sign_in(client)
    row = pb.host("rtx-5090-x2")
    text = (FIXTURES / "topo_m_2x5090_phb_tabs.txt").read_text()
    wrong = (FIXTURES / "topo_m_4gpu_pcie_phb.txt").read_text()

    answer = client.post(
        "/hosts/rtx-5090-x2/topology/",
        {"matrix_text": text, "p2p_kind": "write", "p2p_text": wrong},
    )

    assert answer.status_code == 400
    assert "p2p write" in answer.content.decode()
    assert not row.topology_snapshots.exists()
