"""Prometheus metrics (``GET /metrics``): the database's state at scrape time and every process's counts.

``process`` holds what this process counts, ``publish`` carries it to the
database, ``scrape`` reads it all back for a scrape, ``views`` serves it.
"""
