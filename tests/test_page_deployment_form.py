import pytest

from moeops.fleet.models import Deployment
from tests import page_base as pb

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(client):
    # staff: the forms below set endpoint addresses, which only staff may choose
    pb.sign_in(client, staff=True)
    return pb.model(), pb.host(), pb.host("other", gpus=2)


def _form(model, host, **extra):
    return {
        "name": "GLM-5 on h200",
        "model": model.pk,
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


def test_the_form_links_to_the_model_admin(client, fleet):
    html = client.get("/deployments/new/").content.decode()
    assert "/admin/fleet/modelspec/add/" in html
