"""The REST API under /api/v1: schema at /api/v1/openapi.json, docs at /api/v1/docs."""

from ninja import Schema

from moeops.api import (
    deployments,
    engines,
    errors,
    fleet,
    insights,
    kernels,
    profiles,
    runs,
    watches,
    workloads,
)
from moeops.api.auth import READ
from moeops.api.openapi import DocumentedAPI

api = DocumentedAPI(
    title="moeops",
    version="1",
    description=(
        "Deployments, sweeps, telemetry, kernel configs and findings of Mixture-of-Experts "
        "LLM deployments. Send `Authorization: Bearer <token>` (create one with "
        "`python manage.py create_token NAME`); browser sessions may read."
    ),
    auth=READ,
    parser=errors.StrictUtf8Parser(),
    urls_namespace="api-v1",
)
errors.install(api)


class Health(Schema):
    status: str


@api.get("/health", auth=None, response=Health, tags=["health"])
def health(request):
    """Liveness; the only endpoint that needs no token."""
    return {"status": "ok"}


api.add_router("/", fleet.router)
api.add_router("/", deployments.router)
api.add_router("/", runs.router)
api.add_router("/", profiles.router)
api.add_router("/", kernels.router)
api.add_router("/", insights.router)
api.add_router("/", engines.router)
api.add_router("/", workloads.router)
api.add_router("/", watches.router)
