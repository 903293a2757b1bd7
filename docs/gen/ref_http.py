"""The HTTP API reference: every operation of the project's OpenAPI schema, as Markdown.

The schema is django-ninja's (``config.api.api.get_openapi_schema()``), so an endpoint added,
renamed or given another answer appears here at the next build.
"""

from __future__ import annotations

import re
from typing import Any

METHODS = ("get", "post", "put", "patch", "delete")


def operations(schema: dict) -> list[tuple[str, str, dict]]:
    """``(method, path, operation)`` for every operation, in the schema's order."""
    return [
        (method, path, operation)
        for path, item in schema.get("paths", {}).items()
        for method, operation in item.items()
        if method in METHODS
    ]


def anchor(method: str, path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")


def schema_anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _cell(text: str) -> str:
    """Text fit for a table cell: one line, no column separator."""
    return " ".join(str(text).split()).replace("|", r"\|")


def type_of(schema: dict | None) -> str:
    """A JSON schema as a few words of Markdown, with links to the named schemas."""
    if not schema:
        return "any"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{schema_anchor(name)})"
    for combinator in ("anyOf", "oneOf", "allOf"):
        if combinator in schema:
            return " or ".join(type_of(option) for option in schema[combinator])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"array of {type_of(schema.get('items'))}"
    if "format" in schema:
        return f"{kind} ({schema['format']})"
    return kind


def constraints(schema: dict) -> str:
    """Bounds and defaults of a value (looking inside ``anyOf``), in words."""
    parts = []
    options = [schema, *schema.get("anyOf", []), *schema.get("oneOf", [])]
    for option in options:
        if "minLength" in option or "maxLength" in option:
            low, high = option.get("minLength"), option.get("maxLength")
            parts.append(
                f"{low}–{high} characters"
                if low is not None and high is not None
                else f"at most {high} characters"
                if high is not None
                else f"at least {low} characters"
            )
        low = option.get("minimum", option.get("exclusiveMinimum"))
        high = option.get("maximum", option.get("exclusiveMaximum"))
        if low is not None and high is not None:
            parts.append(f"{low}–{high}" + (" (exclusive)" if "exclusiveMaximum" in option else ""))
        elif low is not None:
            parts.append(f"≥ {low}")
        elif high is not None:
            parts.append(f"≤ {high}")
        if "pattern" in option:
            parts.append(f"matches `{option['pattern']}`")
    if "default" in schema:
        parts.append(f"default `{schema['default']!r}`".replace("'", '"'))
    return "; ".join(parts)


def _body(content: dict[str, Any] | None) -> str:
    if not content:
        return "no body"
    return "; ".join(
        f"{type_of(media.get('schema'))} (`{media_type}`)" for media_type, media in content.items()
    )


def _responses(operation: dict) -> dict[str, dict]:
    merged: dict[str, dict] = {}
    for status, response in operation.get("responses", {}).items():
        key = str(status)
        if key in merged and "content" in merged[key] and "content" not in response:
            continue
        merged[key] = response
    return dict(sorted(merged.items()))


def _security(operation: dict, schemes: dict) -> str:
    requirements = operation.get("security")
    if not requirements:
        return "none"
    names = []
    for requirement in requirements:
        for name in requirement:
            scheme = schemes.get(name, {})
            if scheme.get("type") == "http" and scheme.get("scheme") == "bearer":
                names.append("an API key (`Authorization: Bearer <key>`) or a dashboard session")
            else:
                names.append(f"`{name}`")
    return ", or ".join(dict.fromkeys(names))


def render(schema: dict) -> str:
    ops = operations(schema)
    schemes = schema.get("components", {}).get("securitySchemes", {})
    lines = [
        "## Endpoints",
        "",
        "| Method | Path | Summary |",
        "| --- | --- | --- |",
    ]
    for method, path, operation in ops:
        lines.append(
            f"| `{method.upper()}` | [`{path}`](#{anchor(method, path)}) "
            f"| {_cell(operation.get('summary', ''))} |"
        )
    lines.append("")

    groups: dict[str, list[tuple[str, str, dict]]] = {}
    for method, path, operation in ops:
        tags = operation.get("tags") or ["Operations"]
        groups.setdefault(tags[0], []).append((method, path, operation))
    for tag, group in groups.items():
        lines += [f"## {tag}", ""]
        for method, path, operation in group:
            lines += _operation(method, path, operation, schemes)

    components = schema.get("components", {}).get("schemas", {})
    if components:
        lines += ["## Schemas", ""]
        for name, component in components.items():
            lines += _component(name, component)
    return "\n".join(lines)


def _operation(method: str, path: str, operation: dict, schemes: dict) -> list[str]:
    lines = [f"### `{method.upper()} {path}` {{#{anchor(method, path)}}}", ""]
    if operation.get("summary"):
        lines += [f"**{operation['summary']}**", ""]
    if operation.get("description"):
        lines += [operation["description"].strip(), ""]
    lines += [f"Authentication: {_security(operation, schemes)}.", ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += [
            "| Parameter | In | Type | Required | Description |",
            "| --- | --- | --- | --- | --- |",
        ]
        for parameter in parameters:
            schema = parameter.get("schema", {})
            description = "; ".join(
                part
                for part in (
                    _cell(parameter.get("description") or schema.get("description", "")),
                    constraints(schema),
                )
                if part
            )
            lines.append(
                f"| `{parameter['name']}` | {parameter['in']} | {_cell(type_of(schema))} "
                f"| {'yes' if parameter.get('required') else 'no'} | {description} |"
            )
        lines.append("")
    body = operation.get("requestBody")
    if body:
        required = "required" if body.get("required") else "optional"
        lines += [f"Request body ({required}): {_body(body.get('content'))}.", ""]
    lines += ["| Status | Meaning | Body |", "| --- | --- | --- |"]
    # Errors with the same body share a row (every error is an ErrorOut).
    rows: list[tuple[list[str], list[str], str]] = []
    for status, response in _responses(operation).items():
        body = _body(response.get("content"))
        meaning = response.get("description", "")
        if rows and status >= "400" and rows[-1][0][-1] >= "400" and rows[-1][2] == body:
            rows[-1][0].append(status)
            rows[-1][1].append(meaning)
        else:
            rows.append(([status], [meaning], body))
    for statuses, meanings, body in rows:
        lines.append(
            f"| {' '.join(f'`{status}`' for status in statuses)} "
            f"| {_cell(', '.join(meanings))} | {_cell(body)} |"
        )
    lines.append("")
    return lines


def _component(name: str, component: dict) -> list[str]:
    lines = [f"### `{name}` {{#{schema_anchor(name)}}}", ""]
    if component.get("description"):
        lines += [component["description"].strip(), ""]
    properties = component.get("properties")
    if not properties:
        lines += [f"Type: {type_of({k: v for k, v in component.items() if k != 'title'})}.", ""]
        return lines
    required = set(component.get("required", []))
    lines += ["| Field | Type | Required | Description |", "| --- | --- | --- | --- |"]
    for field, schema in properties.items():
        description = "; ".join(
            part for part in (_cell(schema.get("description", "")), constraints(schema)) if part
        )
        lines.append(
            f"| `{field}` | {_cell(type_of(schema))} | {'yes' if field in required else 'no'} "
            f"| {description} |"
        )
    lines.append("")
    return lines
