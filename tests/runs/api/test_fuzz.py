"""Every endpoint of the JSON API, fed hostile input: never a 500, every 4xx a JSON ``{"detail": "..."}``.

The endpoints come from the API's own OpenAPI schema, so an endpoint added
later is covered without touching this file. Hypothesis draws the path ids
(real runs in several states, or garbage), the query string, the declared
headers and the body (the declared fields, or something that is not what
the endpoint expects) from values rich in what PostgreSQL refuses: NUL
characters, lone surrogates, numbers beyond NUMERIC(18,6) and float,
NaN/Infinity, deep nesting, wrong types. test_api_bad_input.py pins the
cases the issue lists one by one.

Each example runs in a savepoint that is rolled back, so every request sees
the same runs and a database error cannot spoil the examples after it.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from django.core.files.base import ContentFile
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from config.api import api as ninja_api
from runs.models import Artifact
from tests.support import run_states

EXAMPLES_PER_ENDPOINT = 50

OPENAPI = ninja_api.get_openapi_schema()
COMPONENTS = OPENAPI.get("components", {}).get("schemas", {})
ENDPOINTS = [
    (method.upper(), path, operation)
    for path, item in OPENAPI["paths"].items()
    for method, operation in item.items()
    if method in {"get", "post", "put", "patch", "delete"}
]

# --- values --------------------------------------------------------------------------

UNSTORABLE_TEXT = ["\x00", "a\x00b", "\ud800", "x\udfff", "\udbff\x00", "\x00" * 3]
ODD_TEXT = [
    "",
    " ",
    "\n",
    "null",
    "NaN",
    "Infinity",
    "1e999",
    "-1",
    "0",
    "../..",
    "%00",
    "'; --",
    "\ufffd",
    "\U0001f600",
    "\u202e",
    "a" * 300,
    "é" * 70,
]
PLAUSIBLE_TEXT = [
    "noop3",
    "echo",
    "default",
    "done",
    "retry",
    "fail",
    "queued",
    "failed",
    "ok",
    "https://example.com/hook",
]
HUGE_NUMBERS = [
    1e30,
    1e40,
    -1e30,
    1e12,
    999_999_999_999.999999,
    10**20,
    -(10**20),
    2**63,
    2**31,
    -1,
    0,
    1,
    0.1,
    1e-12,
]
NOT_FINITE = [float("nan"), float("inf"), float("-inf")]

texts = st.one_of(
    st.sampled_from(UNSTORABLE_TEXT),
    st.sampled_from(ODD_TEXT + PLAUSIBLE_TEXT),
    st.text(
        alphabet=st.sampled_from(["\x00", "\ud800", "\udfff", "a", "é", "\U0001f600", "/", "%"]),
        max_size=12,
    ),
    st.text(max_size=20),
)
numbers = st.one_of(
    st.sampled_from(HUGE_NUMBERS + NOT_FINITE),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(texts, numbers, st.booleans(), st.none())


class Deep:
    """A placeholder for ``depth`` nested lists, written into the JSON text after json.dumps."""

    def __init__(self, depth: int):
        self.depth = depth


json_values = st.recursive(
    scalars | st.integers(min_value=20, max_value=5000).map(Deep),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)


def to_json(value: Any) -> str:
    """JSON text with NaN/Infinity literals and lone surrogates escaped (as a hostile client sends them)."""
    deep: list[Deep] = []

    def mark(obj):
        if isinstance(obj, Deep):
            deep.append(obj)
            return f"__deep_{len(deep) - 1}__"
        raise TypeError(type(obj))

    text = json.dumps(value, ensure_ascii=True, allow_nan=True, default=mark)
    for index, item in enumerate(deep):
        text = text.replace(f'"__deep_{index}__"', "[" * item.depth + "]" * item.depth)
    return text


def url_part(value: str) -> str:
    """Percent-encoded UTF-8 bytes; a lone surrogate becomes the bytes a broken client would send."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


# --- the shape of each endpoint ----------------------------------------------------------


def _resolve(schema: dict) -> dict:
    for variant in schema.get("anyOf") or schema.get("oneOf") or []:
        if variant.get("type") != "null":
            return _resolve(variant)
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        return _resolve(COMPONENTS[ref.rsplit("/", 1)[-1]])
    return schema


# Values that get a request past validation, so that the hostile value next to them reaches the database.
PLAUSIBLE_BY_NAME = {
    "kind": ["noop3", "echo"],
    "queue": ["default"],
    "callback_url": ["https://example.com/hook"],
}


def field_values(name: str, prop: dict) -> st.SearchStrategy:
    """Mostly the field's own kind of value, else anything hostile."""
    prop = _resolve(prop)
    kind = prop.get("type")
    if prop.get("enum") or "const" in prop:
        own = st.sampled_from(list(prop.get("enum") or [prop["const"]]))
    elif name in PLAUSIBLE_BY_NAME:
        own = st.sampled_from(PLAUSIBLE_BY_NAME[name])
    elif kind == "string":
        own = texts
    elif kind == "integer":
        own = st.integers(
            min_value=prop.get("minimum"), max_value=prop.get("maximum")
        ) | st.sampled_from(HUGE_NUMBERS)
    elif kind == "number":
        own = numbers
    elif kind == "object":
        own = st.dictionaries(texts, json_values, max_size=4)
    else:
        own = json_values
    return st.one_of(own, own, json_values)


