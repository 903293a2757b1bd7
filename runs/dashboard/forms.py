"""Dashboard forms: the submit form built from a kind's JSON schema, the run page's action forms, the filters.

The submit form is generated on the server from ``kind.input_json_schema()``
(pydantic's JSON schema): strings, integers and numbers with their bounds,
booleans, enums, optional (``X | None``) fields; anything else (arrays,
objects) is a JSON text box. The Django fields give quick, familiar errors
and HTML attributes (``required``, ``min``, ``max``); the kind's own
validation in ``services.submit`` stays the authority, and its errors are
mapped back onto the fields by ``add_input_errors``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_UP, Decimal
from typing import Any, cast

from django import forms
from django.forms.fields import InvalidJSONInput

from runs.dashboard.presenters import money, status_label
from runs.dashboard.selectors import id_range
from runs.limits import MAX_DEADLINE_SECONDS
from runs.models import MONEY, Run, RunStatus
from runs.states import ThreadPolicy, ThreadStatus
from runs.text import MAX_DEPTH, find_unstorable
from runs.threads import MESSAGE_MAX_CHARS

# Strings longer than this get a text area instead of a one-line input.
LONG_TEXT = 200


class StorableJSONField(forms.JSONField):
    """A JSON text box that refuses, as a form error, what PostgreSQL cannot store (see ``runs.text``).

    Text fields need no such care: Django's ``CharField`` already refuses
    NUL characters, and a form post cannot carry a lone surrogate (its
    UTF-8 is decoded with replacement). Inside JSON text both arrive as
    escapes, with NaN, Infinity and nesting as deep as the parser allows.
    """

    default_error_messages = {
        "too_deep": f"This JSON nests too deeply: at most {MAX_DEPTH} levels of lists and objects.",
    }

    def to_python(self, value: Any) -> Any:
        try:
            converted = super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(self.error_messages["too_deep"], code="too_deep") from None
        if problem := find_unstorable(converted, where=""):
            raise forms.ValidationError(
                "This JSON cannot be stored: %(problem)s.",
                code="unstorable",
                params={"problem": problem.lstrip(".: ")},
            )
        return converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        # Shown again as typed, escapes and all, when it cannot be parsed or stored
        # (Django's own version would recurse too deep, or write a lone surrogate into the page).
        if isinstance(data, str):
            try:
                if find_unstorable(json.loads(data)) is not None:
                    return InvalidJSONInput(data)
            except (ValueError, RecursionError):
                return InvalidJSONInput(data)
        return super().bound_data(data, initial)


@dataclass(frozen=True)
class FieldSpec:
    kind: str  # "string" | "integer" | "number" | "boolean" | "enum" | "json"
    required: bool
    nullable: bool


def _resolve(schema: dict, prop: dict) -> tuple[dict, bool]:
    """Follow a local $ref and unwrap ``anyOf: [X, null]``; return (property, nullable)."""
    nullable = False
    variants = prop.get("anyOf") or prop.get("oneOf")
    if variants:
        others = [v for v in variants if v.get("type") != "null"]
        nullable = len(others) < len(variants)
        if len(others) == 1:
            outer = {k: v for k, v in prop.items() if k not in ("anyOf", "oneOf")}
            prop = {**others[0], **outer}
    ref = prop.get("$ref", "")
    if ref.startswith("#/$defs/"):
        target = schema.get("$defs", {}).get(ref.removeprefix("#/$defs/"), {})
        outer = {k: v for k, v in prop.items() if k != "$ref"}
        prop = {**target, **outer}
    return prop, nullable


# How an enum's chosen option, a string in the form, becomes a value of the schema's type again.
COERCE: dict[str, Callable[[Any], Any]] = {"integer": int, "number": float}


def _field(prop: dict, required: bool, nullable: bool) -> tuple[forms.Field, str]:
    common: dict[str, Any] = {
        "required": required,
        "label": prop.get("title"),
        "help_text": prop.get("description", ""),
    }
    if "default" in prop and prop["default"] is not None:
        common["initial"] = prop["default"]
    kind = prop.get("type", "")
    choices = prop.get("enum") or ([prop["const"]] if "const" in prop else None)
    if choices:
        coerce = COERCE.get(kind, str)
        options = [(c, str(c)) for c in choices]
        if not required and prop.get("default") is None:
            options = [("", "—"), *options]
        return forms.TypedChoiceField(
            choices=options, coerce=coerce, empty_value=None, **common
        ), "enum"
    if kind == "string":
        long = prop.get("maxLength") is None or prop["maxLength"] > LONG_TEXT
        widget = forms.Textarea(attrs={"rows": 3}) if long else None
        return forms.CharField(
            min_length=prop.get("minLength"),
            max_length=prop.get("maxLength"),
            widget=widget,
            **common,
        ), "string"
    if kind == "integer":
        low = prop.get("minimum", _plus(prop.get("exclusiveMinimum"), 1))
        high = prop.get("maximum", _plus(prop.get("exclusiveMaximum"), -1))
        return forms.IntegerField(min_value=low, max_value=high, **common), "integer"
    if kind == "number":
        return forms.FloatField(
            min_value=prop.get("minimum"), max_value=prop.get("maximum"), **common
        ), "number"
    if kind == "boolean":
        common["required"] = False  # an unticked box is False, not missing
        return forms.BooleanField(**common), "boolean"
    common["help_text"] = " ".join(filter(None, [common["help_text"], "JSON."]))
    return StorableJSONField(widget=forms.Textarea(attrs={"rows": 3}), **common), "json"


def _plus(value: float | None, delta: int) -> float | None:
    return None if value is None else value + delta


class KindInputForm(forms.Form):
    """The input of one kind, one field per top-level property of its JSON schema."""

    WHOLE_INPUT = "input"  # the single field of a kind without a schema

    def __init__(self, schema: dict, *args: Any, **kwargs: Any):
        kwargs.setdefault("prefix", "input")
        super().__init__(*args, **kwargs)
        self.specs: dict[str, FieldSpec] = {}
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        if not properties:
            self.fields[self.WHOLE_INPUT] = StorableJSONField(
                label="Input",
                initial={},
                help_text="A JSON object.",
                widget=forms.Textarea(attrs={"rows": 6}),
            )
            self.specs[self.WHOLE_INPUT] = FieldSpec("json", True, False)
            return
        for name, raw in properties.items():
            prop, nullable = _resolve(schema, raw)
            is_required = name in required
            # A required but nullable field may be left blank: it is sent as null.
            field, kind = _field(prop, is_required and not nullable, nullable)
            self.fields[name] = field
            self.specs[name] = FieldSpec(kind, is_required, nullable)

    def input_data(self) -> Any:
        """The run's input from the cleaned fields; blank optional fields are left out so defaults apply."""
        if self.WHOLE_INPUT in self.specs and len(self.specs) == 1:
            return self.cleaned_data[self.WHOLE_INPUT]
        data: dict[str, Any] = {}
        for name, spec in self.specs.items():
            value = self.cleaned_data.get(name)
            if spec.kind == "boolean":
                data[name] = bool(value)
            elif value is not None and value != "":
                data[name] = value
            elif spec.required and spec.nullable:
                data[name] = None
        return data

    def add_input_errors(self, message: str, errors: list[dict]) -> None:
        """Put the kind's validation errors next to the fields they name; the rest above the form."""
        placed = False
        for error in errors:
            loc = [str(part) for part in error.get("loc") or []]
            if loc and loc[0] in self.fields:
                suffix = f" ({'.'.join(loc[1:])})" if len(loc) > 1 else ""
                self.add_error(loc[0], f"{error.get('msg', 'invalid value')}{suffix}")
                placed = True
            elif not loc and self.WHOLE_INPUT in self.fields:
                self.add_error(self.WHOLE_INPUT, error.get("msg", message))
                placed = True
        if not placed:
            self.add_error(None, message)


