from django.contrib import admin

from deploys.models import Resource


@admin.register(Resource)
class ResourceAdmin(admin.ModelAdmin):
    list_display = ["id", "kind", "name", "state", "run_id", "created_at", "deleted_at"]
    list_filter = ["kind", "state"]
    search_fields = ["name", "key"]
    readonly_fields = ["kind", "name", "state", "key", "run_id", "created_at", "deleted_at"]
