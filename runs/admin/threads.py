"""Conversations in the operations console: threads, their turns and their conversation, and closing them."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from runs import threads
from runs.admin.common import (
    ReadOnlyInline,
    json_block,
    money_column,
    operator,
    timestamp,
    timestamp_column,
)
from runs.exceptions import InvalidTransition
from runs.models import Message, Run, Thread

LINES_SHOWN = 100


class TurnInline(ReadOnlyInline):
    model = Run
    fk_name = "thread"
    fields = ("turn", "run_link", "status", "cost", "created", "finished")
    readonly_fields = fields
    ordering = ("turn",)
    verbose_name = "turn"
    verbose_name_plural = "turns"

    cost = money_column("cost_cents", "cost")
    created = timestamp_column("created_at", "created")
    finished = timestamp_column("finished_at", "finished")

    @admin.display(description="run")
    def run_link(self, obj: Run) -> str:
        return format_html(
            '<a href="{}">{}</a>', reverse("admin:runs_run_change", args=[obj.pk]), obj.pk
        )


@admin.register(Thread)
class ThreadAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "title",
        "kind",
        "tenant",
        "status",
        "policy",
        "turns",
        "live_turn",
        "cost",
        "updated",
    )
    list_filter = ("status", "policy", "kind")
    search_fields = ("=id", "title")
    list_select_related = ("tenant",)
    ordering = ("-created_at", "-id")
    readonly_fields = (
        "id",
        "tenant",
        "kind",
        "title",
        "status",
        "policy",
        "state_json",
        "cost",
        "ceiling",
        "turns",
        "live_turn",
        "summary",
        "conversation",
        "created",
        "updated",
        "closed",
    )
    fields = readonly_fields
    inlines = (TurnInline,)
    actions = ("close_threads",)

    cost = money_column("cost_cents", "cost")
    ceiling = money_column("cost_ceiling_cents", "cost ceiling")
    created = timestamp_column("created_at", "created")
    updated = timestamp_column("updated_at", "updated")
    closed = timestamp_column("closed_at", "closed")

    @admin.display(description=f"conversation (the last {LINES_SHOWN} lines)")
    def conversation(self, obj: Thread):
        lines = list(Message.objects.filter(thread=obj).order_by("-id")[:LINES_SHOWN])
        lines.reverse()
        if not lines:
            return "-"
        return format_html(
            "<ol class='thread-lines'>{}</ol>",
            format_html_join(
                "",
                "<li><strong>{}</strong> <small>{}{}</small><br>{}</li>",
                (
                    (
                        "agent"
                        if m.author_type == threads.AGENT
                        else f"{m.author_type}:{m.author_id}",
                        timestamp(m.created_at),
                        " (mention)" if m.mention else "",
                        m.text[:2000],
                    )
                    for m in lines
                ),
            ),
        )

    @admin.display(description="state")
    def state_json(self, obj: Thread):
        return json_block(obj.state)

    # What a thread holds is written by its turns and by people through the services only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Thread | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Thread | None = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Thread | None = None) -> bool:
        return request.user.has_perm("runs.view_run")

    @admin.action(description="Close the selected threads (their live turns are cancelled)")
    def close_threads(self, request: HttpRequest, queryset: QuerySet[Thread]) -> None:
        if not request.user.has_perm("runs.cancel_run"):
            self.message_user(
                request, "Closing a thread needs the permission to cancel runs.", messages.ERROR
            )
            return
        closed = skipped = 0
        for thread in queryset:
            try:
                threads.close_thread(
                    thread=thread, actor=operator(request), summary="closed by an operator"
                )
                closed += 1
            except InvalidTransition:
                skipped += 1
        self.message_user(
            request,
            f"Closed {closed} thread{'s' if closed != 1 else ''}"
            + (f"; {skipped} already closed" if skipped else "")
            + ".",
            messages.SUCCESS if closed else messages.WARNING,
        )
