"""Pieces shared by the ModelAdmins of the operations console."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from math import ceil
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import ActionLocation
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.dateformat import format as format_date
from django.utils.html import format_html

from runs.dashboard.presenters import money
from runs.exceptions import InvalidRunInput, InvalidTransition
from runs.services import Actor


def operator(request: HttpRequest) -> Actor:
    """The person acting in the admin, as recorded on the run's Event."""
    return Actor(type="user", id=str(request.user.pk))


# The run's own page prefixes its action field; an action's intermediate page posts back the same name.
CHANGE_FORM_ACTION = f"{ActionLocation.CHANGE_FORM.value}-action"


def action_field(request: HttpRequest) -> str:
    """The name of the action field the request came with (the run list's or the run page's)."""
    return CHANGE_FORM_ACTION if CHANGE_FORM_ACTION in request.POST else "action"


def worker_lease() -> timedelta:
    """A worker silent for longer than a lease is dead: its runs' leases have expired too."""
    return timedelta(seconds=settings.RUNS_LEASE_SECONDS)


def json_block(value: Any):
    """Pretty-printed JSON in a <pre>; model and tool output is untrusted, so it is escaped."""
    if value is None:
        return "—"
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    return format_html('<pre class="runs-json">{}</pre>', text)


# The admin's own datetime format has no seconds; operators compare events a second apart.
DATE_FORMAT, TIME_FORMAT = "Y-m-d", "H:i:s"


def timestamp(value):
    """A datetime to the second, in the current time zone (None: the admin shows its empty value)."""
    if value is None:
        return None
    moment = timezone.localtime(value)
    # Two parts a narrow column may put on two lines, never breaking the date at its hyphens.
    return format_html(
        '<time datetime="{}"><span>{}</span> <span>{}</span></time>',
        moment.isoformat(),
        format_date(moment, DATE_FORMAT),
        format_date(moment, TIME_FORMAT),
    )


def timestamp_column(field: str, description: str):
    """A list or read-only field showing the datetime ``field`` with seconds, sorted by it."""

    @admin.display(description=description, ordering=field)
    def column(self, obj):
        return timestamp(getattr(obj, field))

    return column


def money_column(field: str, description: str):
    """A list or read-only field showing the cents in ``field`` as people read money ("2.35¢", "$12.40")."""

    @admin.display(description=description, ordering=field)
    def column(self, obj) -> str | None:
        cents = getattr(obj, field)
        return None if cents is None else money(cents)

    return column


class EstimatedCountPaginator(Paginator):
    """Counts with the planner's estimate, so a page of a million-row table never runs count(*).

    EXPLAIN gives the estimated rows of the (filtered) query in about a
    millisecond. Small results are counted exactly, but never past
    ``exact_up_to`` rows, so a wrong estimate cannot turn into a full scan.
    ``estimated`` tells the template to say "about". Pages stop at
    ``max_pages``, so no link leads to an OFFSET of a million rows.
    """

    # What the admin's changelist pages: a QuerySet, whose rows the planner can estimate.
    object_list: QuerySet[Any]
    exact_up_to = 1000
    # A page costs its OFFSET: deeper than this, narrow the list with the filters instead.
    max_pages = 200

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.estimated = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list.order_by()
        estimate = planner_rows(queryset)
        if estimate > self.exact_up_to:
            self.estimated = True
            return estimate
        exact = queryset[: self.exact_up_to + 1].count()
        if exact > self.exact_up_to:
            self.estimated = True
            return max(estimate, exact)
        return exact

    @cached_property
    def num_pages(self) -> int:
        if self.count == 0 and not self.allow_empty_first_page:
            return 0
        return min(ceil(max(1, self.count - self.orphans) / self.per_page), self.max_pages)


def planner_rows(queryset) -> int:
    plan = json.loads(queryset.explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


class ReadOnlyInline(admin.TabularInline):
    """Rows written by the engine: shown to whoever may view the run, never edited here."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("runs.view_run")


@dataclass
class Tally:
    """What a bulk action did: how many runs changed, and why the others were skipped."""

    done: int = 0
    later: int = 0  # accepted, carried out by the worker at the run's next step boundary
    skipped: Counter = field(default_factory=Counter)

    def report(
        self, modeladmin: admin.ModelAdmin, request: HttpRequest, verb: str, later: str = ""
    ) -> None:
        if self.done:
            noun = "run" if self.done == 1 else "runs"
            detail = f" ({self.later} {later})" if self.later and later else ""
            modeladmin.message_user(
                request, f"{verb} {self.done} {noun}{detail}.", messages.SUCCESS
            )
        for reason, count in self.skipped.most_common(5):
            noun = "run" if count == 1 else "runs"
            modeladmin.message_user(request, f"Skipped {count} {noun}: {reason}.", messages.WARNING)
        if not self.done and not self.skipped:
            modeladmin.message_user(request, "No run matched.", messages.WARNING)

    def skip(self, exc: Exception) -> None:
        self.skipped[str(exc)] += 1


DOMAIN_ERRORS = (InvalidTransition, InvalidRunInput)
