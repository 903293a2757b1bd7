from django.contrib import admin

from examples.crm.models import Lead, LeadUpdate


@admin.register(Lead)
class LeadAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "name", "company", "stage", "updated_at"]
    list_filter = ["stage", "tenant"]
    list_select_related = ["tenant"]
    search_fields = ["name", "company", "email"]


@admin.register(LeadUpdate)
class LeadUpdateAdmin(admin.ModelAdmin):
    list_display = ["id", "lead", "changes", "run_id", "applied_at"]
    readonly_fields = ["idempotency_key", "lead", "changes", "previous", "run_id", "applied_at"]
