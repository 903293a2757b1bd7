"""Signed webhooks (docs/how-to/webhooks.md): who is told, how it is signed, where it may go, and each delivery's life.

``targets`` is the SSRF guard (and the ports public hosts may use);
``signing`` the tenants' Standard Webhooks secrets; ``deliveries`` the
statements of the delivery loop (``workers.webhooks``: the fair claim, the
record) and redelivery; ``receivers`` the pausing and resuming of receivers
that keep not answering. The rows themselves are written by
the Event statements (``runs.events``), in the transaction of the Event.
"""
