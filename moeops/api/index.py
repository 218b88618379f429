"""/api/v1/ itself: where a person or client that typed the API's address finds its schema,
its docs and how to get a token (django-ninja's own root answers 404)."""

from django.http import JsonResponse
from django.urls import reverse
from django.views.decorators.http import require_safe


@require_safe
def api_index(request):
    """Links (absolute URLs) to the OpenAPI schema, the docs page, the liveness probe and the
    page that makes tokens; open like the schema itself."""
    link = request.build_absolute_uri
    return JsonResponse(
        {
            "name": "moeops API",
            "version": "1",
            "schema": link(reverse("api-v1:openapi-json")),
            "docs": link(reverse("api-v1:openapi-view")),
            "health": link(reverse("api-v1:health")),
            "tokens": link(reverse("api-tokens")),
            "auth": "Authorization: Bearer <token>; browser sessions may read",
        }
    )
