from django.apps import AppConfig


class CrmConfig(AppConfig):
    name = "examples.crm"
    label = "crm"  # its migrations and table names (crm_lead) predate the examples package
    verbose_name = "CRM (demo table for the crm_update agent)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from examples.crm.demo import add_demo_leads
        from runs.seed import demo_seeded

        demo_seeded.connect(add_demo_leads, dispatch_uid="examples.crm.demo_leads")
