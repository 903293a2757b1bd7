# What a run says about itself (outcome, summary: ctx.report; title: from its input at submit)
# and the trigram index that searches runs by title and input text (bench/list_search.py).
#
# Not atomic, like 0009 and 0011: the index is built CONCURRENTLY, and the titles of
# existing runs are filled in batches that each commit, so a live run table never
# waits behind this migration for long. The backfill runs before the index exists,
# so its updates stay HOT and cost no index maintenance.

import json

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import (
    AddIndexConcurrently,
    BtreeGinExtension,
    TrigramExtension,
)
from django.db import migrations, models

import runs.models.run

BACKFILL_BATCH = 1000


def backfill_titles(apps, schema_editor):
    """Existing runs get the title a submit would give them now (runs.titles, the kinds registered now)."""
    from runs.registry import get_kind
    from runs.titles import default_title, title_for

    connection = schema_editor.connection
    last = None
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, kind, input FROM runs_run WHERE title = '' AND (%s::uuid IS NULL OR id > %s::uuid)"
                " ORDER BY id LIMIT %s",
                [last, last, BACKFILL_BATCH],
            )
            rows = cursor.fetchall()
            if not rows:
                return
            last = rows[-1][0]
            ids, titles = [], []
            for run_id, kind_name, data in rows:
                if isinstance(data, str):  # Django's psycopg setup hands jsonb back as text
                    data = json.loads(data)
                kind = get_kind(kind_name)
                title = title_for(kind, data) if kind is not None else default_title(data)
                if title:
                    ids.append(run_id)
                    titles.append(title)
            if ids:
                cursor.execute(
                    "UPDATE runs_run AS r SET title = v.title FROM unnest(%s::uuid[], %s::text[]) AS v(id, title)"
                    " WHERE r.id = v.id AND r.title = ''",
                    [ids, titles],
                )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('runs', '0014_workflows'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='outcome',
            field=models.CharField(blank=True, choices=[('', 'Not reported'), ('succeeded', 'Succeeded'), ('unchanged', 'Nothing changed'), ('partial', 'Partly done')], default='', max_length=16),
        ),
        migrations.AddField(
            model_name='run',
            name='summary',
            field=models.CharField(blank=True, default='', max_length=300),
        ),
        migrations.AddField(
            model_name='run',
            name='title',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddConstraint(
            model_name='run',
            constraint=models.CheckConstraint(condition=models.Q(('outcome__in', ['', 'succeeded', 'unchanged', 'partial'])), name='run_outcome_valid'),
        ),
        migrations.RunPython(backfill_titles, migrations.RunPython.noop, elidable=True),
        # pg_trgm and btree_gin are trusted extensions (PostgreSQL 13+): the database's owner may
        # create them without being a superuser. IF NOT EXISTS: an operator may have already.
        TrigramExtension(),
        BtreeGinExtension(),
        AddIndexConcurrently(
            model_name='run',
            index=django.contrib.postgres.indexes.GinIndex(models.F('tenant'), django.contrib.postgres.indexes.OpClass(runs.models.run.SearchText(), name='gin_trgm_ops'), name='run_search_trgm_idx'),
        ),
    ]
