import copy
import json

import pytest

from moeops.fleet.models import GPU, Deployment, Host, ModelSpec, SLOProfile, TopologySnapshot
from tests.api_base import GLM5_CONFIG, make_world
from tests.fakes import FIXTURES

TOPOLOGY = FIXTURES / "topology"


@pytest.fixture
def world(db):
    return make_world()


def _hf_config(name):
    return json.loads((FIXTURES / "hf_configs" / name).read_text())


def _probe():
    return json.loads((TOPOLOGY / "probe_1xh200_firecracker.json").read_text())


# --------------------------------------------------------------------------- models


def test_it_registers_a_model_and_answers_its_moe_shape(world):
    config = _hf_config("kimi-k2-instruct_config.json")
    response = world.owner.post("/api/v1/models", {"name": "Kimi-K2", "config": config})
    assert response.status_code == 201
    body = response.json()
    assert (body["num_experts"], body["topk"], body["hidden_size"]) == (384, 8, 7168)
    assert body["moe_intermediate_size"] == 2048
    assert body["block_shape"] == [128, 128]
    assert body["moe_shape"]["N"] == 2048
    assert body["config"] == config
    again = world.owner.post("/api/v1/models", {"name": "Kimi-K2", "config": config})
    assert again.status_code == 200
    assert ModelSpec.objects.filter(name="Kimi-K2").count() == 1


def test_it_refuses_the_same_name_with_another_config(world):
    response = world.owner.post(
        "/api/v1/models", {"name": "GLM-5", "config": _hf_config("qwen3-30b-a3b_config.json")}
    )
    assert response.status_code == 409
    assert "another config.json" in response.json()["detail"]


def test_it_names_the_missing_key_of_a_config(world):
    config = _hf_config("qwen3-30b-a3b_config.json")
    del config["num_experts_per_tok"]
    response = world.owner.post("/api/v1/models", {"name": "Qwen3", "config": config})
    assert response.status_code == 400
    assert response.json()["detail"].startswith("config: ")
    assert "num_experts_per_tok" in response.json()["detail"]
    assert not ModelSpec.objects.filter(name="Qwen3").exists()


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("key", "value"),
    [("num_hidden_layers", 2**31), ("num_hidden_layers", 10**6), ("hidden_size", 2**31)],
)
def test_it_rejects_a_model_size_no_gpu_could_hold(world, key, value):
    config = {**_hf_config("glm-5-fp8_config.json"), key: value}
    response = world.owner.post("/api/v1/models", {"name": "huge", "config": config})
    assert response.status_code == 400
    assert response.json()["detail"].startswith(f"config: {key} must be at most ")
    assert not ModelSpec.objects.filter(name="huge").exists()


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("architectures", [{"a": 1}], "config: architectures must be a list of class names"),
        ("architectures", ["X" * 201], "config: architectures[0] must be at most 200 characters"),
        ("model_type", 5, "config: model_type must be a string"),
        ("model_type", "x" * 101, "config: model_type must be at most 100 characters"),
        ("vocab_size", -5, "config: vocab_size must be an integer from 2 to"),
    ],
)
def test_it_stores_no_model_whose_config_a_row_cannot_hold(world, key, value, named):
    config = {**_hf_config("kimi-k2-instruct_config.json"), key: value}
    response = world.owner.post("/api/v1/models", {"name": "odd", "config": config})
    assert response.status_code == 400
    assert response.json()["detail"].startswith(named)
    assert ModelSpec.objects.count() == 1


@pytest.mark.parametrize("block", [[0, 0], "ab"])
def test_it_stores_no_model_whose_weight_block_size_is_no_block(world, block):
    config = _hf_config("kimi-k2-instruct_config.json")
    config["quantization_config"]["weight_block_size"] = block
    response = world.owner.post("/api/v1/models", {"name": "odd", "config": config})
    assert response.status_code == 400
    assert response.json()["detail"].startswith("config: weight_block_size must be two sizes")
    assert ModelSpec.objects.count() == 1


