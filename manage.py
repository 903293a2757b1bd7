#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if sys.argv[1:2] == ["up"]:
        # `up` is the development stack (and `make run`): DEBUG on, so the development key serves.
        os.environ.setdefault("DEBUG", "1")
    # manage.py is an entry point: without DATABASE_URL it starts (or joins)
    # the embedded PostgreSQL under .data/ and hands the URL to children.
    from config.dbserver import ensure_database_url

    ensure_database_url()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
