"""The management commands reference: every command of the project's apps, from its argparse parser.

Commands are found as files (``<package>/management/commands/<name>.py`` under config/, runs/ and
workers/), so a new command appears here whether or not its app is installed; each is described
by the parser Django builds for it (``Command().create_parser``), so its help and its arguments
are the ones ``manage.py <name> --help`` prints.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

FOLDERS = ("config", "runs", "workers")


@dataclass
class Command:
    name: str
    app: str  # the package holding management/commands/
    path: str
    help: str
    usage: str
    arguments: list[argparse.Action]


def command_files(root: Path, folders: tuple[str, ...] = FOLDERS) -> list[tuple[str, str, str]]:
    """``(name, app package, relative path)`` of every command file, by name."""
    found = []
    for folder in folders:
        for path in (root / folder).rglob("management/commands/*.py"):
            if path.name.startswith("_"):
                continue
            relative = path.relative_to(root)
            app = ".".join(relative.parts[:-3])
            found.append((path.stem, app, relative.as_posix()))
    return sorted(found)


def load(root: Path, folders: tuple[str, ...] = FOLDERS) -> list[Command]:
    """Each command's parser (Django must be set up)."""
    from django.core.management import load_command_class
    from django.core.management.base import BaseCommand

    common = {action.dest for action in BaseCommand().create_parser("manage.py", "x")._actions}
    commands = []
    for name, app, path in command_files(root, folders):
        command = load_command_class(app, name)
        parser = command.create_parser("manage.py", name)
        own = [action for action in parser._actions if action.dest not in common]
        commands.append(
            Command(
                name=name,
                app=app,
                path=path,
                help=str(command.help or "").strip(),
                usage=_usage(f"manage.py {name}", own),
                arguments=own,
            )
        )
    return commands


def _usage(prog: str, actions: list[argparse.Action]) -> str:
    """The usage line of the command's own arguments (Django's common options left out), 80 wide."""
    formatter = argparse.HelpFormatter(prog, width=80)
    formatter.add_usage(None, actions, [], prefix="")
    return formatter.format_help().strip()


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", r"\|")


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(f"`{option}`" for option in action.option_strings)
        if action.nargs != 0:
            names += f" `{action.metavar or action.dest.upper()}`"
        return names
    return f"`{action.metavar or action.dest}`"


def _details(action: argparse.Action) -> str:
    parts = [_cell(action.help or "")] if action.help and action.help != argparse.SUPPRESS else []
    if action.choices:
        parts.append("one of " + ", ".join(f"`{choice}`" for choice in action.choices))
    shown_default = action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0
    if shown_default and "default" not in (action.help or ""):
        default = (
            ",".join(map(str, action.default))
            if isinstance(action.default, list | tuple)
            else action.default
        )
        parts.append(f"default `{default}`")
    if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
        parts.append("required")
    return "; ".join(parts)


def render(commands: list[Command]) -> str:
    lines = ["## Commands", "", "| Command | What it does |", "| --- | --- |"]
    for command in commands:
        lines.append(f"| [`{command.name}`](#{command.name}) | {_cell(command.help)} |")
    lines.append("")
    for command in commands:
        lines += [
            f"## `{command.name}` {{#{command.name}}}",
            "",
            command.help,
            "",
            "```text",
            command.usage,
            "```",
            "",
            f"Defined in `{command.path}`.",
            "",
        ]
        if command.arguments:
            lines += ["| Argument | Description |", "| --- | --- |"]
            lines += [
                f"| {_argument(action)} | {_details(action)} |" for action in command.arguments
            ]
        else:
            lines.append("No arguments of its own.")
        lines.append("")
    return "\n".join(lines)
