from django.apps import AppConfig


class CrmConfig(AppConfig):
    name = "crm"
    verbose_name = "CRM (demo table for the crm_update agent)"
    default_auto_field = "django.db.models.BigAutoField"
