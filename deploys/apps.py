from django.apps import AppConfig


class DeploysConfig(AppConfig):
    name = "deploys"
    verbose_name = "Deploys (demo resources of the deploy_app saga)"
    default_auto_field = "django.db.models.BigAutoField"
