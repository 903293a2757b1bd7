"""Who acted, in words: the names people read for the actors Events and Messages record.

An Event (and a Message, and an approval's decision) records its actor as a
type and an id (``runs.events.Actor``): ``user`` and a user's id, ``api_key``
and a key's id, ``worker`` and a worker's id, ``system`` and an internal
name (``reaper``, ``timer``, ``parent:<run id>``). ``describe_actors`` turns
many of them into names at once, with one query per kind of actor that has a
name (users, API keys), so a page of a run's activity costs two queries at
most, however many people acted on it.

A user is named by their full name, else their username; an API key as
"API key ‘ci-bot’". An API key is named only within its own tenant's runs;
anyone else's, and a user or key deleted since, get a plain description.
Names are text: templates escape them like any other string.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model

from runs.models import ApiKey, Event

ActorType = Event.ActorType
ActorKey = tuple[str, str]  # (actor_type, actor_id), as Events and Messages store them

# Internal actors, by their id (runs.engine.reaping, runs.engine.timers, ...).
SYSTEM_NAMES = {"reaper": "the reaper", "timer": "the timer"}
WORKER = "the worker"
SYSTEM = "the system"
PARENT = "its parent run"
DELETED_USER = "a deleted user"
DELETED_KEY = "a deleted API key"
FOREIGN_KEY = "an API key"  # a key of another tenant is never named
SOMEONE = "someone"


def describe_actors(pairs: Iterable[ActorKey], *, tenant_id: Any) -> dict[ActorKey, str]:
    """Names for ``(actor_type, actor_id)`` pairs of one tenant's runs: one query per actor type at most.

    Every pair asked for is in the answer. ``tenant_id`` is the tenant whose
    runs the pairs come from: only its API keys are named.
    """
    wanted = {(str(type_), str(id_ or "")) for type_, id_ in pairs}
    user_ids = {int(id_) for type_, id_ in wanted if type_ == ActorType.USER and id_.isdigit()}
    key_ids = {int(id_) for type_, id_ in wanted if type_ == ActorType.API_KEY and id_.isdigit()}
    users = _user_names(user_ids) if user_ids else {}
    keys: dict[str, str] = {}
    if key_ids:
        found = ApiKey.objects.filter(pk__in=key_ids).values_list("pk", "tenant_id", "name")
        keys = {
            str(pk): api_key_name(name) if str(tenant) == str(tenant_id) else FOREIGN_KEY
            for pk, tenant, name in found
        }
    return {(type_, id_): _name(type_, id_, users=users, keys=keys) for type_, id_ in wanted}


def describe_actor(actor_type: str, actor_id: str, *, tenant_id: Any) -> str:
    """The name of one actor (a query at most)."""
    key = (str(actor_type), str(actor_id or ""))
    return describe_actors([key], tenant_id=tenant_id)[key]


def parse_actor(ref: str) -> ActorKey:
    """``"api_key:3"`` (how an approval's ``by`` and a message's ``author`` spell an actor) as ``("api_key", "3")``."""
    type_, _, id_ = (ref or "").partition(":")
    return type_, id_


def api_key_name(name: str) -> str:
    return f"API key ‘{name}’" if name else "an unnamed API key"


def sentence_start(name: str) -> str:
    """A name to begin a sentence with: "The reaper", "A deleted user"; people's names stay as they are."""
    if name.startswith(("the ", "a ", "an ", "its ", "someone")):
        return name[:1].upper() + name[1:]
    return name


def message_author(message, names: dict[ActorKey, str]) -> str:
    """The name of a ``Message``'s author, from ``describe_actors`` over the messages shown.

    ``names = describe_actors(((m.author_type, m.author_id) for m in messages), tenant_id=run.tenant_id)``
    """
    return names.get((message.author_type, message.author_id or ""), SOMEONE)


def person_name(user) -> str:
    """A user as people call them: their full name, else their username."""
    return (user.get_full_name() or "").strip() or user.get_username()


def _user_names(ids: set[int]) -> dict[str, str]:
    User = get_user_model()  # noqa: N806 - a class
    users = User.objects.filter(pk__in=ids).only(
        "pk", User.USERNAME_FIELD, "first_name", "last_name"
    )
    return {str(user.pk): person_name(user) for user in users}


def _name(type_: str, id_: str, *, users: dict[str, str], keys: dict[str, str]) -> str:
    if type_ == ActorType.USER:
        return users.get(id_, DELETED_USER)
    if type_ == ActorType.API_KEY:
        return keys.get(id_, DELETED_KEY)
    if type_ == ActorType.WORKER:
        return WORKER
    if type_ == ActorType.SYSTEM:
        if id_.startswith("parent:"):
            return PARENT
        return SYSTEM_NAMES.get(id_, SYSTEM)
    return SOMEONE
