"""Who is told about a run: webhook endpoints and deliveries (the outbox's consumers), and live streams' watches."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models.records import Event
from runs.models.run import Run
from runs.models.tenancy import Tenant
from runs.states import WEBHOOK_EVENT_TYPES


def all_webhook_event_types() -> list[str]:
    return list(WEBHOOK_EVENT_TYPES)


class WebhookEndpoint(models.Model):
    """A URL a tenant's operator registered (in the admin) to be told about its runs."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    event_types = ArrayField(
        models.CharField(max_length=64, choices=[(t, t) for t in WEBHOOK_EVENT_TYPES]),
        default=all_webhook_event_types,
        help_text="The events this endpoint receives.",
    )
    enabled = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(
                fields=["tenant"], condition=Q(enabled=True), name="webhookendpoint_enabled_idx"
            )
        ]

    def __str__(self) -> str:
        return self.url


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # waiting for its next attempt (next_attempt_at)
    SENDING = "sending"  # claimed by a delivery loop until next_attempt_at (its lease)
    DELIVERED = "delivered"  # the receiver answered 2xx
    DEAD = "dead"  # given up: 24 h of failures, a refused address, or 410 Gone


LIVE_DELIVERY_STATUSES = (DeliveryStatus.PENDING, DeliveryStatus.SENDING)


class DeliveryFailure(models.TextChoices):
    """Why the last attempt failed, as its tenant is told: the full sentence (``last_error``) is the operators'.

    A tenant chooses the URL, so the sender's own words about it (which
    address a name resolved to, that a port refused or reset) would make
    webhooks a scanner of whatever the sender can reach.
    """

    NONE = "", "no failure"
    TIMEOUT = "timeout", "the receiver did not answer"
    CONNECT = "connect", "could not connect"
    REFUSED = "refused", "the address is not allowed"
    HTTP = "http", "the receiver answered with an error"


# The receiver a delivery goes to, as SQL over its ``url``: scheme, host and
# port as written (the checks at submit leave nothing else before the path).
RECEIVER_SQL = "lower(substring({url} from '^[^/?#]*//[^/?#]*'))"


class ReceiverOf(models.Func):
    """``RECEIVER_SQL`` of a URL expression, for the ORM (the admin's paused column)."""

    template = RECEIVER_SQL.format(url="%(expressions)s")
    output_field = models.CharField()


class WebhookDelivery(models.Model):
    """One Event to one URL, written in the same transaction as the Event; retried until delivered or dead.

    Its body is built from the Event and the run's fixed fields, so every
    attempt sends the same bytes under the same ``webhook_id``.
    """

    id = models.BigAutoField(primary_key=True)
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="webhook_deliveries", db_index=False
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    # NULL for the run's own callback_url.
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.SET_NULL, null=True, blank=True, related_name="deliveries"
    )
    url = models.TextField()
    event_type = models.CharField(max_length=64)
    # Standard Webhooks' webhook-id: the same for every attempt (and redelivery) of the Event.
    webhook_id = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    # When it may be claimed: the next attempt of a pending delivery, the
    # end of the lease of one being sent (a delivery loop that died).
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True, default="")
    # Why the last attempt did not deliver, in a sentence (for operators), and in a word (for the tenant).
    last_error = models.TextField(blank=True, default="")
    # db_default: the Event statements insert deliveries without naming it.
    failure = models.CharField(
        max_length=16, choices=DeliveryFailure.choices, blank=True, default="", db_default=""
    )
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=DeliveryStatus.values), name="webhookdelivery_status_valid"
            ),
        ]
        indexes = [
            # The delivery loop's claim, and only it: the tenants with live deliveries
            # (a skip scan), then each one's oldest due (runs.webhooks.deliveries).
            models.Index(
                fields=["tenant", "next_attempt_at"],
                condition=Q(status__in=LIVE_DELIVERY_STATUSES),
                name="webhookdelivery_tenant_due_idx",
            ),
            # A run's deliveries (run page, admin inline, deletion with the run).
            models.Index(fields=["run", "id"], name="webhookdelivery_run_idx"),
        ]
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.event_type} -> {self.url} ({self.status})"

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_DELIVERY_STATUSES


class WebhookReceiver(models.Model):
    """The health of one receiver (``RECEIVER_SQL`` of a URL) of one tenant: paused after too many silent attempts.

    Rows are written by the delivery loop on a failed attempt without an
    answer, so a receiver that always answers never has one. While
    ``paused_at`` is set its deliveries are not claimed (they wait, nothing
    is dropped); an operator resumes it in the admin, which makes them due.
    Per tenant, so that one tenant's failures never pause another's
    deliveries to the same host.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    receiver = models.CharField(max_length=2000, help_text="scheme://host[:port], as in the URLs")
    silent_attempts = models.PositiveIntegerField(
        default=0, help_text="attempts in a row without an answer"
    )
    last_error = models.TextField(blank=True, default="")
    last_failure_at = models.DateTimeField(null=True, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_reason = models.TextField(blank=True, default="")
    resumed_at = models.DateTimeField(null=True, blank=True)
    resumed_by = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        # Also the claim's look-up of paused receivers.
        constraints = [
            models.UniqueConstraint(fields=["tenant", "receiver"], name="webhookreceiver_unique")
        ]
        ordering = [models.F("paused_at").desc(nulls_last=True), "receiver"]

    def __str__(self) -> str:
        return f"{self.receiver} ({'paused' if self.paused_at else 'active'})"


class StreamWatch(models.Model):
    """A run some web process is streaming live (``runs.streams``); UNLOGGED, by migration.

    An Event statement sends its NOTIFY only for a watched run: a NOTIFY
    makes every committing transaction that sent one wait for the others
    (a lock held through the commit), which cut the commit rate of ten
    connections by half or more (bench/notify_cost.py): a price every run
    would pay for the few somebody watches.
    """

    pk = models.CompositePrimaryKey("run_id", "server")
    run_id = models.UUIDField()
    server = models.UUIDField()  # the web process (runs.streams.hub)
    seen_at = models.DateTimeField(
        default=timezone.now
    )  # refreshed while it watches; old rows are swept

    def __str__(self) -> str:
        return f"{self.run_id} watched by {self.server}"
