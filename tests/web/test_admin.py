import html
import json
import re

import pytest
from django.contrib.auth.models import User

from moeops.fleet import services as fleet_services
from moeops.fleet.models import ModelSpec
from moeops.insights.models import Note
from moeops.insights.services import finding_create, plan_item_add
from moeops.kernels.models import KernelConfig
from tests import fakes
from tests import page_base as pb
from tests.fakes import KERNEL_ENTRY

pytestmark = pytest.mark.django_db
FIXTURES = fakes.FIXTURES / "hf_configs"


@pytest.fixture
def admin(client):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def _errors(response):
    """The texts of the form's error lists, unescaped."""
    page = html.unescape(response.content.decode())
    return re.findall(r'<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', page, re.S)


def _kernel_config_form(entries, **fields):
    """The admin's kernel-config form: an H200 bf16 config of E=256, N=256, made by hand."""
    return {
        "device_name": "NVIDIA H200",
        "E": "256",
        "N": "256",
        "dtype": "bf16",
        "block_shape": "null",
        "triton_version": "3.7.1",
        "entries": json.dumps(entries),
        "source": "manual",
        **fields,
    }


def _post_kernel_config(client, entries, **fields):
    return client.post("/admin/kernels/kernelconfig/add/", _kernel_config_form(entries, **fields))


def test_it_bounds_a_kernel_configs_shape_as_the_api_does(admin):
    response = _post_kernel_config(
        admin, {"1": KERNEL_ENTRY}, E="99999999999", block_shape="[0, 0]"
    )
    assert response.status_code == 200
    errors = " ".join(_errors(response))
    assert "E must be an integer from 1 to 16,384, got 99999999999" in errors
    assert "block_shape must be [block_n, block_k], each from 1 to 131,072" in errors
    assert not KernelConfig.objects.exists()


def test_it_saves_a_valid_kernel_config_as_version_1(admin):
    response = _post_kernel_config(admin, {"1": KERNEL_ENTRY, "64": KERNEL_ENTRY})
    assert response.status_code == 302, response.content.decode()[:2000]
    config = KernelConfig.objects.get()
    assert config.version == 1
    assert sorted(config.entries) == ["1", "64"]
    _post_kernel_config(admin, {"1": KERNEL_ENTRY})
    assert sorted(KernelConfig.objects.values_list("version", flat=True)) == [1, 2]


def test_an_edit_in_the_admin_is_the_next_version_and_the_stored_one_stays(admin):
    _post_kernel_config(admin, {"1": KERNEL_ENTRY})
    first = KernelConfig.objects.get()
    faster = {**KERNEL_ENTRY, "num_stages": 4}
    form = _kernel_config_form({"1": faster})

    response = admin.post(f"/admin/kernels/kernelconfig/{first.pk}/change/", form)

    assert response.status_code == 302
    first.refresh_from_db()
    assert first.version == 1 and first.entries == {"1": KERNEL_ENTRY}
    second = KernelConfig.objects.get(version=2)
    assert second.entries == {"1": faster}

    # the same entries with another provenance are still the next version, not nothing
    form = {**form, "provenance": "re-tuned on the lent H200"}
    admin.post(f"/admin/kernels/kernelconfig/{second.pk}/change/", form)
    third = KernelConfig.objects.get(version=3)
    assert (third.entries, third.provenance) == ({"1": faster}, "re-tuned on the lent H200")


