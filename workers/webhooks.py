"""The webhook delivery loop: claims due deliveries, signs and sends each on a thread, records the outcome.

Run it as its own process (``manage.py deliverwebhooks``), one or more:
deliveries are claimed with SKIP LOCKED, so loops never send the same
attempt twice, and a loop that dies leaves its claims to come due again
after their lease. A send holds no database connection: the claim and the
record are one statement each, before and after.

The send slots are shared among tenants: the loop tells each claim how
many sends each tenant has in flight, and the claim gives a tenant no more
than its share (``runs.webhooks.deliveries.claim``). Together with the
bound on a whole attempt (``RUNS_WEBHOOK_TIMEOUT_SECONDS``) and the pausing
of receivers that keep not answering, one tenant's hanging receiver delays
another tenant's delivery by a poll, not by a timeout per slot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from uuid import UUID

from django.conf import settings

from runs.db import release_connection, with_retries
from runs.webhooks import deliveries, receivers
from runs.webhooks.deliveries import DeliveryJob
from runs.webhooks.signing import signature
from workers import webhook_http

logger = logging.getLogger(__name__)

USER_AGENT = "agentruns-webhooks/1"
PARK_EVERY_SECONDS = 30.0


class DeliveryLoop:
    def __init__(self, *, concurrency: int = 8, poll: float = 0.5, lease: float | None = None):
        self.concurrency = max(1, concurrency)
        self.poll = poll
        timeout = settings.RUNS_WEBHOOK_TIMEOUT_SECONDS
        # Longer than any send can take (the whole attempt is bounded by the timeout), or a
        # slow send would be claimed again while it is still going.
        self.lease = lease or max(60.0, 4 * timeout)
        self.stopping = threading.Event()

    def run(self, *, once: bool = False) -> int:
        """Until stopped (``once``: until nothing is due). Returns how many attempts were made."""
        attempts = 0
        in_flight: dict[Future, UUID] = {}
        parked_at = 0.0
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="webhook") as pool:
            while not self.stopping.is_set():
                if time.monotonic() - parked_at >= PARK_EVERY_SECONDS:
                    self._park()
                    parked_at = time.monotonic()
                free = self.concurrency - len(in_flight)
                jobs = self._claim(free, Counter(in_flight.values())) if free else []
                for job in jobs:
                    in_flight[pool.submit(self.deliver, job)] = job.tenant_id
                attempts += len(jobs)
                if once and not jobs and not in_flight:
                    break
                if in_flight:
                    done, _ = wait(
                        in_flight, timeout=self.poll if not jobs else 0, return_when=FIRST_COMPLETED
                    )
                    for future in done:
                        del in_flight[future]
                elif not jobs:
                    self.stopping.wait(self.poll)
            wait(in_flight)  # a stop lets the sends under way finish and be recorded
        return attempts

    def _park(self) -> None:
        """Park what came for paused receivers since the last look, so that claims do not read past it."""
        try:
            with_retries(receivers.park, what="park deliveries of paused receivers")
        except Exception:
            logger.exception("parking deliveries of paused webhook receivers failed")
        finally:
            release_connection()

    def _claim(self, free: int, in_flight: Counter[UUID]) -> list[DeliveryJob]:
        try:
            return with_retries(
                lambda: deliveries.claim(
                    batch=free,
                    lease_seconds=self.lease,
                    slots=self.concurrency,
                    in_flight=dict(in_flight),
                ),
                what="claim deliveries",
            )
        except Exception:
            logger.exception("claiming webhook deliveries failed")
            self.stopping.wait(self.poll)
            return []
        finally:
            release_connection()

    def deliver(self, job: DeliveryJob) -> str | None:
        """One attempt of one delivery; returns the status recorded (None if the claim was lost meanwhile)."""
        timestamp = datetime.now(UTC)
        headers = {
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "webhook-id": job.webhook_id,
            "webhook-timestamp": str(int(timestamp.timestamp())),
            "webhook-signature": signature(
                secrets_=job.secrets, webhook_id=job.webhook_id, timestamp=timestamp, body=job.body
            ),
        }
        sent = webhook_http.send(
            job.url,
            body=job.body.encode(),
            headers=headers,
            timeout=settings.RUNS_WEBHOOK_TIMEOUT_SECONDS,
            connect_timeout=settings.RUNS_WEBHOOK_CONNECT_TIMEOUT_SECONDS,
        )
        try:
            status = with_retries(
                lambda: deliveries.record(
                    job,
                    delivered=sent.delivered,
                    permanent=sent.permanent,
                    code=sent.status,
                    body=sent.body,
                    error=sent.error,
                    failure=sent.failure,
                    unanswered=sent.unanswered,
                ),
                what="record a delivery",
            )
        finally:
            release_connection()
        level = logging.INFO if sent.delivered else logging.WARNING
        logger.log(
            level,
            "webhook %s %s to %s (attempt %s): %s",
            job.event_type,
            job.webhook_id,
            job.url,
            job.attempt,
            status if sent.delivered else f"{status}: {sent.error}",
        )
        return status
