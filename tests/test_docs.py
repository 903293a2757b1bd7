"""The project's own documentation holds: docs/architecture.md names modules that exist, draws every
run status, and nothing cites a design document a clone of the repository does not have.

Plain file reads (no database): a reader who follows the architecture walk to a module that was
moved or renamed is lost, and so is one sent to a "DESIGN.md" that is not in the checkout.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from runs.states import RunStatus

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# A path as the doc writes one: in backticks, relative to the checkout, with at least one "/",
# e.g. `runs/engine/claim.py` or the folder `runs/engine/`. URLs (`/api/runs`), endpoints with a
# method (`POST /api/runs`) and placeholders (`{id}`, `<key>`) are not paths.
BACKTICKED = re.compile(r"`([^`\s]+)`")
PATH = re.compile(r"[A-Za-z_][\w.-]*(?:/[\w.-]+)*/?")

# The modules a run visits, in the order the walk must name them (a sample that spans every part:
# request, worker, reaper, delivery, streams).
WALK = [
    "config/asgi.py",
    "config/body_limit.py",
    "config/urls.py",
    "config/api.py",
    "runs/api/auth.py",
    "runs/api/endpoints.py",
    "runs/kinds.py",
    "runs/services.py",
    "runs/events.py",
    "runs/notify.py",
    "workers/management/commands/runworker.py",
    "workers/worker.py",
    "workers/listener.py",
    "runs/engine/claim.py",
    "workers/executor.py",
    "workers/context.py",
    "workers/workflow.py",
    "workers/recording.py",
    "workers/committer.py",
    "runs/engine/steps.py",
    "runs/engine/exit.py",
    "workers/reaper.py",
    "runs/engine/reaping.py",
    "workers/webhooks.py",
    "runs/webhooks/deliveries.py",
    "runs/webhooks/signing.py",
    "workers/webhook_http.py",
    "runs/webhooks/targets.py",
    "runs/streams/hub.py",
]

# The run state machine's transitions (source, target) that the diagram must draw.
TRANSITIONS = {
    ("queued", "running"),
    ("running", "done"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "queued"),  # retryable error, lease expired, graceful release
    ("running", "waiting_human"),
    ("running", "paused"),
    ("running", "waiting"),
    ("waiting_human", "queued"),
    ("waiting_human", "failed"),
    ("paused", "queued"),
    ("waiting", "queued"),
    ("queued", "paused"),
    ("failed", "queued"),
    ("cancelled", "queued"),  # retry
    *((status, "cancelled") for status in ("queued", "waiting_human", "waiting", "paused")),
    *((status, "failed") for status in ("waiting_human", "waiting", "paused")),  # expires_at
}

# Where a design document outside the repository used to be cited: "DESIGN.md", "DESIGN §9".
CITATION = re.compile(rb"DESIGN(?:\.md|\s*\xc2\xa7)|(?i:design\.md)")
SCANNED = [
    "config",
    "runs",
    "workers",
    "examples",
    "templates",
    "static",
    "deploy",
    "docs",
    "tests",
    "bench",
    "Makefile",
    "pyproject.toml",
]


def architecture() -> str:
    assert ARCHITECTURE.is_file(), "docs/architecture.md is missing"
    return ARCHITECTURE.read_text(encoding="utf-8")


def named_paths(text: str) -> list[str]:
    return [token for token in BACKTICKED.findall(text) if "/" in token and PATH.fullmatch(token)]


def diagram_edges(text: str) -> set[tuple[str, str]]:
    blocks = re.findall(r"```mermaid\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/architecture.md has one Mermaid diagram"
    lines = blocks[0].strip().splitlines()
    assert lines[0].strip() == "stateDiagram-v2"
    edges = set()
    for line in lines[1:]:
        found = re.match(r"\s*(\[\*\]|\w+)\s*-->\s*(\[\*\]|\w+)\s*(?::.*)?$", line)
        assert found or not line.strip(), f"not a transition: {line!r}"
        if found:
            edges.add(found.groups())
    return edges


def test_every_path_the_architecture_names_exists():
    text = architecture()
    bare = re.findall(r"[\w/.-]+\.py\b", re.sub(r"`[^`]*`", "", text))
    assert not bare, f"paths are written in backticks, so that this test sees them: {bare}"
    paths = named_paths(text)
    assert len(paths) >= len(WALK), paths  # the pattern finds the doc's paths at all
    missing = [path for path in paths if not (ROOT / path.rstrip("/")).exists()]
    assert not missing, f"docs/architecture.md names paths that are not in the checkout: {missing}"
    folders = [path for path in paths if path.endswith("/") and not (ROOT / path).is_dir()]
    assert not folders, f"named as folders but not folders: {folders}"


def test_the_walk_names_each_module_once_in_the_order_a_run_visits_it():
    paths = named_paths(architecture())
    modules = [path for path in paths if path.endswith(".py")]
    repeated = sorted({path for path in modules if modules.count(path) > 1})
    assert not repeated, f"named more than once: {repeated}"
    absent = [path for path in WALK if path not in modules]
    assert not absent, f"the walk does not name {absent}"
    order = [path for path in modules if path in WALK]
    assert order == WALK, "the walk names the modules out of the order a run visits them"


def test_the_state_diagram_draws_every_status_and_transition():
    edges = diagram_edges(architecture())
    drawn = {state for edge in edges for state in edge} - {"[*]"}
    assert drawn == {status.value for status in RunStatus}, "the diagram's states are RunStatus's"
    assert not TRANSITIONS - edges, f"transitions not drawn: {sorted(TRANSITIONS - edges)}"
    assert ("[*]", "queued") in edges
    assert {source for source, target in edges if target == "[*]"} == {
        "done",
        "failed",
        "cancelled",
    }


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        top = ROOT / name
        candidates = [top] if top.is_file() else top.rglob("*")
        for path in candidates:
            if (
                path.is_file()
                and "__pycache__" not in path.parts
                and path != Path(__file__).resolve()
            ):
                files.append(path)
    return files


def test_nothing_cites_a_design_document_outside_the_repository():
    assert not (ROOT / "DESIGN.md").exists()  # were it ever added, citing it would be fine
    citing = []
    for path in scanned_files():
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            if CITATION.search(line):
                citing.append(f"{path.relative_to(ROOT)}:{number}")
    assert not citing, f"cite a DESIGN.md that a clone does not have: {citing}"


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("runs", {"workers", "examples"}),
        ("config", {"workers", "examples"}),
        ("workers", {"examples"}),
    ],
)
def test_the_rules_of_the_house_the_architecture_states(package, forbidden):
    breaking = sorted(
        f"{path.relative_to(ROOT)} imports {', '.join(sorted(imported_roots(path) & forbidden))}"
        for path in (ROOT / package).rglob("*.py")
        if imported_roots(path) & forbidden
    )
    assert not breaking, breaking
