"""The admin's read-only pages: rows that a service or a worker writes (keyed, hashed, summed or
versioned as they are stored) are listed and shown there, never added or edited by hand."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Lists and shows rows, and deletes them where the admin may; never adds or edits one."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
