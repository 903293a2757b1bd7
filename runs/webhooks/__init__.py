"""Signed webhooks: where deliveries may go, and how they are signed."""