def test_entries_edited_in_the_admin_are_no_longer_said_tuned_or_timed_in_a_kernel(admin):
    _post_kernel_config(
        admin,
        {"1": KERNEL_ENTRY},
        source="tuned",
        provenance="tuned by moeops on the lent H200",
        kernel_engine="vllm",
        kernel_version="0.33.0",
        kernel_source_sha256="ab" * 32,
    )
    tuned = KernelConfig.objects.get()
    assert tuned.timed_in() == ["vLLM 0.33.0's own kernel"]
    form = _kernel_config_form(
        {"1": {**KERNEL_ENTRY, "num_stages": 4}},
        source="tuned",
        provenance="tuned by moeops on the lent H200",
        kernel_engine="vllm",
        kernel_version="0.33.0",
        kernel_source_sha256="ab" * 32,
    )

    admin.post(f"/admin/kernels/kernelconfig/{tuned.pk}/change/", form)

    edited = KernelConfig.objects.get(version=2)
    assert edited.get_source_display() == "Manual"
    assert edited.timed_in() == [] and edited.kernel_source_sha256 == ""
    assert edited.provenance == "v1's entries edited in the admin by root"
    page = admin.get(f"/kernels/{edited.pk}/").content.decode()
    assert "<dt>Source</dt><dd>Manual</dd>" in page
    assert re.search(r"<dt>Timed in</dt><dd><span class=\"muted\">no kernel recorded", page)
    # the version it replaced keeps what it was
    tuned.refresh_from_db()
    assert tuned.source == "tuned" and tuned.kernel_version == "0.33.0"


@pytest.mark.parametrize(
    "entries, message",
    [
        ({"0": KERNEL_ENTRY}, 'batch size "0": not a positive integer'),
        ({"-4": KERNEL_ENTRY}, 'batch size "-4": not a positive integer'),
        ({"abc": KERNEL_ENTRY}, 'batch size "abc": not a positive integer'),
        (
            {"64": {**KERNEL_ENTRY, "BLOCK_SIZE_M": 48}},
            "batch size 64: BLOCK_SIZE_M must be a power",
        ),
        (
            {"64": {**KERNEL_ENTRY, "BLOCK_SIZE_N": 48}},
            "batch size 64: BLOCK_SIZE_N must be a power",
        ),
        (
            {"64": {**KERNEL_ENTRY, "BLOCK_SIZE_K": 100}},
            "batch size 64: BLOCK_SIZE_K must be a power",
        ),
        (
            {"64": {**KERNEL_ENTRY, "GROUP_SIZE_M": 0}},
            "batch size 64: GROUP_SIZE_M must be at least",
        ),
        ({"64": {**KERNEL_ENTRY, "num_warps": 3}}, "batch size 64: num_warps must be one of"),
        ({"64": {**KERNEL_ENTRY, "num_stages": 9}}, "batch size 64: num_stages must be between"),
        ({"64": {**KERNEL_ENTRY, "num_stages": 0}}, "batch size 64: num_stages must be between"),
    ],
)
def test_it_rejects_bad_kernel_config_entries_naming_them(admin, entries, message):
    response = _post_kernel_config(admin, entries)
    assert response.status_code == 200
    errors = _errors(response)
    assert any(message in e for e in errors), errors
    assert not KernelConfig.objects.exists()


def test_it_fills_the_moe_shape_from_an_uploaded_config(admin):
    with open(FIXTURES / "kimi-k2-instruct_config.json", "rb") as upload:
        response = admin.post(
            "/admin/fleet/modelspec/add/",
            {"name": "Kimi K2", "config_json": "", "config_file": upload},
        )
    assert response.status_code == 302, response.content.decode()[:2000]
    model = ModelSpec.objects.get()
    assert (model.num_experts, model.topk, model.hidden_size) == (384, 8, 7168)
    assert model.quantization == "fp8"
    assert model.block_shape == [128, 128]


def test_it_fills_the_moe_shape_from_pasted_json(admin):
    config = (FIXTURES / "mixtral-8x7b-v0.1_config.json").read_text()
    response = admin.post("/admin/fleet/modelspec/add/", {"name": "Mixtral", "config_json": config})
    assert response.status_code == 302
    assert ModelSpec.objects.get().num_experts == 8


