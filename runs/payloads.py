"""Large payloads: a value over ``RUNS_PAYLOAD_INLINE_BYTES`` of JSON is stored as an Artifact and referenced.

The one rule for every JSON value the engine stores for a run: its input
(``runs.services.submit``), a step's input and output (``runs.engine.steps``,
at the checkpoint) and its result (at its exit). A value whose JSON text is
at most ``RUNS_PAYLOAD_INLINE_BYTES`` (256 KiB) is stored inline, as
always; a larger one is written to Django's storage as an ``Artifact`` of
the run (``application/json``, with its size, sha256 and a summary), and
the column holds a reference instead::

    {"$artifact": 41, "bytes": 1048602, "sha256": "9f2c...", "summary": "JSON object with keys ...",
     "url": "/api/runs/<run id>/artifacts/41"}

``resolve`` turns a reference back into the very value (a replayed step
returns it, the agent receives its input from it), and only for a run of
the artifact's own tenant: a reference never reads another tenant's
artifact. A value the client sent that merely looks like a reference is
stored as an artifact too, whatever its size, so that every reference
found inline is one this module wrote.

``RUNS_PAYLOAD_MAX_BYTES`` (64 MiB) is the hard cap: past it a value is
refused (``PayloadTooLarge``) before anything is written. A step output
past it fails the step ``fatal``, a result fails the run, an input is a 413
at the API. A step's input, which only the audit trail reads, is replaced
by a note instead.

The API, the dashboard, the run's Events and its webhooks show a reference
as it is stored; its ``url`` downloads the value (the artifact endpoint of
the run that stored it, a fork's origin for the steps a fork copied). So a
run list, a poll or a webhook never carries megabytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, TypeGuard
from uuid import UUID

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.core.signals import setting_changed
from django.dispatch import receiver

from runs.db import dumps, loads
from runs.exceptions import PayloadTooLarge

if TYPE_CHECKING:
    from runs.models import Artifact

REFERENCE = "$artifact"
_QUOTED_REFERENCE = f'"{REFERENCE}"'  # as it appears in JSON text
CONTENT_TYPE = "application/json"
_REFERENCE_KEYS = frozenset({REFERENCE, "bytes", "sha256", "summary", "url"})


class MissingPayload(LookupError):
    """A reference whose artifact is not the run tenant's, is gone, or no longer holds what it held."""


def _artifact_model() -> type[Artifact]:
    # The engine's statements (runs.engine) are imported while the apps load
    # (the workers app imports them): the model only once a value needs it.
    from runs.models import Artifact

    return Artifact


def inline_limit() -> int:
    return _limits()[0]


def max_bytes() -> int:
    return _limits()[1]


@cache
def _limits() -> tuple[int, int, int]:
    """The two settings, and the length of text that is within both whatever its characters.

    Read once (a checkpoint asks for them twice per step); read again after a
    test's ``override_settings`` changes either (``_forget_limits``).
    """
    inline, cap = settings.RUNS_PAYLOAD_INLINE_BYTES, settings.RUNS_PAYLOAD_MAX_BYTES
    return inline, cap, min(inline, cap) // 4  # UTF-8 spends at most 4 bytes on a character


@receiver(setting_changed)
def _forget_limits(*, setting: str, **kwargs: Any) -> None:
    if setting in ("RUNS_PAYLOAD_INLINE_BYTES", "RUNS_PAYLOAD_MAX_BYTES"):
        _limits.cache_clear()


def is_reference(value: Any) -> TypeGuard[dict[str, Any]]:
    """True for the inline stand-in of an artifact-backed value (the shape this module writes)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get(REFERENCE), int)
        and not isinstance(value.get(REFERENCE), bool)
        and isinstance(value.get("sha256"), str)
        and value.keys() <= _REFERENCE_KEYS
    )


def _looks_like_reference(text: str) -> bool:
    # Cheap first: only a text holding the key can be a dict with it at the top.
    return _QUOTED_REFERENCE in text and text.startswith("{") and is_reference(json.loads(text))


def _inline_as_is(text: str) -> bool:
    """The common case, decided without encoding or naming anything: small whatever its characters
    (UTF-8 spends at most 4 bytes on one), within both limits, and no reference's look-alike."""
    return len(text) <= _limits()[2] and _QUOTED_REFERENCE not in text


def _nbytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _size(nbytes: int) -> str:
    if nbytes < 1024 * 1024:
        return f"{nbytes / 1024:.1f} KiB"
    return f"{nbytes / (1024 * 1024):.1f} MiB"


def check_size(nbytes: int, *, what: str) -> None:
    """Raise ``PayloadTooLarge`` naming ``what``, its size and the cap, when ``nbytes`` is past the cap."""
    cap = max_bytes()
    if nbytes > cap:
        raise PayloadTooLarge(
            f"{what} is {nbytes} bytes of JSON ({_size(nbytes)}), over the limit of {cap} bytes "
            f"({_size(cap)}, RUNS_PAYLOAD_MAX_BYTES)",
            size=nbytes,
            limit=cap,
        )


