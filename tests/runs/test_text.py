"""runs.text: what PostgreSQL cannot store is found with a readable reason, or scrubbed away."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runs.models import Run
from runs.text import MAX_DEPTH, find_unstorable, scrub
from tests.support.factories import TenantFactory


def nested(depth: int):
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value, reason",
    [
        ("a\x00b", "value: contains a NUL character"),
        ("\ud800", "value: contains a lone surrogate (U+D800)"),
        ({"items": ["ok", "fine", "x\x00"]}, "value.items[2]: contains a NUL character"),
        ({"outer": {"bad\x00key": 1}}, "value.outer: a key contains a NUL character"),
        ({"a b": {"c": "\udfff"}}, "value['a b'].c: contains a lone surrogate (U+DFFF)"),
        ({"x": float("nan")}, "value.x: nan is not a finite number"),
        ([1, (2, float("-inf"))], "value[1][1]: -inf is not a finite number"),
        (Decimal("Infinity"), "value: Infinity is not a finite number"),
        (
            nested(MAX_DEPTH + 1),
            "value" + "[0]" * MAX_DEPTH + f": nests deeper than {MAX_DEPTH} levels",
        ),
    ],
)
def test_find_unstorable_names_where_and_what(value, reason):
    assert find_unstorable(value) == reason


def test_the_reason_starts_from_the_name_it_is_given_and_reports_the_first_problem():
    assert (
        find_unstorable({"a": "\x00", "b": "\ud800"}, where="input")
        == "input.a: contains a NUL character"
    )


def test_the_reason_never_contains_the_offending_characters():
    reason = find_unstorable({"\x00\ud800": 1})
    assert reason is not None
    assert find_unstorable(reason) is None
    json.dumps(reason).encode()


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "caf\u00e9 \U0001f600 \ufffd",
        10**40,
        1e308,
        Decimal("1.5"),
        True,
        {"a": [1, {"b": None}]},
        nested(MAX_DEPTH),
        object(),
    ],
)
def test_storable_values_pass(value):
    assert find_unstorable(value) is None


def test_max_depth_can_be_chosen():
    assert find_unstorable(nested(3), max_depth=3) is None
    assert find_unstorable(nested(4), max_depth=3) == "value[0][0][0]: nests deeper than 3 levels"


def test_a_very_deep_value_is_answered_without_recursion():
    assert "nests deeper" in find_unstorable(nested(100_000))
    cleaned, replaced = scrub(nested(100_000))
    assert replaced is False


def test_scrub_replaces_nul_and_lone_surrogates_in_keys_and_values_and_drops_non_finite_numbers():
    value = {"a\x00": ["x\ud800y", float("nan"), 1.5, (Decimal("NaN"), "ok")], "n": None, "t": True}

    cleaned, replaced = scrub(value)

    assert replaced is True
    assert cleaned == {"a\ufffd": ["x\ufffdy", None, 1.5, [None, "ok"]], "n": None, "t": True}
    assert value["a\x00"][0] == "x\ud800y"  # the original is left alone


def test_scrub_of_clean_values_reports_nothing_and_copies_the_containers():
    value = {"a": [1, "b", {"c": 2.5}]}

    cleaned, replaced = scrub(value)

    assert (cleaned, replaced) == (value, False)
    assert cleaned is not value and cleaned["a"] is not value["a"]


def test_scrub_of_plain_text():
    assert scrub("a\x00b") == ("a\ufffdb", True)
    assert scrub("ab") == ("ab", False)


hostile_text = st.text(
    alphabet=st.sampled_from(["\x00", "\ud800", "\udfff", "a", "\u00e9", "\U0001f600"])
)
hostile_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | hostile_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(hostile_text, children, max_size=4)
    ),
    max_leaves=20,
)


@given(hostile_json)
def test_whatever_scrub_returns_is_storable_and_scrubbing_again_changes_nothing(value):
    cleaned, replaced = scrub(value)

    assert find_unstorable(cleaned) is None
    assert replaced is (find_unstorable(value) is not None)
    assert scrub(cleaned) == (cleaned, False)
    json.dumps(cleaned, allow_nan=False).encode()


@pytest.mark.django_db
def test_what_find_unstorable_passes_postgresql_stores():
    """The other half of the contract: the values the module calls storable really are (jsonb and text)."""
    value = {
        "note": "caf\u00e9 \U0001f600 \ufffd",
        "big": 10**40,
        "deep": nested(MAX_DEPTH - 1),
        "f": 0.25,
    }
    assert find_unstorable(value) is None

    run = Run.objects.create(tenant=TenantFactory(), kind="x", input=value, error=value["note"])

    run.refresh_from_db()
    assert run.input == value
