# The indexes and constraints of conversations on the existing tables (runs_run, runs_message, and
# runs_step's kinds, which gain state and reply),
# made without a lock that stops submits or checkpoints: the unique and plain indexes are built
# CONCURRENTLY, the checks added NOT VALID and then validated (which only reads, under a lock
# that lets writes go on). Not atomic, as CONCURRENTLY requires.

from django.db import migrations, models


def concurrently(model_name, constraint_or_index, create_sql, drop_sql):
    """``create_sql`` is one statement, or a list run one by one (each its own transaction)."""
    add = (
        migrations.AddIndex(model_name=model_name, index=constraint_or_index)
        if isinstance(constraint_or_index, models.Index)
        else migrations.AddConstraint(model_name=model_name, constraint=constraint_or_index)
    )
    return migrations.SeparateDatabaseAndState(
        database_operations=[
            migrations.RunSQL(sql, drop_sql if i == 0 else migrations.RunSQL.noop)
            for i, sql in enumerate([create_sql] if isinstance(create_sql, str) else create_sql)
        ], state_operations=[add]
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('runs', '0022_threads'),
    ]

    operations = [
        concurrently(
            'message',
            models.Index(condition=models.Q(('thread__isnull', False)), fields=['thread', 'id'], name='message_thread_idx'),
            'CREATE INDEX CONCURRENTLY IF NOT EXISTS message_thread_idx ON runs_message (thread_id, id) WHERE thread_id IS NOT NULL',
            'DROP INDEX CONCURRENTLY IF EXISTS message_thread_idx',
        ),
        concurrently(
            'message',
            models.UniqueConstraint(condition=models.Q(('reply_key__isnull', False)), fields=('run', 'reply_key'), name='message_reply_once_per_step'),
            'CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS message_reply_once_per_step ON runs_message (run_id, reply_key) WHERE reply_key IS NOT NULL',
            'DROP INDEX CONCURRENTLY IF EXISTS message_reply_once_per_step',
        ),
        concurrently(
            'run',
            models.UniqueConstraint(condition=models.Q(('thread__isnull', False)), fields=('thread', 'turn'), name='run_thread_turn_unique'),
            'CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS run_thread_turn_unique ON runs_run (thread_id, turn) WHERE thread_id IS NOT NULL',
            'DROP INDEX CONCURRENTLY IF EXISTS run_thread_turn_unique',
        ),
        concurrently(
            'message',
            models.CheckConstraint(condition=models.Q(('run__isnull', False), ('thread__isnull', False), _connector='OR'), name='message_of_a_run_or_a_thread'),
            ['ALTER TABLE runs_message ADD CONSTRAINT message_of_a_run_or_a_thread CHECK (run_id IS NOT NULL OR thread_id IS NOT NULL) NOT VALID',
            'ALTER TABLE runs_message VALIDATE CONSTRAINT message_of_a_run_or_a_thread'],
            'ALTER TABLE runs_message DROP CONSTRAINT IF EXISTS message_of_a_run_or_a_thread',
        ),
        concurrently(
            'run',
            models.CheckConstraint(condition=models.Q(models.Q(('thread__isnull', True), ('turn__isnull', True)), models.Q(('thread__isnull', False), ('turn__gte', 1)), _connector='OR'), name='run_turn_iff_thread'),
            ['ALTER TABLE runs_run ADD CONSTRAINT run_turn_iff_thread CHECK ((thread_id IS NULL AND turn IS NULL) OR (thread_id IS NOT NULL AND turn >= 1)) NOT VALID',
            'ALTER TABLE runs_run VALIDATE CONSTRAINT run_turn_iff_thread'],
            'ALTER TABLE runs_run DROP CONSTRAINT IF EXISTS run_turn_iff_thread',
        ),
        migrations.AlterField(
            model_name='step',
            name='kind',
            field=models.CharField(choices=[('llm', 'Llm'), ('tool', 'Tool'), ('approval', 'Approval'), ('message', 'Message'), ('child', 'Child'), ('sleep', 'Sleep'), ('compensation', 'Compensation'), ('state', 'State'), ('reply', 'Reply'), ('custom', 'Custom')], default='custom', max_length=16),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                # Dropped and added NOT VALID in one transaction (a moment's lock), validated after.
                migrations.RunSQL(
                    "ALTER TABLE runs_step DROP CONSTRAINT step_kind_valid, "
                    "ADD CONSTRAINT step_kind_valid CHECK (kind IN ('llm', 'tool', 'approval', 'message', 'child', 'sleep', 'compensation', 'state', 'reply', 'custom')) NOT VALID",
                    "ALTER TABLE runs_step DROP CONSTRAINT step_kind_valid, "
                    "ADD CONSTRAINT step_kind_valid CHECK (kind IN ('llm', 'tool', 'approval', 'message', 'child', 'sleep', 'compensation', 'custom')) NOT VALID",
                ),
                migrations.RunSQL("ALTER TABLE runs_step VALIDATE CONSTRAINT step_kind_valid", migrations.RunSQL.noop),
            ],
            state_operations=[
                migrations.RemoveConstraint(model_name='step', name='step_kind_valid'),
                migrations.AddConstraint(
                    model_name='step',
                    constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['llm', 'tool', 'approval', 'message', 'child', 'sleep', 'compensation', 'state', 'reply', 'custom'])), name='step_kind_valid'),
                ),
            ],
        ),
    ]
