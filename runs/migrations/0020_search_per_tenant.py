# The run search's index keyed per tenant (runs.models.run.SearchKeys, bench/search_isolation.py).
#
# The trigram index of 0015 had one posting list per trigram for all tenants: a search
# read every tenant's entries of its words, so its time told a tenant how common a word
# was in the others' runs. Its replacement's keys name their tenant ("<tenant id>:abc").
#
# Not atomic, like 0015: the new index is built CONCURRENTLY (no lock that stops submits;
# on a million runs about a minute, bench/search_isolation.py), then the old one dropped
# CONCURRENTLY. An expression index, not a generated column: no table rewrite, and the
# heartbeats and checkpoints that never write title or input stay HOT updates.

import django.contrib.postgres.indexes
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations

import runs.models.run

# SQL-standard bodies (RETURN, PostgreSQL 14+) are bound when created, so the index's function never
# depends on a search_path. IMMUTABLE holds: lower(), the regular expression's classes and substr()
# depend on the database's fixed encoding and collation only, as the trigram index's did.
# Every run has its tenant's bare key ("<tenant>:"), which a search with no three letters in a row
# asks for instead of an empty array (that would read the whole index, every tenant's entries).
# [:alnum:] splits the text into words, as the search's own "three letters or digits" does: a
# term's letters in a row are letters in a row in any text that contains the term.
CREATE_FUNCTIONS = """
CREATE FUNCTION runs_search_trigrams(tenant uuid, doc text) RETURNS text[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN ARRAY(
        SELECT tenant::text || ':' || substr(word, i, 3)
        FROM regexp_split_to_table(lower(doc), '[^[:alnum:]]+') AS word, generate_series(1, length(word) - 2) AS i
    );

CREATE FUNCTION runs_search_keys(tenant uuid, doc text) RETURNS text[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN ARRAY[tenant::text || ':'] || runs_search_trigrams(tenant, doc);

CREATE FUNCTION runs_search_query(tenant uuid, search text) RETURNS text[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN coalesce(nullif(runs_search_trigrams(tenant, search), '{}'), ARRAY[tenant::text || ':']);
"""

DROP_FUNCTIONS = """
DROP FUNCTION runs_search_query(uuid, text);
DROP FUNCTION runs_search_keys(uuid, text);
DROP FUNCTION runs_search_trigrams(uuid, text);
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('runs', '0019_webhook_fairness_and_receivers'),
    ]

    operations = [
        migrations.RunSQL(CREATE_FUNCTIONS, DROP_FUNCTIONS),
        AddIndexConcurrently(
            model_name='run',
            index=django.contrib.postgres.indexes.GinIndex(runs.models.run.SearchKeys(), name='run_search_keys_idx'),
        ),
        RemoveIndexConcurrently(
            model_name='run',
            name='run_search_trgm_idx',
        ),
    ]
