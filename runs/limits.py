"""The numeric bounds of what a client may ask for, checked before anything is written.

A value past a column's range (NUMERIC(18, 6) money, 32-bit counters) or
NaN must be a 422 naming the field, never a database error.
"""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal, InvalidOperation

from runs.exceptions import InvalidRunInput
from runs.models import MONEY

# The money columns' NUMERIC(18, 6): amounts stay below 10^12 cents.
CENTS_LIMIT = 10 ** (MONEY["max_digits"] - MONEY["decimal_places"])
MAX_CENTS = Decimal(CENTS_LIMIT) - Decimal(1).scaleb(-MONEY["decimal_places"])
# PositiveIntegerField is a 32-bit integer in PostgreSQL.
MAX_INT = 2**31 - 1
MAX_DEADLINE_SECONDS = 30 * 24 * 3600
MAX_EXPIRES_IN_SECONDS = 365 * 24 * 3600


def checked_cents(value: Decimal | float | int, *, field: str) -> Decimal:
    """A money amount in cents as stored (six decimals), or InvalidRunInput naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, Decimal | float | int):
        raise InvalidRunInput(f"{field} must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRunInput(f"{field} must be a finite number")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise InvalidRunInput(f"{field} must be a number") from None
    if not amount.is_finite():
        raise InvalidRunInput(f"{field} must be a finite number")
    if amount < 0:
        raise InvalidRunInput(f"{field} must not be negative")
    if amount > MAX_CENTS:
        raise InvalidRunInput(f"{field} must be at most {MAX_CENTS}")
    return amount.quantize(Decimal("0.000001"))


def checked_int(value: int, *, field: str, minimum: int = 0, maximum: int = MAX_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRunInput(f"{field} must be an integer")
    if not minimum <= value <= maximum:
        raise InvalidRunInput(f"{field} must be between {minimum} and {maximum}")
    return value


def checked_deadline(value: int) -> int:
    return checked_int(value, field="deadline_seconds", minimum=1, maximum=MAX_DEADLINE_SECONDS)


def checked_expires_in(value: int | float | timedelta) -> timedelta:
    """``expires_in`` of a submit: seconds (or a timedelta) above 0, at most a year."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRunInput("expires_in must be a number of seconds")
    else:
        seconds = float(value)
    if not 0 < seconds <= MAX_EXPIRES_IN_SECONDS:  # NaN fails both
        raise InvalidRunInput(
            f"expires_in must be more than 0 and at most {MAX_EXPIRES_IN_SECONDS} seconds"
        )
    return timedelta(seconds=seconds)
