"""Three demo leads, so `make run` has something for the crm_update agent to work on."""

from django.db import migrations

LEADS = [
    {"name": "Ada Byron", "company": "Analytical Engines Ltd", "email": "ada@engines.example", "stage": "contacted",
     "notes": "Intro call went well; wants pricing for 20 seats."},
    {"name": "Grace Hopper", "company": "Compiler Works", "email": "grace@compilers.example", "stage": "proposal",
     "notes": "Proposal sent; decision expected this month."},
    {"name": "Alan Turing", "company": "Bletchley Analytics", "email": "alan@bletchley.example", "stage": "new",
     "notes": ""},
]


def add_leads(apps, schema_editor):
    Lead = apps.get_model("crm", "Lead")
    for lead in LEADS:
        Lead.objects.get_or_create(email=lead["email"], defaults=lead)


def remove_leads(apps, schema_editor):
    apps.get_model("crm", "Lead").objects.filter(email__in=[lead["email"] for lead in LEADS]).delete()


class Migration(migrations.Migration):
    dependencies = [("crm", "0001_initial")]
    operations = [migrations.RunPython(add_leads, remove_leads)]
