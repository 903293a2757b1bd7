from django.db import migrations

# The tables every run writes to, besides runs_run (0002): vacuumed and
# analysed after a small share of them changed, not PostgreSQL's 20 %, so
# that retention's batched deletes (reap) and the steady stream of inserts
# are cleaned up while the tables are still small, and the planner's row
# estimates (which the admin and /metrics read instead of count(*)) stay
# close. A higher cost limit lets vacuum keep pace with a worker fleet.
HOT_TABLES = ["runs_step", "runs_event", "runs_stepattempt", "runs_webhookdelivery", "runs_message"]
SETTINGS = (
    "autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,"
    " autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_vacuum_cost_limit = 1000"
)
NAMES = (
    "autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor,"
    " autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_cost_limit"
)


class Migration(migrations.Migration):
    dependencies = [("runs", "0015_run_outcome_summary_title_search")]

    operations = [
        *(
            migrations.RunSQL(f"ALTER TABLE {table} SET ({SETTINGS})", f"ALTER TABLE {table} RESET ({NAMES})")
            for table in HOT_TABLES
        ),
        migrations.RunSQL(
            "ALTER TABLE runs_run SET (autovacuum_vacuum_insert_scale_factor = 0.05)",
            "ALTER TABLE runs_run RESET (autovacuum_vacuum_insert_scale_factor)",
        ),
    ]
