from django.contrib import admin

from examples.deploys.models import Resource


@admin.register(Resource)
class ResourceAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "kind", "name", "state", "run_id", "created_at", "deleted_at"]
    list_filter = ["kind", "state", "tenant"]
    list_select_related = ["tenant"]
    search_fields = ["name", "key"]
    readonly_fields = [
        "tenant",
        "kind",
        "name",
        "state",
        "key",
        "run_id",
        "created_at",
        "deleted_at",
    ]
