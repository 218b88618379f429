from django.contrib import admin
from django.urls import include, path

from moeops.api.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", api.urls),
    path("", include("moeops.front.urls")),
]
