from django.contrib import admin, messages

from moeops.api.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "host", "read_only", "created", "last_used")
    list_filter = ("read_only", "host")
    fields = ("name", "host", "read_only", "prefix", "created", "last_used")
    readonly_fields = ("prefix", "created", "last_used")

    def save_model(self, request, obj, form, change):
        if change:
            obj.save()
            return
        row, plaintext = ApiToken.issue(name=obj.name, host=obj.host, read_only=obj.read_only)
        obj.pk = row.pk
        obj.prefix, obj.hashed = row.prefix, row.hashed
        messages.warning(
            request, f"Token for {row.name}: {plaintext} — copy it now, it is not shown again."
        )
