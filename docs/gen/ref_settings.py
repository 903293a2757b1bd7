"""The settings reference: every environment variable the project reads, found by parsing its source.

A read is a call of ``os.environ.get("NAME", default)``, ``os.getenv("NAME")``, ``os.environ["NAME"]``
or of a module's env helper (a function that passes its first parameter to ``os.environ.get``, such
as config/settings.py's ``env_int(name, default)``), with the name as a string literal. A helper that
looks its parameter up in a module-level dict (workers/llm/conf.py's ``DEFAULTS``) makes every key of
that dict a variable.

Each variable's description is the comment that documents the line reading it: a comment at the end
of the call's lines, the comment lines just above the call or the statement holding it (or one
holding that), the ``help=`` of the argparse option whose ``default=`` it is, or, when it names the
variable, a comment further up the same paragraph (no blank line between), the docstring of the
function reading it, or the comment of the statement calling that function. A variable none of its
reads documents is an error: the build fails until someone writes the comment.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

FOLDERS = ("config", "runs", "workers")
SKIPPED_PARTS = {"migrations", "__pycache__", "tests"}
# The settings module comes first: its descriptions and defaults are the ones shown.
FIRST = "config/settings.py"


@dataclass
class Read:
    """One place that reads an environment variable."""

    name: str
    path: str
    line: int
    default: str | None  # the default's source; None when the read has none
    setting: str | None  # the Django setting the read's statement assigns, if any
    description: str  # "" when nothing documents this read


@dataclass
class Variable:
    name: str
    reads: list[Read] = field(default_factory=list)

    @property
    def description(self) -> str:
        return next((read.description for read in self.reads if read.description), "")

    @property
    def default(self) -> str | None:
        return next((read.default for read in self.reads if read.default is not None), None)

    @property
    def settings(self) -> list[str]:
        return list(dict.fromkeys(read.setting for read in self.reads if read.setting))


@dataclass
class Problem:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Scan:
    variables: dict[str, Variable]
    problems: list[Problem]


def source_files(root: Path, folders: tuple[str, ...] = FOLDERS) -> list[Path]:
    files = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            if not SKIPPED_PARTS & set(path.relative_to(root).parts):
                files.append(path)
    return sorted(files, key=lambda p: (p.relative_to(root).as_posix() != FIRST, p.as_posix()))


def scan(root: Path, folders: tuple[str, ...] = FOLDERS) -> Scan:
    """Every variable read under ``folders`` of ``root``, and what is wrong with their documentation."""
    variables: dict[str, Variable] = {}
    problems: list[Problem] = []
    for path in source_files(root, folders):
        module = _Module(path, path.relative_to(root).as_posix())
        reads, module_problems = module.reads()
        problems += module_problems
        for read in reads:
            variables.setdefault(read.name, Variable(read.name)).reads.append(read)
    for variable in variables.values():
        if not variable.description:
            first = variable.reads[0]
            problems.append(
                Problem(
                    first.path,
                    first.line,
                    f"the environment variable {variable.name} has no comment: write one above "
                    "the line that reads it, saying what it does",
                )
            )
    return Scan(variables, problems)


def _is_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _environ_call(call: ast.Call) -> bool:
    """``os.environ.get(...)`` or ``os.getenv(...)``."""
    func = call.func
    return isinstance(func, ast.Attribute) and (
        (func.attr == "get" and _is_environ(func.value))
        or (func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os")
    )


def _string(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


class _Module:
    def __init__(self, path: Path, relative: str):
        self.relative = relative
        self.source = path.read_text()
        self.lines = self.source.splitlines()
        self.tree = ast.parse(self.source)
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.comments: dict[int, str] = {}  # line -> comment text
        self.full_line_comments: set[int] = set()
        for token in tokenize.generate_tokens(io.StringIO(self.source).readline):
            if token.type == tokenize.COMMENT:
                line = token.start[0]
                self.comments[line] = token.string.lstrip("#").strip()
                if not self.lines[line - 1][: token.start[1]].strip():
                    self.full_line_comments.add(line)
        self.helpers = self._helpers()

    # What reads the environment.
    def _helpers(self) -> dict[str, ast.FunctionDef]:
        """Functions that read the variable named by their first parameter."""
        helpers = {}
        for node in self.tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.args.args:
                continue
            param = node.args.args[0].arg
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Call)
                    and _environ_call(inner)
                    and inner.args
                    and isinstance(inner.args[0], ast.Name)
                    and inner.args[0].id == param
                ):
                    helpers[node.name] = node
        return helpers

    def reads(self) -> tuple[list[Read], list[Problem]]:
        reads: list[Read] = []
        problems: list[Problem] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                name_node, default_node = self._env_arguments(node)
                if name_node is None:
                    continue
                name = _string(name_node)
                if name is not None:
                    reads.append(self._read(name, node, default_node))
                elif not self._inside_helper(node):
                    problems.append(
                        Problem(
                            self.relative,
                            node.lineno,
                            "reads an environment variable whose name is not a string literal: "
                            "the settings reference cannot list it",
                        )
                    )
            elif (
                isinstance(node, ast.Subscript)
                and _is_environ(node.value)
                and isinstance(node.ctx, ast.Load)
            ):
                name = _string(node.slice)
                if name is not None:
                    reads.append(self._read(name, node, None))
        reads += self._defaults_dict_reads()
        reads.sort(key=lambda read: read.line)
        return reads, problems

    def _env_arguments(self, call: ast.Call) -> tuple[ast.AST | None, ast.AST | None]:
        if _environ_call(call):
            return (call.args[0] if call.args else None), (
                call.args[1] if len(call.args) > 1 else None
            )
        if isinstance(call.func, ast.Name) and call.func.id in self.helpers and call.args:
            helper = self.helpers[call.func.id]
            default = call.args[1] if len(call.args) > 1 else None
            if default is None:
                for keyword in call.keywords:
                    if len(helper.args.args) > 1 and keyword.arg == helper.args.args[1].arg:
                        default = keyword.value
            if default is None and len(helper.args.args) > 1 and helper.args.defaults:
                default = helper.args.defaults[-1]
            return call.args[0], default
        return None, None

    def _inside_helper(self, node: ast.AST) -> bool:
        function = self._enclosing_function(node)
        return function is not None and (
            function.name in self.helpers or self._dict_of_helper(function) is not None
        )

    def _dict_of_helper(self, function: ast.FunctionDef) -> ast.Dict | None:
        """The module-level dict a helper looks its parameter up in (``DEFAULTS[name]``), if any."""
        if not function.args.args:
            return None
        param = function.args.args[0].arg
        reads_environ = any(
            isinstance(n, ast.Call)
            and _environ_call(n)
            and n.args
            and isinstance(n.args[0], ast.Name)
            and n.args[0].id == param
            for n in ast.walk(function)
        )
        if not reads_environ:
            return None
        dicts = self._module_dicts()
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id in dicts
                and isinstance(node.slice, ast.Name)
                and node.slice.id == param
            ):
                return dicts[node.value.id]
        return None

    def _module_dicts(self) -> dict[str, ast.Dict]:
        found = {}
        for node in self.tree.body:
            target = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            elif isinstance(node, ast.AnnAssign):
                target = node.target
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
                found[target.id] = node.value
        return found

    def _defaults_dict_reads(self) -> list[Read]:
        reads = []
        for function in self.helpers.values():
            mapping = self._dict_of_helper(function)
            if mapping is None:
                continue
            for key, value in zip(mapping.keys, mapping.values, strict=True):
                name = _string(key)
                if name is None:
                    continue
                description = self._trailing(key.lineno, value.end_lineno) or self._above(
                    key.lineno
                )
                reads.append(
                    Read(
                        name=name,
                        path=self.relative,
                        line=key.lineno,
                        default=ast.get_source_segment(self.source, value),
                        setting=name,
                        description=description,
                    )
                )
        return reads

    # One read.
    def _read(self, name: str, node: ast.AST, default: ast.AST | None) -> Read:
        default_source = ast.get_source_segment(self.source, default) if default else None
        parent = self.parents.get(node)
        if isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.Or):
            later = parent.values[parent.values.index(node) + 1 :]
            if later:  # `os.environ.get("X") or default`
                default_source = " or ".join(
                    ast.get_source_segment(self.source, value) for value in later
                )
        return Read(
            name=name,
            path=self.relative,
            line=node.lineno,
            default=default_source,
            setting=self._setting(node),
            description=self._describe(name, node),
        )

    def _setting(self, node: ast.AST) -> str | None:
        """The module-level name assigned by the statement that (directly or by a call) reads ``node``."""
        statement = self._top_statement(node)
        if isinstance(statement, ast.FunctionDef):
            callers = self._callers(statement.name)
            return self._assigned(callers[0]) if len(callers) == 1 else None
        return self._assigned(statement)

    @staticmethod
    def _assigned(statement: ast.AST | None) -> str | None:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
            return target.id if isinstance(target, ast.Name) else None
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            return statement.target.id
        return None

    def _top_statement(self, node: ast.AST) -> ast.stmt | None:
        while node is not None and self.parents.get(node) is not self.tree:
            node = self.parents.get(node)
        return node

    def _enclosing_function(self, node: ast.AST) -> ast.FunctionDef | None:
        while node is not None:
            node = self.parents.get(node)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return None

    def _callers(self, function: str) -> list[ast.stmt]:
        return [
            statement
            for statement in self.tree.body
            if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == function
                for n in ast.walk(statement)
            )
        ]

    # Comments.
    def _trailing(self, first: int, last: int) -> str:
        texts = [
            self.comments[line]
            for line in range(first, last + 1)
            if line in self.comments and line not in self.full_line_comments
        ]
        return " ".join(texts)

    def _above(self, line: int) -> str:
        """The contiguous full-line comments just above ``line``."""
        texts = []
        line -= 1
        while line in self.full_line_comments:
            texts.insert(0, self.comments[line])
            line -= 1
        return " ".join(texts)

    def _describe(self, name: str, node: ast.AST) -> str:
        if description := self._trailing(node.lineno, node.end_lineno) or self._above(node.lineno):
            return description
        parent = self.parents.get(node)
        if isinstance(parent, ast.keyword) and parent.arg == "default":
            call = self.parents.get(parent)
            if isinstance(call, ast.Call):
                for keyword in call.keywords:
                    if keyword.arg == "help" and _string(keyword.value):
                        return _string(keyword.value)
        return self._describe_statement(name, node, seen=set())

    def _describe_statement(self, name: str, node: ast.AST, *, seen: set[str]) -> str:
        while node is not None:
            if isinstance(node, ast.stmt):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    return self._describe_function(name, node, seen=seen)
                if description := self._above(node.lineno):
                    return description
                for sibling in self._paragraph_before(node):
                    description = self._above(sibling.lineno)
                    if description and _names(description, name):
                        return description
            node = self.parents.get(node)
        return ""

    def _describe_function(self, name: str, function: ast.FunctionDef, *, seen: set[str]) -> str:
        for text in (self._above(function.lineno), ast.get_docstring(function) or ""):
            if text and _names(text, name):
                return " ".join(text.split())
        if function.name in seen:
            return ""
        seen.add(function.name)
        for caller in self._callers(function.name):
            if description := self._describe_statement(name, caller, seen=seen):
                return description
        return ""

    def _paragraph_before(self, statement: ast.stmt) -> list[ast.stmt]:
        """The statements above ``statement`` in its block with no blank line between, nearest first."""
        parent = self.parents.get(statement)
        siblings = None
        for field_name in ("body", "orelse", "finalbody"):
            block = getattr(parent, field_name, None)
            if isinstance(block, list) and statement in block:
                siblings = block
        if not siblings:
            return []
        before = []
        current = statement
        for sibling in reversed(siblings[: siblings.index(current)]):
            between = range(sibling.end_lineno + 1, current.lineno)
            if any(line not in self.full_line_comments for line in between):
                break
            before.append(sibling)
            current = sibling
        return before


def _names(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None


# Rendering.
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
IDENTIFIER = re.compile(r"(?<![\w`])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+(?:=[\w.-]+)?)(?![\w`])")


def prose(text: str) -> str:
    """A comment as Markdown: identifiers in code spans, and nothing read as HTML or emphasis."""
    text = text[:1].upper() + text[1:]
    out = []
    position = 0
    for match in CODE_SPAN.finditer(text):
        out.append(_plain(text[position : match.start()]))
        out.append(match.group(0))
        position = match.end()
    out.append(_plain(text[position:]))
    return "".join(out)


def _plain(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("*", r"\*")
    return IDENTIFIER.sub(r"`\1`", text)


def _default(default: str | None) -> str:
    if default is None:
        return "unset"
    if default in ('""', "''"):
        return "empty"
    return f"`{default}`"


def render(scan: Scan) -> str:
    variables = sorted(scan.variables.values(), key=lambda v: v.name)
    lines = [
        "## All variables",
        "",
        "| Variable | Default | Read in |",
        "| --- | --- | --- |",
    ]
    for variable in variables:
        places = ", ".join(sorted({f"`{read.path}`" for read in variable.reads}))
        lines.append(
            f"| [`{variable.name}`](#{variable.name.lower()}) | {_default(variable.default)} | {places} |"
        )
    lines += [""]
    by_file: dict[str, list[Variable]] = {}
    for variable in scan.variables.values():
        by_file.setdefault(variable.reads[0].path, []).append(variable)
    for path, group in by_file.items():
        lines += [f"## Read in `{path}`", ""]
        first_with: dict[str, Variable] = {}
        for variable in sorted(group, key=lambda v: v.reads[0].line):
            lines.append(f"### `{variable.name}` {{#{variable.name.lower()}}}")
            lines.append("")
            facts = [f"Default: {_default(variable.default)}."]
            if variable.settings:
                facts.append(
                    "Django setting: " + ", ".join(f"`{name}`" for name in variable.settings) + "."
                )
            places = ", ".join(f"`{read.path}:{read.line}`" for read in variable.reads)
            facts.append(f"Read at {places}.")
            lines += [" ".join(facts), ""]
            shared = first_with.setdefault(variable.description, variable)
            if shared is not variable:
                lines.append(f"Described with [`{shared.name}`](#{shared.name.lower()}) above.")
            else:
                lines.append(prose(variable.description))
            lines.append("")
    return "\n".join(lines)