def test_it_reads_a_separate_quant_config(world):
    body = {
        "name": "GLM-5-NVFP4",
        "config": _hf_config("glm-5-fp8_config.json"),
        "quant_config": _hf_config("nvidia-glm-5-nvfp4_hf_quant_config.json"),
    }
    response = world.owner.post("/api/v1/models", body)
    assert response.status_code == 201
    # the config.json alone says fp8 with 128×128 blocks: the separate file must win
    assert (response.json()["quantization"], response.json()["block_shape"]) == ("nvfp4", None)
    stored = world.read_only.get("/api/v1/models/GLM-5-NVFP4").json()
    assert stored["quant_config"] == body["quant_config"]


def test_it_lists_models(world):
    page = world.read_only.get("/api/v1/models").json()
    assert page["count"] == 1 and page["items"][0]["name"] == "GLM-5"
    assert world.read_only.get(f"/api/v1/models/{world.model.pk}").json()["name"] == "GLM-5"
    assert world.read_only.get("/api/v1/models/nope").status_code == 404


def test_host_token_cannot_register_models(world):
    body = {"name": "x", "config": _hf_config("mixtral-8x7b-v0.1_config.json")}
    assert world.host_worker.post("/api/v1/models", body).status_code == 403


# --------------------------------------------------------------------------- hosts and GPUs


