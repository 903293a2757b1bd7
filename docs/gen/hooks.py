"""MkDocs hooks (mkdocs.yml ``hooks:``): the reference pages that are generated from the code.

A page holds a marker, ``<!-- generated: NAME -->``, where the hook writes the generated part:

- ``http-api`` (docs/reference/http-api.md): every operation of the django-ninja API's OpenAPI schema;
- ``settings`` (docs/reference/settings.md): every environment variable read in config/, runs/ and
  workers/, with its default and its comment (a variable without a comment fails the build);
- ``commands`` (docs/reference/commands.md): every management command with its arguments.

Problems are logged as warnings, which ``strict: true`` turns into a failed build.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import get_plugin_logger

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ref_commands  # noqa: E402
import ref_http  # noqa: E402
import ref_settings  # noqa: E402

log = get_plugin_logger("agentruns")

MARKER = re.compile(r"<!--\s*generated:\s*([\w-]+)\s*-->")
# The pages that must hold their generator's marker, and so cannot lose the generated part.
PAGES = {
    "reference/http-api.md": "http-api",
    "reference/settings.md": "settings",
    "reference/commands.md": "commands",
}

_root: Path | None = None


def on_config(config):
    global _root
    _root = Path(config.config_file_path).resolve().parent
    _setup_django(_root)
    return config


def _setup_django(root: Path) -> None:
    """Django configured as a production process would be, without a database connection."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    # The documentation describes the project, not the shell it is built from: no examples, no test
    # kinds; DEBUG so that no secret key is needed. Nothing connects to DATABASE_URL.
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["DEBUG"] = "1"
    os.environ["RUNS_EXAMPLES"] = "0"
    os.environ["AGENT_MODULES"] = ""
    os.environ.setdefault("DATABASE_URL", "postgres://docs@localhost:5432/docs")
    import django

    try:
        django.setup()
    except Exception as exc:  # a readable line rather than a traceback inside MkDocs
        raise PluginError(f"docs/gen/hooks.py: Django could not be set up: {exc!r}") from exc


def _http_api() -> str:
    from config.api import api

    return ref_http.render(api.get_openapi_schema())


def _settings() -> str:
    scan = ref_settings.scan(_root)
    for problem in scan.problems:
        log.warning("reference/settings.md: %s", problem)
    return ref_settings.render(scan)


def _commands() -> str:
    return ref_commands.render(ref_commands.load(_root))


GENERATORS = {"http-api": _http_api, "settings": _settings, "commands": _commands}


def on_page_markdown(markdown, page, config, files):
    src = page.file.src_uri
    names = MARKER.findall(markdown)
    expected = PAGES.get(src)
    if expected and expected not in names:
        log.warning(
            "%s: the marker <!-- generated: %s --> is missing, so the page would lack its "
            "generated reference; put it back where the generated part belongs",
            src,
            expected,
        )

    def replace(match: re.Match) -> str:
        name = match.group(1)
        generator = GENERATORS.get(name)
        if generator is None:
            log.warning("%s: unknown generator %r in %s", src, name, match.group(0))
            return ""
        return generator()

    return MARKER.sub(replace, markdown)