def summary_of(text: str) -> str:
    """One line to judge a stored value by without downloading it."""
    nbytes = len(text.encode())
    head = text[:1]
    if head == "{":
        try:
            keys = list(json.loads(text))[:8]
        except ValueError:
            keys = []
        return f"JSON object with keys {', '.join(keys)}; {_size(nbytes)}"
    if head == "[":
        return f"JSON array; {_size(nbytes)}"
    if head == '"':
        return f"JSON string; {_size(nbytes)}; begins: {text[1:121]}"
    return f"JSON; {_size(nbytes)}"


def _needs_artifact(text: str) -> bool:
    return _nbytes(text) > inline_limit() or _looks_like_reference(text)


def reference_of(artifact: Artifact) -> dict[str, Any]:
    return {
        REFERENCE: artifact.pk,
        "bytes": artifact.size,
        "sha256": artifact.sha256,
        "summary": artifact.summary,
        "url": f"/api/runs/{artifact.run_id}/artifacts/{artifact.pk}",
    }


def stored_json(text: str, *, run_id: UUID, name: str, what: str) -> str:
    """What to store for the JSON ``text`` of a value of run ``run_id``: ``text`` itself, or a reference's.

    Over the inline limit ``text`` is saved as the run's artifact ``name``
    (idempotent: a step executed again after a crash finds the artifact its
    first execution saved). Past the cap raises ``PayloadTooLarge`` naming
    ``what``, and nothing is written.
    """
    if _inline_as_is(text):  # the common case, decided without counting bytes
        return text
    check_size(_nbytes(text), what=what)
    if not _needs_artifact(text):
        return text
    data = text.encode()
    from runs.artifacts import save_artifact  # the model, once needed (_artifact_model)

    artifact = save_artifact(
        run_id=run_id, name=name, data=data, content_type=CONTENT_TYPE, summary=summary_of(text)
    )
    return dumps(reference_of(artifact))


def stored_step_input_json(text: str, *, run_id: UUID, seq: int) -> str:
    """A step input's JSON as stored: past the cap a note, since only the audit trail reads it."""
    try:
        return stored_json(text, run_id=run_id, name=f"step {seq} input", what="the step's input")
    except PayloadTooLarge as exc:
        return dumps({"omitted": str(exc)})


@dataclass(frozen=True)
class Offload:
    """A run input to store as an artifact, for a run whose row does not exist yet (``runs.services``)."""

    text: str

    def write_file(self, *, run_id: UUID) -> str:
        """Write the value to storage (outside any transaction); the stored file's name."""
        digest = hashlib.sha256(self.text.encode()).hexdigest()
        return default_storage.save(
            f"artifacts/payloads/{run_id}-{digest[:12]}-input.json", ContentFile(self.text.encode())
        )

    def save_row(self, *, run_id: UUID, file: str) -> dict[str, Any]:
        """The Artifact row, in the transaction that inserts the run (its foreign key is checked at commit)."""
        data = self.text.encode()
        artifact = _artifact_model().objects.create(
            run_id=run_id,
            name="input",
            content_type=CONTENT_TYPE,
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            summary=summary_of(self.text),
            file=file,
        )
        return reference_of(artifact)

    @staticmethod
    def discard(file: str) -> None:
        default_storage.delete(file)


def offload_input(value: Any) -> Offload | None:
    """None when the run input ``value`` is stored inline, else its ``Offload``; past the cap ``PayloadTooLarge``."""
    text = dumps(value)
    check_size(_nbytes(text), what="the run's input")
    return Offload(text) if _needs_artifact(text) else None


def resolve(value: Any, *, run_id: UUID) -> Any:
    """The value a stored ``value`` of run ``run_id`` stands for: itself, or what its reference's artifact holds.

    Only an artifact of a run of ``run_id``'s tenant is read (a fork reads
    its origin's); another tenant's, a missing file or one whose sha256
    changed raises ``MissingPayload``.
    """
    if not is_reference(value):
        return value
    artifact = (
        _artifact_model().objects.filter(pk=value[REFERENCE], run__tenant__runs__id=run_id).first()
    )
    if artifact is None:
        raise MissingPayload(f"artifact {value[REFERENCE]} is not an artifact of this run's tenant")
    try:
        with artifact.file.open("rb") as fh:
            data = fh.read()
    except (FileNotFoundError, ValueError):
        raise MissingPayload(
            f"the file of artifact {artifact.pk} is missing from storage"
        ) from None
    if hashlib.sha256(data).hexdigest() != value["sha256"]:
        raise MissingPayload(f"artifact {artifact.pk} no longer holds the value it was stored with")
    return json.loads(data)


def resolve_json(text: str | bytes | None, *, run_id: UUID) -> Any:
    """``resolve`` of a jsonb column as a raw cursor hands it over (JSON text)."""
    return resolve(loads(text), run_id=run_id)


def stored_step_output_json(text: str, *, step: Any) -> str:
    """A step output's JSON as stored (``step`` is its ``StepRecord``); past the cap ``PayloadTooLarge``."""
    return stored_json(
        text,
        run_id=step.run_id,
        name=f"step {step.seq} output",
        what=f"the output of step {step.seq} ({step.name})",
    )
