"""The data model, one module per part: tenancy, the run, what it records, the fleet."""

from runs.models.fleet import MetricSnapshot, Worker
from runs.models.notifications import (
    RECEIVER_SQL,
    WEBHOOK_EVENT_TYPES,
    DeliveryFailure,
    DeliveryStatus,
    ReceiverOf,
    StreamWatch,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookReceiver,
)
from runs.models.records import Artifact, Event, Message, Step, StepAttempt
from runs.models.run import Run, RunQuerySet, default_expires_at
from runs.models.schedules import CatchUp, Overlap, Schedule
from runs.models.tenancy import (
    MONEY,
    ApiKey,
    KindState,
    Membership,
    Pausable,
    Queue,
    Tenant,
    TenantDailyCost,
)
from runs.models.threads import Thread
from runs.states import (
    LIVE_STATUSES,
    TERMINAL_STATUSES,
    Compensation,
    ErrorKind,
    RunStatus,
    StepKind,
    StepStatus,
    ThreadPolicy,
    ThreadStatus,
)

__all__ = [
    "LIVE_STATUSES",
    "MONEY",
    "TERMINAL_STATUSES",
    "ApiKey",
    "Compensation",
    "Artifact",
    "ErrorKind",
    "Event",
    "KindState",
    "Membership",
    "Message",
    "MetricSnapshot",
    "Pausable",
    "Queue",
    "CatchUp",
    "Overlap",
    "Schedule",
    "Run",
    "RunQuerySet",
    "RunStatus",
    "Step",
    "StepAttempt",
    "StepKind",
    "StepStatus",
    "Tenant",
    "Thread",
    "ThreadPolicy",
    "ThreadStatus",
    "TenantDailyCost",
    "Worker",
    "default_expires_at",
    "WEBHOOK_EVENT_TYPES",
    "DeliveryStatus",
    "StreamWatch",
    "WebhookDelivery",
    "WebhookEndpoint",
    "RECEIVER_SQL",
    "DeliveryFailure",
    "ReceiverOf",
    "WebhookReceiver",
]
