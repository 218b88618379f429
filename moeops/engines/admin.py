"""Launch recipes and engine actions in the admin, read-only: a recipe version is made and an
action started through moeops.engines.services (the deployment page, the API), so that every
change is a new, attributed version and every action runs on the host's worker."""

from django.contrib import admin

from moeops.engines.models import EngineAction, LaunchRecipe


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(LaunchRecipe)
class LaunchRecipeAdmin(ReadOnly):
    list_display = ("deployment", "version", "reason", "author", "created", "applied_at")
    list_filter = ("deployment",)


@admin.register(EngineAction)
class EngineActionAdmin(ReadOnly):
    list_display = ("deployment", "kind", "status", "requested_by", "created", "finished_at")
    list_filter = ("status", "kind")
