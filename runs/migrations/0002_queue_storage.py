from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial")]

    operations = [
        # Lease tokens: new on every claim, never reused (a sequence never goes back).
        migrations.RunSQL(
            "CREATE SEQUENCE runs_lease_token_seq AS bigint",
            "DROP SEQUENCE runs_lease_token_seq",
        ),
        # Heartbeats and checkpoints rewrite run rows in place: free space on
        # the page keeps those updates HOT, and the hot table is vacuumed
        # early rather than after 20 % of it is dead.
        migrations.RunSQL(
            "ALTER TABLE runs_run SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02,"
            " autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_limit = 1000)",
            "ALTER TABLE runs_run RESET (fillfactor, autovacuum_vacuum_scale_factor,"
            " autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_limit)",
        ),
        migrations.RunSQL(
            "ALTER TABLE runs_tenant SET (fillfactor = 50)",
            "ALTER TABLE runs_tenant RESET (fillfactor)",
        ),
        migrations.RunSQL(
            "ALTER TABLE runs_step SET (fillfactor = 90)",
            "ALTER TABLE runs_step RESET (fillfactor)",
        ),
    ]
