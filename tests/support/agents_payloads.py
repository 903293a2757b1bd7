"""Kinds of tests/runs/test_payloads.py: steps, inputs and results larger than a row should hold.

Worker processes import this module through AGENT_MODULES; the test process
imports it to submit runs of its kinds.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time

from workers import RunContext, agent


def digest(value) -> str:
    """The sha256 of ``value``'s canonical JSON: what a test compares, instead of megabytes."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _random_blob(log: str, nbytes: int) -> dict:
    """Random text, so that only the recorded output can give the same value again; logged by its digest."""
    value = {"blob": secrets.token_hex(nbytes // 2)}
    with open(log, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), "sha256": digest(value)}) + "\n")
    return value


def _wait_while(path: str | None) -> str:
    while path and os.path.exists(path):
        time.sleep(0.05)
    return "released"


@agent("payload_big_step")
def big_step(ctx: RunContext, data: dict) -> dict:
    """A step returning ``bytes`` of random JSON, then one that waits while ``block_file`` exists."""
    big = ctx.step("big", _random_blob, data["log"], data.get("bytes", 1024 * 1024))
    ctx.step("wait", _wait_while, data.get("block_file"))
    return {"sha256": digest(big), "chars": len(big["blob"])}


@agent("payload_echo_input")
def echo_input(ctx: RunContext, data: dict) -> dict:
    """What the agent received as its input, by digest and size."""
    return {"sha256": digest(data), "chars": len(json.dumps(data)), "keys": sorted(data)}


@agent("payload_big_result")
def big_result(ctx: RunContext, data: dict) -> dict:
    """A result of ``bytes`` characters of text."""
    ctx.step("prepare", lambda: "ready")
    return {"text": "r" * data["bytes"]}
