# The claim index gains the kind after the queue, so that queued runs of a
# paused or unregistered kind cost a claim one index descent. Built and
# dropped concurrently: the run table is the queue, and a production claim
# must not wait behind an index build.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('runs', '0010_step_text_replaced'),
    ]

    operations = [
        # The new index first, then the old one goes: claims never lose theirs.
        AddIndexConcurrently(
            model_name='run',
            index=models.Index(models.F('tenant'), models.F('queue'), models.F('kind'), models.F('priority'), models.ExpressionWrapper(models.Q(('started_at__isnull', True)), output_field=models.BooleanField()), models.F('run_after'), models.F('id'), condition=models.Q(('status', 'queued')), name='run_claim_kind_idx'),
        ),
        RemoveIndexConcurrently(
            model_name='run',
            name='run_claim_idx',
        ),
    ]
