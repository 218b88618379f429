"""Launch recipes and engine actions in the admin, read-only: a recipe version is made and an
action started through moeops.engines.services (the deployment page, the API), so that every
change is a new, attributed version and every action runs on the host's worker."""

from django.contrib import admin

from moeops.admin_readonly import ReadOnlyAdmin
from moeops.engines.models import EngineAction, LaunchRecipe


@admin.register(LaunchRecipe)
class LaunchRecipeAdmin(ReadOnlyAdmin):
    list_display = ("deployment", "version", "reason", "author", "created", "applied_at")
    list_filter = ("deployment",)


@admin.register(EngineAction)
class EngineActionAdmin(ReadOnlyAdmin):
    list_display = ("deployment", "kind", "status", "requested_by", "created", "finished_at")
    list_filter = ("status", "kind")
