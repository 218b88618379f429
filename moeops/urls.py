from django.contrib import admin
from django.urls import include, path

from moeops.api.api import api
from moeops.api.index import api_index

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    # before ninja's own root, which answers 404
    path("api/v1/", api_index, name="api-index"),
    path("api/v1/", api.urls),
    path("", include("moeops.front.urls")),
]
