from django.apps import AppConfig


class DeploysConfig(AppConfig):
    name = "examples.deploys"
    label = "deploys"  # its migrations and table names predate the examples package
    verbose_name = "Deploys (demo resources of the deploy_app saga)"
    default_auto_field = "django.db.models.BigAutoField"
