"""Leads belong to a tenant: a run reads and writes only its own tenant's leads.

Leads made before (the demo leads of 0002) go to the demo tenant of `manage.py up` when there is one; a
database without it has no tenant they could belong to, and they are removed with their updates.
"""

import django.db.models.deletion
from django.db import migrations, models


def to_demo_tenant(apps, schema_editor):
    Lead = apps.get_model("crm", "Lead")
    demo = apps.get_model("runs", "Tenant").objects.filter(slug="demo").values_list("pk", flat=True).first()
    if demo is None:
        Lead.objects.all().delete()
    else:
        Lead.objects.update(tenant_id=demo)


class Migration(migrations.Migration):

    dependencies = [
        ("crm", "0002_demo_leads"),
        ("runs", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="lead",
            name="tenant",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name="+",
                                    to="runs.tenant"),
        ),
        migrations.RunPython(to_demo_tenant, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="lead",
            name="tenant",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="runs.tenant"),
        ),
        migrations.AlterField(
            model_name="lead",
            name="email",
            field=models.EmailField(max_length=254),
        ),
        migrations.AddConstraint(
            model_name="lead",
            constraint=models.UniqueConstraint(fields=("tenant", "email"), name="lead_unique_tenant_email"),
        ),
    ]
