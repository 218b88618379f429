import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from moeops.fleet import services as fleet_services
from moeops.fleet.models import GPU, Deployment, ModelSpec
from tests import page_base as pb
from tests.fakes import FIXTURES

HF_CONFIG = FIXTURES / "hf_configs" / "glm-5-fp8_config.json"

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(client):
    # staff: the forms below set endpoint addresses, which only staff may choose
    pb.sign_in(client, staff=True)
    return pb.model(), pb.host(), pb.host("other", gpus=2)


def _form(model, host, **extra):
    return {
        "name": "GLM-5 on h200",
        "model": model.pk if model else "",
        "host": host.pk,
        "engine": "sglang",
        "tp": "8",
        "ep": "1",
        "launch_args": "{}",
        "allreduce_fusion": "unknown",
        "endpoint_url": "127.0.0.1:30000",
        "status": "planned",
        **extra,
    }


def test_it_creates_a_deployment_with_its_gpus(client, fleet):
    model, host, _ = fleet
    gpus = [gpu.pk for gpu in host.gpus.all()[:4]]
    response = client.post("/deployments/new/", _form(model, host, gpus=gpus, tp="4"))
    deployment = Deployment.objects.get()
    assert response["Location"] == f"/deployments/{deployment.pk}/"
    assert deployment.tp == 4 and deployment.model == model
    assert sorted(g.index for g in deployment.gpus.all()) == [0, 1, 2, 3]
    assert deployment.endpoint_url == "http://127.0.0.1:30000"
    assert deployment.allreduce_fusion is None


def test_it_refuses_gpus_of_another_host(client, fleet):
    model, host, other = fleet
    response = client.post("/deployments/new/", _form(model, host, gpus=[other.gpus.first().pk]))
    assert response.status_code == 200
    assert f"Pick GPUs of {host.name} only." in response.content.decode()
    assert not Deployment.objects.exists()


def test_it_refuses_a_taken_name(client, fleet):
    model, host, _ = fleet
    pb.deployment("GLM-5 on h200", model_row=model, host_row=host)
    response = client.post("/deployments/new/", _form(model, host))
    assert "already exists" in response.content.decode()
    assert Deployment.objects.count() == 1


def test_it_edits_launch_arguments(client, fleet):
    model, host, _ = fleet
    deployment = pb.deployment(model_row=model, host_row=host)
    response = client.post(
        f"/deployments/{deployment.pk}/edit/",
        _form(model, host, max_running_requests="64", launch_args='{"--cuda-graph-max-bs": 256}'),
    )
    assert response.status_code == 302
    deployment.refresh_from_db()
    assert deployment.max_running_requests == 64
    assert deployment.launch_args == {"--cuda-graph-max-bs": 256}


def test_a_status_set_by_hand_is_a_check_in_the_history_like_the_apis(client, fleet):
    model, host, _ = fleet
    deployment = pb.deployment(model_row=model, host_row=host)
    before = deployment.updated

    client.post(f"/deployments/{deployment.pk}/edit/", _form(model, host, status="healthy"))

    deployment.refresh_from_db()
    [check] = deployment.health_checks.all()
    assert (check.status, check.trigger, check.get_trigger_display()) == (
        "healthy",
        "edit",
        "Set by hand",
    )
    # on record, but nothing checked the engine: the page still says "not checked yet"
    assert deployment.status_checked_at is None and deployment.updated > before
    head = client.get(deployment.get_absolute_url()).content.decode().split("</h1>")[0]
    assert "not checked yet" in head


def test_the_form_takes_a_new_models_config_json_without_the_admin(client, fleet):
    html = client.get("/deployments/new/").content.decode()
    assert "/admin/fleet/modelspec/add/" not in html
    assert 'enctype="multipart/form-data"' in html
    assert 'name="config_text"' in html and 'name="config_file"' in html


def _new_model(host, **extra):
    return _form(None, host, **extra)


def test_a_pasted_config_json_registers_the_model_with_the_deployment(client, fleet):
    _, host, _ = fleet
    config = {**pb.KIMI_CONFIG}
    response = client.post(
        "/deployments/new/",
        _new_model(
            host, name="kimi", new_model_name="moonshotai/Kimi-K2", config_text=json.dumps(config)
        ),
    )
    deployment = Deployment.objects.get(name="kimi")
    assert response["Location"] == deployment.get_absolute_url()
    assert deployment.model.name == "moonshotai/Kimi-K2"
    assert deployment.model.config_json == config and deployment.model.num_experts == 384
    assert deployment.moe_shape()["experts_per_rank"] == 384