def test_it_registers_a_host_once(world):
    first = world.owner.post("/api/v1/hosts", {"name": "b200-1", "description": "8×B200"})
    again = world.owner.post("/api/v1/hosts", {"name": "b200-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["queue_name"] == "host.b200-1"
    assert world.owner.post("/api/v1/hosts", {"name": "has space"}).status_code == 422


def test_it_records_gpus_by_index(world):
    gpus = [
        {"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "power_limit_w": 700},
        {"index": 1, "name": "NVIDIA H200", "compute_capability": "9.0", "power_limit_w": 700},
    ]
    first = world.outsider.post("/api/v1/hosts/h200-lab/gpus", {"gpus": gpus})
    assert first.status_code == 201
    assert first.json()["created"] == 2
    assert [g["sm"] for g in first.json()["gpus"]] == ["SM90", "SM90"]
    gpus[1]["power_limit_w"] = 600
    second = world.outsider.post("/api/v1/hosts/h200-lab/gpus", {"gpus": gpus})
    assert second.status_code == 200
    assert (second.json()["created"], second.json()["updated"]) == (0, 1)
    assert GPU.objects.get(host__name="h200-lab", index=1).power_limit_w == 600
    listed = world.read_only.get("/api/v1/hosts/h200-lab/gpus").json()
    assert [g["index"] for g in listed] == [0, 1]


def test_it_refuses_gpus_of_another_host_and_duplicate_indexes(world):
    gpus = [{"index": 0, "name": "NVIDIA H200"}]
    assert world.host_worker.post("/api/v1/hosts/h200-lab/gpus", {"gpus": gpus}).status_code == 403
    twice = world.outsider.post("/api/v1/hosts/h200-lab/gpus", {"gpus": gpus + gpus})
    assert twice.status_code == 422
    assert "each index may appear once" in twice.json()["message"]
    assert not GPU.objects.filter(host__name="h200-lab").exists()


# --------------------------------------------------------------------------- topology


def test_it_stores_a_probe_snapshot_only_when_the_host_changed(world):
    path = "/api/v1/hosts/h200-lab/topology"
    first = world.outsider.post(path, {"snapshot": _probe(), "captured_at": 1.79e9})
    assert first.status_code == 201
    body = first.json()
    assert body["created"] is True and body["changes"] == []
    assert body["snapshot"]["virtualization"] == "container"
    assert body["snapshot"]["virtualization_technology"] == "docker"
    assert body["snapshot"]["driver_version"] == _probe()["driver_version"]
    same = world.outsider.post(path, {"snapshot": _probe()})
    assert same.status_code == 200
    assert same.json()["snapshot"]["id"] == body["snapshot"]["id"]
    changed = _probe()
    changed["driver_version"] = "590.10.01"
    changed["virtualization"] = {"kind": "vm", "technology": "kvm", "evidence": []}
    moved = world.outsider.post(path, {"snapshot": changed})
    assert moved.status_code == 201
    changes = moved.json()["changes"]
    assert "virtualization: container (docker) → vm (kvm)" in changes
    assert any(c.startswith("driver: ") and c.endswith("→ 590.10.01") for c in changes)
    assert TopologySnapshot.objects.filter(host__name="h200-lab").count() == 2
    history = world.read_only.get(path).json()
    assert history["count"] == 2
    assert history["items"][0]["driver_version"] == "590.10.01"


def test_the_4_gpu_probe_is_stored_with_its_pair_matrix_and_its_changes_from_one_gpu(world):
    """The real probes of the lent one-GPU and 4-GPU H200 machines, posted to one host."""
    path = "/api/v1/hosts/h200-lab/topology"
    assert world.outsider.post(path, {"snapshot": _probe()}).status_code == 201
    four = json.loads((TOPOLOGY / "probe_4xh200_nv18.json").read_text())

    response = world.outsider.post(path, {"snapshot": four})

    assert response.status_code == 201
    changes = response.json()["changes"]
    assert {f"GPU{i} added (NVIDIA H200)" for i in (1, 2, 3)} <= set(changes)
    assert "GPU0 active NVLinks: 0 → 18" in changes
    stored = TopologySnapshot.objects.filter(host__name="h200-lab").order_by("-pk").first()
    links, p2p = stored.links["matrix"], stored.p2p["read"]["matrix"]
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j]
    assert [links[i][j] for i, j in pairs] == ["NV18"] * 12
    assert [p2p[i][j] for i, j in pairs] == ["OK"] * 12


def test_it_parses_nvidia_smi_topo_text(world):
    matrix = (TOPOLOGY / "topo_m_2x5090_phb_tabs.txt").read_text()
    p2p = (TOPOLOGY / "p2p_2x5090_gns.txt").read_text()
    body = {"nvidia_smi_topo": matrix, "nvidia_smi_p2p": {"read": p2p}}
    response = world.host_worker.post("/api/v1/hosts/rtx-pro-6000/topology", body)
    assert response.status_code == 201
    snapshot = response.json()["snapshot"]
    assert snapshot["source"] == "nvidia-smi"
    assert snapshot["links"]["labels"] == ["GPU0", "GPU1"]
    assert snapshot["links"]["matrix"][0][1] == "PHB"
    assert snapshot["p2p"]["read"]["matrix"][0][1] == "GNS"
    assert TopologySnapshot.objects.get().raw_text == matrix


def test_it_rejects_p2p_text_sent_as_the_link_matrix(world):
    p2p = (TOPOLOGY / "p2p_2x5090_gns.txt").read_text()
    response = world.host_worker.post(
        "/api/v1/hosts/rtx-pro-6000/topology", {"nvidia_smi_topo": p2p}
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith(
        "nvidia_smi_topo: topology matrix, line 1: this is `nvidia-smi topo -p2p` output"
    )
    assert not TopologySnapshot.objects.exists()


def test_it_names_the_line_of_malformed_topo_text(world):
    body = {"nvidia_smi_topo": "\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU7\tPHB\t X \n"}
    response = world.host_worker.post("/api/v1/hosts/rtx-pro-6000/topology", body)
    assert response.status_code == 400
    assert response.json()["detail"].startswith("nvidia_smi_topo: ")
    assert "line 3" in response.json()["detail"]
    assert not TopologySnapshot.objects.exists()


def test_topo_text_cut_off_inside_its_legend_is_refused_not_stored_as_a_change(world):
    path = "/api/v1/hosts/rtx-pro-6000/topology"
    whole = (TOPOLOGY / "topo_m_8xh100_nv18_8nics.txt").read_text()
    assert world.host_worker.post(path, {"nvidia_smi_topo": whole}).status_code == 201
    cut = whole.split("  PIX  = ")[0]  # cut inside the link legend, NIC legend and all gone

    response = world.host_worker.post(path, {"nvidia_smi_topo": cut})

    assert response.status_code == 400
    assert response.json()["detail"].startswith(
        "nvidia_smi_topo: topology matrix, line 25: the legend is cut off: it lacks PIX, NV#"
    )
    assert TopologySnapshot.objects.count() == 1


def test_it_wants_exactly_one_kind_of_topology(world):
    path = "/api/v1/hosts/rtx-pro-6000/topology"
    neither = world.host_worker.post(path, {})
    both = world.host_worker.post(path, {"snapshot": _probe(), "nvidia_smi_topo": "x"})
    assert neither.status_code == both.status_code == 422
    assert "exactly one" in neither.json()["message"]


def test_it_checks_the_cells_of_a_probe_snapshot(world):
    snapshot = copy.deepcopy(_probe())
    snapshot["links"] = {"labels": ["GPU0"], "matrix": [[{"not": "a cell"}]]}
    response = world.outsider.post("/api/v1/hosts/h200-lab/topology", {"snapshot": snapshot})
    assert response.status_code == 422
    assert response.json()["message"].startswith("snapshot.links.matrix.0.0")


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        ("gpus", float("nan"), "snapshot.gpus.0: extra.deep: must not be NaN"),
        ("nics", float("inf"), "snapshot.nics.0: extra.deep: must not be NaN"),
        ("affinity", "a\x00b", "snapshot.affinity.0: extra.deep: must not contain"),
        ("pcie", "\ud800", "snapshot.gpus.0.pcie: extra.deep: must be valid"),
    ],
)
def test_it_rejects_json_postgresql_cannot_store_in_a_snapshots_extra_keys(
    world, where, value, named
):
    snapshot = copy.deepcopy(_probe())
    snapshot["nics"] = [{"name": "NIC0", "device": "mlx5_0"}]
    part = {
        "gpus": snapshot["gpus"][0],
        "nics": snapshot["nics"][0],
        "affinity": snapshot["affinity"][0],
        "pcie": snapshot["gpus"][0]["pcie"],
    }[where]
    part["extra"] = {"deep": value}
    body = json.dumps({"snapshot": snapshot}).encode()
    response = world.host_worker.post("/api/v1/hosts/rtx-pro-6000/topology", raw=body)
    assert response.status_code == 422
    assert response.json()["message"].startswith(named)
    assert not TopologySnapshot.objects.exists()


def test_host_token_records_topology_of_its_host_only(world):
    response = world.host_worker.post("/api/v1/hosts/h200-lab/topology", {"snapshot": _probe()})
    assert response.status_code == 403
    assert (
        world.host_worker.post("/api/v1/hosts/nope/topology", {"snapshot": _probe()}).status_code
        == 404
    )


# --------------------------------------------------------------------------- deployments


def test_it_registers_a_deployment_once(world):
    body = {
        "name": "kimi-k2-sglang",
        "model": "GLM-5",
        "host": "rtx-pro-6000",
        "gpus": [0, 1],
        "engine": "sglang",
        "engine_version": "0.5.5",
        "tp": 2,
        "max_running_requests": 256,
        "allreduce_fusion": False,
        "launch_args": {"--attention-backend": "triton"},
        "endpoint_url": "http://127.0.0.1:30000",
    }
    first = world.owner.post("/api/v1/deployments", body)
    assert first.status_code == 201
    assert first.json()["gpus"] == [0, 1]
    assert first.json()["host"] == "rtx-pro-6000"
    assert world.owner.post("/api/v1/deployments", body).status_code == 200
    assert Deployment.objects.filter(name="kimi-k2-sglang").count() == 1


@pytest.mark.parametrize("key", ["tp", "ep"])
def test_it_refuses_a_deployment_at_tp_or_ep_0(world, key):
    body = {"name": "x", "model": "GLM-5", "host": "rtx-pro-6000", "gpus": [0], key: 0}
    response = world.owner.post("/api/v1/deployments", body)
    assert response.status_code == 422
    assert f"{key}: Input should be greater than or equal to 1" in response.json()["message"]
    assert not Deployment.objects.filter(name="x").exists()


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/api/v1/models", {"config": GLM5_CONFIG}),
        ("/api/v1/hosts", {}),
        ("/api/v1/deployments", {"model": "GLM-5", "host": "rtx-pro-6000", "gpus": [0]}),
        ("/api/v1/slo-profiles", {"ttft_percentile": "p99", "ttft_ms": 500}),
    ],
)
def test_a_name_of_digits_alone_is_refused_as_it_would_read_as_another_rows_id(world, path, extra):
    # the API finds these by id or name: "2" would shadow the row whose id is 2
    tables = (ModelSpec, Host, Deployment, SLOProfile)
    rows = [table.objects.count() for table in tables]
    response = world.owner.post(path, {"name": "2", **extra})
    assert response.status_code == 422
    assert response.json()["message"].startswith("name: ")
    assert "'2' is digits alone, which the API reads as an id" in response.json()["message"]
    assert [table.objects.count() for table in tables] == rows
    assert world.owner.post(path, {"name": "h2", **extra}).status_code == 201


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/api/v1/models", {"config": GLM5_CONFIG}),
        ("/api/v1/deployments", {"model": "GLM-5", "host": "rtx-pro-6000", "gpus": [0]}),
        ("/api/v1/slo-profiles", {"ttft_percentile": "p99", "ttft_ms": 500}),
    ],
)
@pytest.mark.parametrize("name", ["glm\nprod", "glm\x1b[31mprod", "glm\tprod", "glm\x85"])
def test_a_name_with_a_control_character_is_refused_naming_the_field(world, path, extra, name):
    tables = (ModelSpec, Host, Deployment, SLOProfile)
    rows = [table.objects.count() for table in tables]
    response = world.owner.post(path, {"name": name, **extra})
    assert response.status_code == 422
    assert response.json()["message"] == (
        "name: holds a control character (a line break, a tab or an escape): a name is one "
        "line of text"
    )
    assert [table.objects.count() for table in tables] == rows


