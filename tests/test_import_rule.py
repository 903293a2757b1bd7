"""The import rule is a test, not a hope: workers/ imports runs/, never the reverse; config/ never imports
workers/; nothing of the engine imports examples/ (the contracts in pyproject.toml, [tool.importlinter]).

import-linter reads every import, function-local ones too: an import inside a function that dodges the
rule is the same arrow, hidden. Plain subprocesses, no database.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["config", "runs", "workers", "examples"]


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """`lint-imports` of the virtualenv running the tests, on the packages under ``cwd``."""
    executable = Path(sys.executable).parent / "lint-imports"
    assert executable.exists(), "lint-imports is missing: import-linter is in the test extras"
    return subprocess.run(
        [str(executable), "--no-cache", "--no-logo"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_code_keeps_the_import_rule():
    linted = lint_imports(ROOT)

    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 broken" in linted.stdout, linted.stdout


def test_a_runs_module_that_imports_workers_inside_a_function_breaks_the_rule(tmp_path):
    """The contracts can fail: a copy of the checkout with one hidden arrow from runs/ to workers/."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    services = tmp_path / "runs" / "services.py"
    services.write_text(
        services.read_text() + "\n\ndef dodge():\n    import workers.worker  # noqa: F401\n"
    )

    linted = lint_imports(tmp_path)

    assert linted.returncode != 0, linted.stdout
    assert "runs is not allowed to import workers" in linted.stdout, linted.stdout
    assert "runs.services -> workers.worker" in linted.stdout, linted.stdout