def body_strategy(operation: dict) -> st.SearchStrategy:
    content = (operation.get("requestBody") or {}).get("content", {}).get("application/json")
    schema = _resolve(content["schema"]) if content else {}
    fields = schema.get("properties", {})
    required = set(schema.get("required", []))
    return st.fixed_dictionaries(
        {name: field_values(name, prop) for name, prop in fields.items() if name in required},
        optional={
            name: field_values(name, prop) for name, prop in fields.items() if name not in required
        },
    )


def params(operation: dict, where: str) -> list[dict]:
    return [p for p in operation.get("parameters", []) if p["in"] == where]


def as_text(value: Any) -> str:
    """A query or header value: text as it is, anything else as its JSON text."""
    return value if isinstance(value, str) else to_json(value)


# --- the requests -------------------------------------------------------------------------


@pytest.fixture
def world(tenant, api_key, settings, tmp_path):
    """Runs of the tenant in every state an endpoint acts on, an artifact of one, and the tenant's API key."""
    settings.MEDIA_ROOT = str(tmp_path)
    runs = run_states.one_of_each(tenant)
    artifact = Artifact.objects.create(
        run=runs["failed"],
        name="notes.txt",
        content_type="text/plain",
        size=5,
        sha256="0" * 64,
        file=ContentFile(b"hello", name="notes.txt"),
    )
    ids = [str(run.id) for run in runs.values()] + [str(artifact.pk)]
    return {"ids": ids, "key": api_key}


def request_for(method: str, path: str, operation: dict, ids: list[str]) -> st.SearchStrategy:
    # Mostly real runs (and the artifact), so that requests reach the runs' states.
    real = st.sampled_from(ids)
    path_values = st.one_of(
        real, real, real, texts, st.integers(min_value=-(10**30), max_value=10**30).map(str)
    )
    bodies = st.one_of(
        body_strategy(operation).map(to_json),
        body_strategy(operation).map(to_json),
        json_values.map(to_json),
        st.sampled_from(
            ["", "{", "not json", "[1, 2]", '"text"', "null", '{"a": 1e400}', "[" * 10_000]
        ),
        st.none(),
    )
    query = st.fixed_dictionaries(
        {},
        optional={
            **{
                p["name"]: field_values(p["name"], p.get("schema", {})).map(as_text)
                for p in params(operation, "query")
            },
            "extra": texts,
        },
    )
    headers = st.fixed_dictionaries(
        {},
        optional={
            p["name"]: field_values(p["name"], p.get("schema", {})).map(as_text)
            for p in params(operation, "header")
        },
    )
    return st.fixed_dictionaries(
        {
            "path": st.fixed_dictionaries(
                {p["name"]: path_values for p in params(operation, "path")}
            ),
            "query": query,
            "headers": headers,
            "body": bodies,
            # Mostly the tenant's real key, so requests get past authentication.
            "auth": st.sampled_from(["key"] * 8 + ["none", "garbage"]),
            "auth_garbage": texts,
        }
    )


def send(method: str, path: str, drawn: dict, key: str):
    url = path
    for name, value in drawn["path"].items():
        url = url.replace("{" + name + "}", url_part(value))
    if drawn["query"]:
        url += "?" + "&".join(f"{url_part(k)}={url_part(v)}" for k, v in drawn["query"].items())
    headers = dict(drawn["headers"])
    if drawn["auth"] == "key":
        headers["Authorization"] = f"Bearer {key}"
    elif drawn["auth"] == "garbage":
        headers["Authorization"] = f"Bearer {drawn['auth_garbage']}"
    client = Client(raise_request_exception=False)
    body = drawn["body"]
    if body is None:
        return client.generic(method, url, headers=headers)
    data = body.encode("utf-8", "surrogatepass")
    return client.generic(method, url, data=data, content_type="application/json", headers=headers)


def check(response, what: str) -> None:
    # Not response.close(): the test client has closed it already (or closes a stream once it is read),
    # and a close of our own would fire request_finished, which drops the test's connection.
    assert response.status_code < 500, f"{what} -> {response.status_code}"
    if 400 <= response.status_code < 500:
        assert response["Content-Type"].startswith("application/json"), (
            f"{what} -> {response['Content-Type']}"
        )
        content = b"".join(response.streaming_content) if response.streaming else response.content
        detail = json.loads(content).get("detail")
        assert isinstance(detail, str) and detail, f"{what} -> {content[:300]!r}"


@pytest.mark.parametrize(
    "method, path, operation", ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS]
)
def test_no_input_makes_an_endpoint_fail_with_a_server_error(world, method, path, operation):
    @hypothesis_settings(
        max_examples=EXAMPLES_PER_ENDPOINT,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )
    @given(drawn=request_for(method, path, operation, world["ids"]))
    def fire(drawn):
        with transaction.atomic():
            response = send(method, path, drawn, world["key"])
            transaction.set_rollback(True)
        check(response, f"{method} {path} {drawn!r}"[:2000])

    fire()


def test_every_endpoint_is_fuzzed():
    """A guard against the schema walk silently finding nothing."""
    paths = {(method, path) for method, path, _ in ENDPOINTS}
    assert ("POST", "/api/runs") in paths
    assert ("POST", "/api/runs/{run_id}/resolve") in paths
    assert len(paths) >= 15