def test_a_row_named_by_digits_before_the_rule_still_takes_its_other_changes(world):
    host = Host.objects.create(name="70")
    profile = SLOProfile.objects.create(name="80", ttft_percentile="p99", ttft_ms=500)
    patched = world.owner.patch(f"/api/v1/hosts/{host.pk}", {"description": "old name"})
    assert patched.status_code == 200 and patched.json()["description"] == "old name"
    path = f"/api/v1/slo-profiles/{profile.pk}"
    assert world.owner.patch(path, {"ttft_ms": 400}).json()["ttft_ms"] == 400
    renamed = world.owner.patch(path, {"name": "81"})
    assert renamed.status_code == 422 and renamed.json()["message"].startswith("name: ")
    assert SLOProfile.objects.get(pk=profile.pk).name == "80"


def test_it_refuses_a_gpu_the_host_lacks(world):
    body = {"name": "x", "model": "GLM-5", "host": "rtx-pro-6000", "gpus": [7]}
    response = world.owner.post("/api/v1/deployments", body)
    assert response.status_code == 400
    assert response.json()["detail"].startswith("gpus:")
    assert not Deployment.objects.filter(name="x").exists()


def test_it_filters_deployments(world):
    assert world.read_only.get("/api/v1/deployments").json()["count"] == 2
    assert world.read_only.get("/api/v1/deployments?host=h200-lab").json()["count"] == 1
    assert world.read_only.get("/api/v1/deployments?status=healthy").json()["count"] == 0
    assert world.read_only.get("/api/v1/deployments/glm-5-h200").json()["tp"] == 8


