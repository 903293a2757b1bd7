# Conversations (runs.models.threads): the Thread, a run's thread and turn, a message's thread,
# mention and reply key. New columns are NULL or have a constant default (no table rewrite); the
# indexes and constraints on the existing runs and messages are made by 0023 without blocking writes.

import django.contrib.postgres.fields
import django.db.models.deletion
import django.utils.timezone
import runs.models.notifications
import uuid
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0021_claim_ties_by_submission'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='mention',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='message',
            name='reply_key',
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
        migrations.AddField(
            model_name='run',
            name='turn',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='message',
            name='run',
            field=models.ForeignKey(db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='messages', to='runs.run'),
        ),
        migrations.AlterField(
            model_name='webhookendpoint',
            name='event_types',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(choices=[('run.done', 'run.done'), ('run.failed', 'run.failed'), ('run.cancelled', 'run.cancelled'), ('run.waiting_human', 'run.waiting_human'), ('thread.asleep', 'thread.asleep'), ('thread.closed', 'thread.closed')], max_length=64), default=runs.models.notifications.all_webhook_event_types, help_text='The events this endpoint receives.'),
        ),
        migrations.CreateModel(
            name='Thread',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('kind', models.CharField(max_length=100)),
                ('title', models.CharField(blank=True, default='', max_length=200)),
                ('status', models.CharField(choices=[('asleep', 'Asleep'), ('active', 'Active'), ('closed', 'Closed')], default='asleep', max_length=16)),
                ('policy', models.CharField(choices=[('interleave', 'Interleave'), ('enqueue', 'Enqueue'), ('interrupt', 'Interrupt'), ('rollback', 'Rollback'), ('reject', 'Reject')], default='interleave', max_length=16)),
                ('state', models.JSONField(blank=True, default=dict)),
                ('cost_ceiling_cents', models.DecimalField(blank=True, decimal_places=6, max_digits=18, null=True)),
                ('cost_cents', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                ('turns', models.PositiveIntegerField(default=0)),
                ('live_turn', models.PositiveIntegerField(blank=True, null=True)),
                ('summary', models.CharField(blank=True, default='', max_length=300)),
                ('idempotency_key', models.CharField(blank=True, max_length=255, null=True)),
                ('request_hash', models.CharField(blank=True, default='', max_length=64)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('tenant', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='threads', to='runs.tenant')),
            ],
        ),
        migrations.AddField(
            model_name='message',
            name='thread',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='messages', to='runs.thread'),
        ),
        migrations.AddField(
            model_name='run',
            name='thread',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='turn_runs', to='runs.thread'),
        ),
        migrations.AddIndex(
            model_name='thread',
            index=models.Index(models.F('tenant'), models.OrderBy(models.F('created_at'), descending=True), models.OrderBy(models.F('id'), descending=True), name='thread_tenant_recent_idx'),
        ),
        migrations.AddConstraint(
            model_name='thread',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['asleep', 'active', 'closed'])), name='thread_status_valid'),
        ),
        migrations.AddConstraint(
            model_name='thread',
            constraint=models.CheckConstraint(condition=models.Q(('policy__in', ['interleave', 'enqueue', 'interrupt', 'rollback', 'reject'])), name='thread_policy_valid'),
        ),
        migrations.AddConstraint(
            model_name='thread',
            constraint=models.CheckConstraint(condition=models.Q(('cost_cents__gte', 0)), name='thread_cost_non_negative'),
        ),
        migrations.AddConstraint(
            model_name='thread',
            constraint=models.CheckConstraint(condition=models.Q(('cost_ceiling_cents__isnull', True), ('cost_ceiling_cents__gte', 0), _connector='OR'), name='thread_cost_ceiling_non_negative'),
        ),
        migrations.AddConstraint(
            model_name='thread',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('live_turn__isnull', False), ('status', 'active')), models.Q(models.Q(('status', 'active'), _negated=True), ('live_turn__isnull', True)), _connector='OR'), name='thread_active_iff_live_turn'),
        ),
        migrations.AddConstraint(
            model_name='thread',
            constraint=models.UniqueConstraint(condition=models.Q(('idempotency_key__isnull', False)), fields=('tenant', 'idempotency_key'), name='thread_idempotency_key_unique_per_tenant'),
        ),
    ]