def test_an_uploaded_config_json_registers_the_model(client, fleet):
    _, host, _ = fleet
    upload = SimpleUploadedFile("config.json", HF_CONFIG.read_bytes(), "application/json")
    client.post(
        "/deployments/new/",
        _new_model(host, name="glm", new_model_name="zai-org/GLM-5-FP8", config_file=upload),
    )
    model = Deployment.objects.get(name="glm").model
    assert model.name == "zai-org/GLM-5-FP8"
    assert model.config_json == json.loads(HF_CONFIG.read_text())
    assert (model.num_experts, model.moe_intermediate_size) == (256, 2048)


def test_tp_is_checked_against_the_shape_before_saving(client, fleet):
    model, host, _ = fleet
    response = client.post("/deployments/new/", _form(model, host, tp="7"))
    html = response.content.decode()
    assert response.status_code == 200
    assert "The MoE shape does not split over tp=7, ep=1" in html
    assert "moe_intermediate_size 2048 is not divisible by the MoE tensor-parallel size 7" in html
    assert not Deployment.objects.exists()


def test_ep_that_does_not_divide_the_experts_is_refused_on_ep(client, fleet):
    model, host, _ = fleet
    response = client.post("/deployments/new/", _form(model, host, tp="3", ep="3"))
    html = response.content.decode()
    ep_field = html.split('name="ep"')[1].split("</div>")[0]
    assert "num_experts 256 is not divisible by ep 3" in ep_field
    assert not Deployment.objects.exists()


def test_a_config_identical_to_a_model_on_record_reuses_it(client, fleet):
    model, host, _ = fleet
    response = client.post(
        "/deployments/new/",
        _new_model(host, new_model_name="GLM-5 again", config_text=json.dumps(pb.GLM5_CONFIG)),
        follow=True,
    )
    deployment = Deployment.objects.get()
    assert deployment.model == model
    assert ModelSpec.objects.count() == 1
    assert "is the one of “GLM-5”, on record already" in response.content.decode()


def test_a_taken_model_name_with_another_config_keeps_what_was_typed(client, fleet):
    _, host, _ = fleet
    upload = SimpleUploadedFile("config.json", json.dumps(pb.KIMI_CONFIG).encode())
    response = client.post(
        "/deployments/new/",
        _new_model(host, name="my kimi", new_model_name="GLM-5", config_file=upload, tp="4"),
    )
    html = response.content.decode()
    assert "A model named “GLM-5” is on record with another config.json" in html
    # the upload's text is back in the textarea, the rest as typed
    textarea = html.split('name="config_text"')[1].split("</textarea>")[0]
    assert "&quot;n_routed_experts&quot;: 384" in textarea
    assert 'name="name" value="my kimi"' in html and 'name="tp" value="4"' in html
    assert not Deployment.objects.exists() and ModelSpec.objects.count() == 1


def test_names_of_digits_alone_are_refused_on_their_fields(client, fleet):
    # the API finds deployments and models by id or name: "3" would read as another row's id
    _, host, _ = fleet
    upload = SimpleUploadedFile("config.json", json.dumps(pb.KIMI_CONFIG).encode())
    response = client.post(
        "/deployments/new/", _new_model(host, name="3", new_model_name="42", config_file=upload)
    )
    html = response.content.decode()
    name_field = html.split('name="name"')[1].split("</div>")[0]
    model_field = html.split('name="new_model_name"')[1].split("</div>")[0]
    assert "&#x27;3&#x27; is digits alone, which the API reads as an id" in name_field
    assert "&#x27;42&#x27; is digits alone, which the API reads as an id" in model_field
    assert not Deployment.objects.exists() and ModelSpec.objects.count() == 1


def test_names_with_a_line_break_or_an_escape_are_refused_on_their_fields(client, fleet):
    _, host, _ = fleet
    upload = SimpleUploadedFile("config.json", json.dumps(pb.KIMI_CONFIG).encode())
    response = client.post(
        "/deployments/new/",
        _new_model(host, name="kimi\nprod", new_model_name="kimi\x1b[0m", config_file=upload),
    )
    html = response.content.decode()
    said = "holds a control character (a line break, a tab or an escape): a name is one line"
    assert said in html.split('name="name"')[1].split("</div>")[0]
    assert said in html.split('name="new_model_name"')[1].split("</div>")[0]
    assert not Deployment.objects.exists() and ModelSpec.objects.count() == 1