class DecisionForm(forms.Form):
    comment = forms.CharField(
        max_length=5000,
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Optional; the agent receives it with your decision.",
    )
    # The pending approval's step: a decision on a card that went stale is refused, not applied to the next one.
    step = forms.IntegerField(min_value=1, required=False, widget=forms.HiddenInput)


class MessageForm(forms.Form):
    text = forms.CharField(
        max_length=20000, widget=forms.Textarea(attrs={"rows": 2}), label="Message"
    )


class ResolveForm(forms.Form):
    ACTIONS = [
        ("done", "It happened: mark the step done"),
        ("retry", "It did not happen: run the step again"),
        ("fail", "Fail the run"),
    ]
    # A rollback that stopped on a compensation may also skip it (the run page offers it there only).
    action = forms.ChoiceField(choices=[*ACTIONS, ("skip", "Skip the compensation")])
    output = StorableJSONField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="Step output (JSON)",
        help_text="Only for “it happened”: what the step would have returned.",
    )


class RetryForm(forms.Form):
    from_step = forms.IntegerField(
        min_value=1,
        required=False,
        label="From step",
        help_text="Run this step and the later ones again; empty: continue after the last finished step.",
    )
    deadline_seconds = forms.IntegerField(
        min_value=1, max_value=MAX_DEADLINE_SECONDS, required=False, label="New deadline (seconds)"
    )
    # The column's precision: a larger ceiling is a form error, not a database error.
    cost_ceiling_cents = forms.DecimalField(
        min_value=0,
        max_digits=MONEY["max_digits"],
        decimal_places=MONEY["decimal_places"],
        required=False,
        label="New cost ceiling (¢)",
    )

    @classmethod
    def for_run(cls, run: Run) -> RetryForm:
        """A blank form whose new-bound field suggests twice what the run used, and says what it used."""
        form = cls(initial={"deadline_seconds": max(2 * run.deadline_seconds, 60)})
        spent = run.cost_cents + run.children_cost_cents
        form.fields["deadline_seconds"].help_text = (
            f"It ran {run.running_seconds:.0f} s of its {run.deadline_seconds} s deadline; the new deadline "
            "counts the running time so far."
        )
        ceiling = run.cost_ceiling_cents or Decimal(0)
        suggested = max(2 * ceiling, 2 * spent, Decimal(1)).quantize(Decimal("0.01"), ROUND_UP)
        form.initial["cost_ceiling_cents"] = suggested
        form.fields["cost_ceiling_cents"].help_text = (
            f"It spent {money(spent)} of its {money(ceiling)} ceiling; the new ceiling counts the cost so far "
            "and must be larger than it."
        )
        return form


