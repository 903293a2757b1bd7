# The claim index gains created_at before id, so that runs of equal priority due at the same moment
# start in the order they were submitted (the last tie-break was a random uuid). Not atomic: the new
# index is built CONCURRENTLY before the old one is dropped (no lock that stops submits, and the
# claim always has an index to walk); on a large backlog of queued runs the build is one scan of them.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('runs', '0020_search_per_tenant'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(models.F('tenant'), models.F('queue'), models.F('kind'), models.F('priority'), models.ExpressionWrapper(models.Q(('started_at__isnull', True)), output_field=models.BooleanField()), models.F('run_after'), models.F('created_at'), models.F('id'), condition=models.Q(('status', 'queued')), name='run_claim_order_idx'),
        ),
        RemoveIndexConcurrently(
            model_name='run',
            name='run_claim_kind_idx',
        ),
    ]