def test_it_names_what_is_missing_in_a_dense_config(admin):
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}
    response = admin.post(
        "/admin/fleet/modelspec/add/", {"name": "Llama", "config_json": json.dumps(config)}
    )
    assert response.status_code == 200
    errors = _errors(response)
    assert any("config.json:" in e and "expert" in e.lower() for e in errors), errors
    assert not ModelSpec.objects.exists()


def test_it_rejects_an_upload_that_is_not_json(admin, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_bytes(b"\xff\xfe not json")
    with open(bad, "rb") as upload:
        response = admin.post(
            "/admin/fleet/modelspec/add/", {"name": "X", "config_json": "", "config_file": upload}
        )
    assert response.status_code == 200
    assert "not UTF-8" in response.content.decode()
    assert not ModelSpec.objects.exists()


def test_health_checks_and_gpu_readings_are_listed_but_not_edited(admin):
    deployment = pb.deployment()
    check, _ = fleet_services.health_check_record(
        deployment=deployment, status="degraded", trigger="periodic", detail="wrong model"
    )
    reading, _ = fleet_services.gpu_reading_record(
        host=deployment.host, status="unavailable", detail="NVML did not initialise"
    )
    checks = admin.get("/admin/fleet/healthcheck/").content.decode()
    assert "GLM-5 on h200" in checks and "Periodic" in checks
    readings = admin.get("/admin/fleet/gpureading/").content.decode()
    assert "NVML did not initialise" in readings
    assert admin.get("/admin/fleet/healthcheck/add/").status_code == 403
    shown = admin.get(f"/admin/fleet/healthcheck/{check.pk}/change/")
    assert shown.status_code == 200 and 'name="status"' not in shown.content.decode()
    assert admin.get(f"/admin/fleet/gpureading/{reading.pk}/change/").status_code == 200


def test_it_rejects_run_parameters_the_schema_refuses(admin):
    run = pb.run(pb.deployment(), "sweep", parameters={"levels": [32]})
    fields = {
        "deployment": run.deployment_id,
        "label": run.label,
        "status": run.status,
        "source": run.source,
        "progress": "{}",
        "snapshot": "{}",
        "telemetry_status": run.telemetry_status,
        "levels-TOTAL_FORMS": "0",
        "levels-INITIAL_FORMS": "0",
    }
    url = f"/admin/runs/sweeprun/{run.pk}/change/"
    response = admin.post(url, {**fields, "parameters": json.dumps({"levels": 5})})
    assert response.status_code == 200
    assert any(e.startswith("<li>parameters.levels: ") for e in _errors(response)), _errors(
        response
    )
    run.refresh_from_db()
    assert run.parameters == {"levels": [32]}
    response = admin.post(url, {**fields, "parameters": json.dumps({"levels": [32, 64]})})
    assert response.status_code == 302, _errors(response)


# -- topology snapshots --------------------------------------------------------------------------

TOPOLOGY = fakes.FIXTURES / "topology"


def _post_topology(client, host, matrix_text, **fields):
    return client.post(
        "/admin/fleet/topologysnapshot/add/",
        {"host": host.pk, "matrix_text": matrix_text, "p2p_kind": "read", "p2p_text": "",
         "provenance": "pasted by hand", **fields},
    )  # fmt: skip


def test_a_snapshot_added_in_the_admin_is_parsed_as_the_api_parses_it(admin):
    host = pb.host("h100-x8")
    probed = pb.snapshot(host, "container", "lxc")
    text = (TOPOLOGY / "topo_m_2x5090_phb_tabs.txt").read_text()
    p2p = (TOPOLOGY / "p2p_2x5090_gns.txt").read_text()

    answer = _post_topology(admin, host, text, p2p_text=p2p)

    assert answer.status_code == 302
    current = host.current_topology()
    assert current != probed and current.source == "nvidia-smi"
    assert current.links["matrix"][0][1] == "PHB" and current.p2p["read"]["matrix"][0][1] == "GNS"
    assert current.raw_text == text and current.provenance == "pasted by hand"


def test_a_topology_cut_off_in_its_legend_is_refused_in_the_admin(admin):
    host = pb.host("h100-x8")
    probed = pb.snapshot(host, "container", "lxc")
    text = (TOPOLOGY / "topo_m_8xh100_nv18_8nics.txt").read_text().split("  NIC2: mlx5_2")[0]

    answer = _post_topology(admin, host, text)

    assert answer.status_code == 200
    [error] = _errors(answer)
    assert "the NIC legend is cut off: nothing says which device NIC2…NIC7 are" in error
    assert host.current_topology() == probed


def test_a_stored_snapshot_is_not_edited_in_the_admin(admin):
    snapshot = pb.snapshot(pb.host("h100-x8"), "container", "lxc")

    page = admin.get(f"/admin/fleet/topologysnapshot/{snapshot.pk}/change/")
    admin.post(f"/admin/fleet/topologysnapshot/{snapshot.pk}/change/", {"virtualization": "vm"})

    assert page.status_code == 200 and "Save" not in page.content.decode()
    snapshot.refresh_from_db()
    assert snapshot.virtualization == "container"


def test_it_refuses_a_note_under_the_slug_of_the_create_page(admin):
    response = admin.post(
        "/admin/insights/note/add/", {"title": "New", "slug": "new", "body": "", "provenance": ""}
    )
    assert response.status_code == 200
    assert _errors(response) == ["<li>“new” is reserved; pick another slug.</li>"]
    assert not Note.objects.exists()


def test_it_saves_a_note_from_the_admin(admin):
    fields = {"title": "SM120", "slug": "sm120", "body": "off", "provenance": "admin"}
    response = admin.post("/admin/insights/note/add/", fields)
    assert response.status_code == 302
    note = Note.objects.get()
    assert (note.slug, note.body, note.provenance) == ("sm120", "off", "admin")
    admin.post(f"/admin/insights/note/{note.pk}/change/", {**fields, "body": "on"})
    note.refresh_from_db()
    assert note.body == "on"


def _plan(deployment):
    return list(deployment.plan_items.order_by("position").values_list("title", "position"))


def test_a_plan_item_added_or_moved_in_the_admin_keeps_the_plan_in_order(admin):
    deployment = pb.deployment()
    for title in ("first", "second"):
        plan_item_add(deployment=deployment, title=title)
    fields = {"deployment": deployment.pk, "title": "third", "status": "pending"}
    fields |= {"position": 0, "source": "human", "provenance": ""}
    assert admin.post("/admin/insights/planitem/add/", fields).status_code == 302
    assert _plan(deployment) == [("first", 0), ("second", 1), ("third", 2)]
    third = deployment.plan_items.get(title="third")
    admin.post(f"/admin/insights/planitem/{third.pk}/change/", {**fields, "position": 0})
    assert _plan(deployment) == [("third", 0), ("first", 1), ("second", 2)]
    admin.post(f"/admin/insights/planitem/{third.pk}/delete/", {"post": "yes"})
    assert [title for title, _ in _plan(deployment)] == ["first", "second"]


def test_a_finding_state_set_in_the_admin_is_on_record(admin):
    finding = finding_create(deployment=pb.deployment(), kind="other", title="x")
    fields = {"deployment": finding.deployment_id, "kind": "other", "key": "", "title": "x"}
    fields |= {"severity": "warning", "text": "", "evidence": "{}", "source": "human"}
    fields |= {"state": "dismissed", "provenance": ""}
    response = admin.post(f"/admin/insights/finding/{finding.pk}/change/", fields)
    assert response.status_code == 302, _errors(response)
    finding.refresh_from_db()
    assert finding.state == "dismissed"
    assert finding.state_changed_by.username == "root"
    assert finding.state_changed_at is not None


def test_the_admin_names_its_models_in_plurals_people_write(admin):
    page = admin.get("/admin/").content.decode()

    assert ">Watches</a>" in page
    assert "Watchs" not in page and "atchs" not in page
