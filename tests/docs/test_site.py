"""The documentation site cannot drift: its strict build fails on what would leave a reader stranded.

Each failure case builds a small copy of the site in a temporary directory (mkdocs.yml with a nav
of its own, a few pages, the hooks and the code packages linked from the checkout) and expects
``mkdocs build --strict`` to fail with a message naming the problem: a link to a page that does not
exist, a page left out of the nav, an authoring-reference entry whose function was renamed, an
environment variable without a comment. The real site must build, and its generated reference
pages must list every endpoint, command and environment variable the code has. No database.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "gen"))

import ref_settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MKDOCS_YML = (ROOT / "mkdocs.yml").read_text()
PACKAGES = ("config", "runs", "workers")
NAV = re.compile(r"^nav:\n(?:[ \t]+.*\n|\n)*?(?=^\S)", re.MULTILINE)


def _env() -> dict[str, str]:
    """The build's environment: the hooks set Django up themselves (no database is reached)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH"}
    }
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


def site_copy(
    tmp_path: Path, pages: dict[str, str], nav: list[str], *, copied: tuple[str, ...] = ()
) -> Path:
    """A site in ``tmp_path`` with ``pages`` and a nav of ``nav``; ``copied`` packages are copies to edit."""
    nav_yaml = "nav:\n" + "".join(f"  - {page}\n" for page in nav)
    assert NAV.search(MKDOCS_YML), "mkdocs.yml has no nav: block"
    (tmp_path / "mkdocs.yml").write_text(NAV.sub(nav_yaml, MKDOCS_YML, count=1))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "gen").symlink_to(ROOT / "docs" / "gen")
    for name, text in pages.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text)
    for package in PACKAGES:
        if package in copied:
            shutil.copytree(
                ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            (tmp_path / package).symlink_to(ROOT / package)
    return tmp_path / "mkdocs.yml"


def failed_with(result: subprocess.CompletedProcess, *needles: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"the strict build passed:\n{output}"
    for needle in needles:
        assert needle in output, f"the build's output does not name {needle!r}:\n{output}"
    return output


# What must fail the build.
def test_a_link_to_a_missing_page_fails_the_build(tmp_path):
    config = site_copy(
        tmp_path,
        {
            "index.md": "# Home\n\nSee [the guide](guide.md) and [the missing page](missing-page.md).\n",
            "guide.md": "# Guide\n",
        },
        ["index.md", "guide.md"],
    )
    failed_with(mkdocs_build(config, tmp_path / "site"), "index.md", "missing-page.md", "not found")


def test_a_link_to_a_missing_anchor_fails_the_build(tmp_path):
    config = site_copy(
        tmp_path,
        {
            "index.md": "# Home\n\nSee [its options](guide.md#no-such-section).\n",
            "guide.md": "# Guide\n\n## Options\n",
        },
        ["index.md", "guide.md"],
    )
    failed_with(mkdocs_build(config, tmp_path / "site"), "no-such-section")


def test_a_page_missing_from_the_nav_fails_the_build(tmp_path):
    config = site_copy(
        tmp_path,
        {"index.md": "# Home\n", "forgotten.md": "# A page nobody can reach\n"},
        ["index.md"],
    )
    failed_with(mkdocs_build(config, tmp_path / "site"), "forgotten.md", "nav")


def test_a_renamed_authoring_function_fails_the_build(tmp_path):
    """The real authoring page's ``:::`` entries, against a copy of workers/ where ``gather`` was renamed."""
    authoring = (ROOT / "docs" / "reference" / "authoring.md").read_text()
    blocks = re.findall(r"^::: .+\n(?:    .*\n)*", authoring, re.MULTILINE)
    assert any(block.startswith("::: workers.RunContext.gather\n") for block in blocks)
    config = site_copy(
        tmp_path,
        {"index.md": "# Authoring\n\n" + "\n".join(blocks)},
        ["index.md"],
        copied=("workers",),
    )
    context = tmp_path / "workers" / "context.py"
    source = context.read_text()
    assert "    def gather(\n" in source
    context.write_text(source.replace("    def gather(\n", "    def gather_children(\n"))

    failed_with(
        mkdocs_build(config, tmp_path / "site"), "workers.RunContext.gather", "could not be found"
    )


def test_an_environment_variable_without_a_comment_fails_the_build(tmp_path):
    config = site_copy(
        tmp_path,
        {"index.md": "# Home\n", "settings.md": "# Settings\n\n<!-- generated: settings -->\n"},
        ["index.md", "settings.md"],
        copied=("config",),
    )
    settings = tmp_path / "config" / "settings.py"
    settings.write_text(
        settings.read_text() + '\nRUNS_UNDOCUMENTED_KNOB = env_int("RUNS_UNDOCUMENTED_KNOB", 7)\n'
    )
    failed_with(mkdocs_build(config, tmp_path / "site"), "RUNS_UNDOCUMENTED_KNOB", "has no comment")


def test_a_generated_page_without_its_marker_fails_the_build(tmp_path):
    config = site_copy(
        tmp_path,
        {"index.md": "# Home\n", "reference/commands.md": "# Commands\n\nWritten by hand.\n"},
        ["index.md", "reference/commands.md"],
    )
    failed_with(mkdocs_build(config, tmp_path / "site"), "<!-- generated: commands -->")


# The settings generator, on a copy of a settings module.
def test_the_settings_scan_finds_a_new_variable_with_its_comment_and_default(tmp_path):
    (tmp_path / "config").mkdir()
    settings = (ROOT / "config" / "settings.py").read_text()
    (tmp_path / "config" / "settings.py").write_text(
        settings + "\n# How many answers a run may give.\n"
        'RUNS_ANSWERS = env_int("RUNS_ANSWERS", 42)\n'
        'RUNS_QUESTIONS = os.environ.get("RUNS_QUESTIONS", "")\n'
    )
    scan = ref_settings.scan(tmp_path, ("config",))

    answers = scan.variables["RUNS_ANSWERS"]
    assert answers.description == "How many answers a run may give."
    assert answers.default == "42"
    assert answers.settings == ["RUNS_ANSWERS"]
    assert "DATABASE_URL" in scan.variables and "RUNS_LEASE_SECONDS" in scan.variables
    assert [p.message for p in scan.problems if "RUNS_" in p.message] == [
        "the environment variable RUNS_QUESTIONS has no comment: write one above the line "
        "that reads it, saying what it does"
    ]


# The real site.
@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    result = mkdocs_build(ROOT / "mkdocs.yml", site)
    assert result.returncode == 0, result.stdout + result.stderr
    return site


def _text(site: Path, page: str) -> str:
    """A built page's article as text (tags dropped, entities kept simple)."""
    html = (site / page / "index.html").read_text()
    article = html[html.index("<article") : html.index("</article>")]
    return re.sub(r"<[^>]+>", "", article).replace("&amp;", "&").replace("&quot;", '"')


def test_the_real_site_builds_in_strict_mode(built_site):
    for page in ("", "reference/authoring/", "reference/http-api/", "reference/settings/"):
        assert (built_site / page / "index.html").is_file()
    authoring = _text(built_site, "reference/authoring")
    for name in ("agent", "step", "approval", "gather", "StepResult", "Retryable", "submit_run"):
        assert re.search(rf"\b{name}\b", authoring), name


def test_the_settings_page_lists_every_variable_the_settings_read(built_site):
    text = _text(built_site, "reference/settings")
    source = (ROOT / "config" / "settings.py").read_text()
    # Found by a pattern of their own, not by the generator's parser.
    read = set(re.findall(r"(?:env_\w+|os\.environ\.get)\(\s*\"([A-Z][A-Z0-9_]*)\"", source))
    assert {"DATABASE_URL", "RUNS_LEASE_SECONDS", "SECRET_KEY", "RUNS_EXAMPLES"} <= read
    missing = sorted(name for name in read if name not in text)
    assert not missing, f"the settings page leaves out {missing}"
    assert "FORWARDED_ALLOW_IPS" in text  # read by a command, not by the settings


def test_the_http_page_lists_every_operation_of_the_schema(built_site):
    from config.api import api

    schema = api.get_openapi_schema()
    text = _text(built_site, "reference/http-api")
    assert "POST /api/runs" in text
    for path, item in schema["paths"].items():
        for method in item:
            assert f"{method.upper()} {path}" in text, f"{method.upper()} {path}"
    for name in schema["components"]["schemas"]:
        assert name in text


def test_the_commands_page_lists_every_command(built_site):
    from django.core.management import get_commands

    text = _text(built_site, "reference/commands")
    files = {
        path.stem
        for package in PACKAGES
        for path in (ROOT / package).rglob("management/commands/*.py")
        if not path.name.startswith("_")
    }
    installed = {name for name, app in get_commands().items() if app.split(".")[0] in PACKAGES}
    assert {"runworker", "reap", "serve", "createapikey"} <= files
    assert installed <= files
    for name in files:
        assert f"manage.py {name}" in text, name
    assert "--concurrency" in text and "--burst" in text  # runworker's own arguments
