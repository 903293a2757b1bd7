"""Signed webhooks (DESIGN.md §8): who is told, how it is signed, where it may go, and each delivery's life.

``targets`` is the SSRF guard; ``signing`` the tenants' Standard Webhooks
secrets; ``deliveries`` the statements of the delivery loop
(``workers.webhooks``) and redelivery. The rows themselves are written by
the Event statements (``runs.events``), in the transaction of the Event.
"""
