"""Property-based run of the OpenAPI schema (schemathesis): no request gets a 5xx."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from moeops.insights.models import Finding, Note, PlanItem
from moeops.kernels.models import KernelConfig, TuningRun
from moeops.wsgi import application
from tests.api_base import make_world, wsgi_in_test_transaction

RUN_UUID = "6f0c7f6e-55a4-4b42-9a3f-3d1f9f3c0d10"
TUNING_UUID = "9d2b4a3e-7c61-4c0f-8f0e-2a6b1e5d7c22"
# Path references that name existing rows, filled per test by the `world` fixture: random
# strings alone would only ever reach the 404 branch.
KNOWN_REFS = ["glm-5-sglang", "rtx-pro-6000", "GLM-5", RUN_UUID, TUNING_UUID, "known-note"]

schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application)


@schema.hook("flatmap_path_parameters")
def known_or_generated(context, path_parameters):
    if not path_parameters:
        return st.just(path_parameters)
    known = st.sampled_from(KNOWN_REFS).map(lambda ref: {name: ref for name in path_parameters})
    return st.one_of(st.just(path_parameters), known)


@pytest.fixture
def world(db):
    world = make_world()
    run = world.run(uuid=RUN_UUID, status="running")
    config = KernelConfig.objects.create(
        device_name="NVIDIA H200",
        E=256,
        N=256,
        entries={
            "1": {
                "BLOCK_SIZE_M": 16,
                "BLOCK_SIZE_N": 64,
                "BLOCK_SIZE_K": 128,
                "GROUP_SIZE_M": 1,
                "num_warps": 4,
                "num_stages": 3,
            }
        },
        triton_version="3.7.1",
    )
    TuningRun.objects.create(
        uuid=TUNING_UUID, host=world.host, E=256, N=256, hidden_size=6144, topk=8
    )
    finding = Finding.objects.create(
        deployment=world.deployment, run=run, kind="plateau", title="t"
    )
    PlanItem.objects.create(deployment=world.deployment, finding=finding, title="tune")
    Note.objects.create(title="Known", slug="known-note", body="*hi*")
    ids = [str(run.pk), str(config.pk), str(finding.pk)]
    KNOWN_REFS.extend(ids)
    with wsgi_in_test_transaction():
        yield world
    del KNOWN_REFS[-len(ids) :]


@schema.parametrize()
@settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_request_gets_a_server_error(case, world):
    response = case.call(headers={"Authorization": f"Bearer {world.owner_token}"})
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} {case.body!r} → {response.status_code} "
        f"{response.text[:300]}"
    )
