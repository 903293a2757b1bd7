"""Resources belong to the tenant whose deploy made them: each is the tenant of the run it names."""

import django.db.models.deletion
from django.db import migrations, models


def from_runs(apps, schema_editor):
    schema_editor.execute(
        "UPDATE deploys_resource r SET tenant_id = run.tenant_id FROM runs_run run WHERE run.id = r.run_id"
    )
    # A resource whose run was deleted (retention) belongs to nobody left.
    apps.get_model("deploys", "Resource").objects.filter(tenant__isnull=True).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("deploys", "0001_initial"),
        ("runs", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="resource",
            name="tenant",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name="+",
                                    to="runs.tenant"),
        ),
        migrations.RunPython(from_runs, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="resource",
            name="tenant",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="runs.tenant"),
        ),
    ]
