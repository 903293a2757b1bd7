"""Once three demo leads of no tenant; leads belong to a tenant now (0003), and `manage.py up` seeds the
demo tenant's (examples.crm.demo). Kept so that the migrations that follow it keep their place."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("crm", "0001_initial")]
    operations = []
