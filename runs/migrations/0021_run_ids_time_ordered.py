# New runs get time-ordered ids (runs.ids, UUIDv7), so that the claim's last tie-break, by id on
# run_claim_kind_idx, is submission order.
#
# The default is Python's, not the database's: this changes Django's state only, no SQL (sqlmigrate
# prints none), so it takes no lock on the runs table and rewrites nothing. Existing ids stay as they are.

from django.db import migrations, models

import runs.ids


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0020_search_per_tenant'),
    ]

    operations = [
        migrations.AlterField(
            model_name='run',
            name='id',
            field=models.UUIDField(default=runs.ids.new_run_id, editable=False, primary_key=True, serialize=False),
        ),
    ]