class RunFilterForm(forms.Form):
    status = forms.ChoiceField(
        required=False,
        choices=[("", "Any status")] + [(s, status_label(s)) for s in RunStatus.values],
    )
    kind = forms.ChoiceField(required=False)
    q = forms.CharField(required=False, max_length=200, label="Search")
    cursor = forms.CharField(required=False, widget=forms.HiddenInput)
    # The runs one schedule made (its link on the Schedules page).
    schedule = forms.UUIDField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args: Any, kinds: list[str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["kind"]).choices = [("", "Any kind")] + [
            (k, k) for k in kinds
        ]
        self.fields["q"].widget.attrs.update(
            {"placeholder": "words of its title or input, or a run id", "autocomplete": "off"}
        )
        self.fields["q"].widget.input_type = "search"

    def clean_q(self) -> str:
        q = " ".join(self.cleaned_data["q"].split())
        if problem := find_unstorable(q, where="search"):
            raise forms.ValidationError(problem)
        return q

    @property
    def id_search(self) -> tuple | None:
        """The id range a search names, the start of a run id: hex digits (and dashes), with a digit
        among them or 8 and more of them; "cafe" or "decade" are words, "3f2a" is an id."""
        q = self.cleaned_data.get("q", "")
        digits = q.replace("-", "")
        if len(digits) < 8 and not any(c.isdigit() for c in digits):
            return None
        return id_range(q)


# Conversations (runs.dashboard.threads)


class ThreadForm(forms.Form):
    """The New thread form: ``runs.threads.create_thread`` checks it all again and is the authority."""

    kind = forms.ChoiceField(
        label="Agent", help_text="The kind that plays every turn of the conversation."
    )
    title = forms.CharField(
        max_length=200, required=False, help_text="Optional; the list shows the agent's name."
    )
    policy = forms.ChoiceField(
        label="A message sent while a turn is live",
        initial=ThreadPolicy.INTERLEAVE.value,
        help_text="What the agent does when you write again before it has answered.",
    )
    message = forms.CharField(
        max_length=MESSAGE_MAX_CHARS,
        required=False,
        label="First message",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="It mentions the agent: turn 1 starts at once. Leave it empty to open the thread asleep.",
    )
    cost_ceiling_cents = forms.DecimalField(
        min_value=0,
        max_digits=MONEY["max_digits"],
        decimal_places=MONEY["decimal_places"],
        required=False,
        label="Cost ceiling (¢)",
        help_text="Optional: what all its turns together may spend.",
    )

    def __init__(self, *args: Any, kinds: list[tuple[str, str]], policies: list, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["kind"]).choices = kinds
        cast(forms.ChoiceField, self.fields["policy"]).choices = policies


class ThreadMessageForm(forms.Form):
    text = forms.CharField(
        max_length=MESSAGE_MAX_CHARS,
        label="Message",
        widget=forms.Textarea(attrs={"rows": 3}),
        error_messages={"required": "Write something first: an empty message is not sent."},
    )
    mention = forms.BooleanField(required=False, initial=True, label="Mention the agent")


class CloseThreadForm(forms.Form):
    summary = forms.CharField(
        max_length=300,
        required=False,
        label="Closing note",
        help_text="Optional; kept with the thread.",
    )


class ThreadFilterForm(forms.Form):
    status = forms.ChoiceField(
        required=False,
        choices=[("", "Any status")] + [(status.value, status.label) for status in ThreadStatus],
    )
    cursor = forms.CharField(required=False, widget=forms.HiddenInput)