@pytest.mark.parametrize(
    ("field", "text", "said"),
    [
        ("launch_args", '{"--x": NaN}', "--x: must not be NaN or Infinity."),
        ("launch_args", "[" * 5000 + "]" * 5000, "Nested too deep to read."),
        ("config_text", "[" * 5000 + "]" * 5000, "config.json: nested too deep to read"),
        ("config_text", '{"num_experts": NaN}', "config.json: num_experts: must not be NaN"),
    ],
)
def test_json_no_database_stores_is_the_fields_error_not_a_500(client, fleet, field, text, said):
    model, host, _ = fleet
    fields = {"launch_args": text} if field == "launch_args" else {"config_text": text}
    response = client.post(
        "/deployments/new/",
        _form(model if field == "launch_args" else None, host, new_model_name="m", **fields),
    )
    assert response.status_code == 200
    errors = response.content.decode().split(f'name="{field}"')[1].split("</div>")[0]
    assert said in errors
    assert not Deployment.objects.exists() and ModelSpec.objects.count() == 1


def test_a_config_that_is_not_moe_is_refused_on_the_config(client, fleet):
    _, host, _ = fleet
    response = client.post(
        "/deployments/new/",
        _new_model(host, new_model_name="llama", config_text='{"hidden_size": 4096}'),
    )
    assert "config.json: not a Mixture-of-Experts config" in response.content.decode()
    assert not ModelSpec.objects.filter(name="llama").exists()


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("model_type", 5, "config.json: model_type must be a string, got 5"),
        ("architectures", ["X" * 201], "config.json: architectures[0] must be at most 200"),
        ("vocab_size", -5, "config.json: vocab_size must be an integer from 2 to 16,777,216"),
    ],
)
def test_a_config_a_model_row_cannot_hold_is_refused_on_the_config(
    client, fleet, key, value, named
):
    _, host, _ = fleet
    config = {**pb.KIMI_CONFIG, key: value}
    response = client.post(
        "/deployments/new/",
        _new_model(host, new_model_name="odd", config_text=json.dumps(config)),
    )
    assert named in response.content.decode()
    assert (ModelSpec.objects.count(), Deployment.objects.count()) == (1, 0)


def test_neither_a_model_nor_a_config_says_what_to_give(client, fleet):
    _, host, _ = fleet
    response = client.post("/deployments/new/", _new_model(host))
    assert "Pick a model on record, or paste or upload its config.json." in (
        response.content.decode()
    )


def test_the_service_registers_a_new_model_with_the_deployment_or_neither(fleet):
    _, host, _ = fleet
    new_model = {"name": "moonshotai/Kimi-K2", "config": pb.KIMI_CONFIG}
    with pytest.raises(GPU.DoesNotExist):
        fleet_services.deployment_create(
            name="kimi", host=host, new_model=new_model, gpu_indexes=[0, 9], tp=8
        )
    assert not ModelSpec.objects.filter(name="moonshotai/Kimi-K2").exists()

    deployment, created = fleet_services.deployment_create(
        name="kimi", host=host, new_model=new_model, gpu_indexes=[0, 1], tp=8
    )
    assert created and deployment.model.name == "moonshotai/Kimi-K2"
    assert deployment.model.provenance == "config.json given in the new-deployment form"
    assert deployment.gpu_indices() == [0, 1]


def test_an_empty_launch_arguments_box_means_none(client, fleet):
    model, host, _ = fleet
    response = client.post("/deployments/new/", _form(model, host, launch_args=""))
    deployment = Deployment.objects.get()
    assert response["Location"] == f"/deployments/{deployment.pk}/"
    assert deployment.launch_args == {}


def test_launch_arguments_that_are_no_flag_to_value_pairs_are_refused(client, fleet):
    model, host, _ = fleet
    response = client.post("/deployments/new/", _form(model, host, launch_args="[1, 2]"))
    assert response.status_code == 200
    assert "Give flag → value pairs" in response.content.decode()
    assert not Deployment.objects.exists()


def test_a_gpu_id_past_any_column_is_refused_on_its_field(client, fleet):
    model, host, _ = fleet
    response = client.post("/deployments/new/", _form(model, host, gpus=["9" * 400]))
    assert response.status_code == 200
    assert f"“{'9' * 20}…” is not a valid value." in response.content.decode()
    assert not Deployment.objects.exists()
