"""Web-side tasks of the fleet app: the periodic health check (Celery beat, see settings)."""

import logging

from django.conf import settings
from django.core.exceptions import ValidationError

from moeops.celery import app
from moeops.fleet import services
from moeops.fleet.models import Deployment

log = logging.getLogger(__name__)


@app.task
def check_deployments():
    """Enqueue `workers.check_deployment` for every deployment that has an endpoint URL, each on
    its host's queue; returns their ids. One whose endpoint is refused (fleet.endpoints) is
    left out, logged, and the others are checked."""
    queued = []
    deployments = Deployment.objects.exclude(endpoint_url="").select_related("model", "host")
    for deployment in deployments:
        # a check no worker started within one interval is dropped: the next one is on its way
        try:
            services.deployment_check_enqueue(
                deployment=deployment,
                trigger="periodic",
                expires_s=settings.MOEOPS_HEALTH_CHECK_INTERVAL_S or None,
            )
        except ValidationError as exc:
            log.warning("not checking deployment %s: %s", deployment.name, exc.messages[0])
            continue
        queued.append(deployment.pk)
    return queued