def test_host_token_records_a_health_check_of_its_deployment(world):
    body = {"status": "healthy", "status_detail": "/health 200, model listed"}
    response = world.host_worker.patch("/api/v1/deployments/glm-5-sglang", body)
    assert response.status_code == 200
    assert response.json()["status"] == "healthy"
    assert response.json()["status_checked_at"] is not None
    assert world.host_worker.patch("/api/v1/deployments/glm-5-h200", body).status_code == 403
    assert world.owner.patch("/api/v1/deployments/glm-5-sglang", {}).status_code == 400
    assert world.owner.patch("/api/v1/deployments/glm-5-sglang", {"tp": 4}).status_code == 400


def test_host_token_cannot_create_hosts_or_deployments(world):
    assert world.host_worker.post("/api/v1/hosts", {"name": "new"}).status_code == 403
    body = {"name": "x", "model": "GLM-5", "host": "rtx-pro-6000"}
    assert world.host_worker.post("/api/v1/deployments", body).status_code == 403
    assert not Host.objects.filter(name="new").exists()


def test_it_names_the_p2p_text_that_is_malformed(world):
    matrix = (TOPOLOGY / "topo_m_2x5090_phb_tabs.txt").read_text()
    body = {"nvidia_smi_topo": matrix, "nvidia_smi_p2p": {"write": "GPU0 GPU1\nGPU0 X\n"}}
    response = world.host_worker.post("/api/v1/hosts/rtx-pro-6000/topology", body)
    assert response.status_code == 400
    assert response.json()["detail"].startswith("nvidia_smi_p2p.write: p2p write, line ")
