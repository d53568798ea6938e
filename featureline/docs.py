"""The user guide's generated pages: the configuration reference, read from the settings
models (every key, its type, its default and the comment above it in the model's source),
and the API reference, read from the OpenAPI document (docs/ARCHITECTURE.md, "The user
guide"). Generated at every build, they cannot drift from the code."""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

# A field of a settings model: four spaces in, a name, an annotation.
_FIELD = re.compile(r"^    ([a-z_][a-z0-9_]*)\s*:")
_COMMENT = re.compile(r"^    #\s?(.*)$")


@dataclass(frozen=True)
class Key:
    """One key of a settings file: its dotted path (``etl.source.path``; ``[]`` for the items
    of a list: ``etl.features[].columns``), its type, default and comment."""

    path: str
    type: str
    default: str
    comment: str
    section: bool = False


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The comment lines right above each field of ``model`` (and its bases), joined."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            lines = inspect.getsource(cls).splitlines()
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in lines:
            comment, field = _COMMENT.match(line), _FIELD.match(line)
            if comment:
                above.append(comment.group(1).strip())
                continue
            if field and above:
                found[field.group(1)] = " ".join(above)
            above = []
    return found


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The settings models a field holds: itself, its list's items, a union's members."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        for model in _models_in(arg):
            if model not in found:
                found.append(model)
    return found


def _type_text(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(json.dumps(arg) for arg in args)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_type_text(arg) for arg in args))
    if origin is list:
        return f"list of {_type_text(args[0])}"
    if origin is dict:
        return f"map of {_type_text(args[0])} to {_type_text(args[1])}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default_text(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        names = (str(getattr(item, "op", type(item).__name__)) for item in value)
        return "[" + ", ".join(names) + "]"
    return json.dumps(value if not hasattr(value, "isoformat") else value.isoformat())


def keys(model: type[BaseModel], prefix: str = "") -> Iterator[Key]:
    """Every key of ``model``'s file, sections before their keys, in the model's order."""
    comments = _comments(model)
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        nested = _models_in(field.annotation)
        is_list = typing.get_origin(field.annotation) is list
        comment = field.description or comments.get(name, "")
        if nested and not comment and nested[0].__doc__ and not is_list:
            comment = " ".join(nested[0].__doc__.split())
        yield Key(path, _type_text(field.annotation), _default_text(field), comment,
                  section=bool(nested))
        inner = f"{path}[]." if is_list else f"{path}."
        seen: set[str] = set()
        for item in nested:
            for key in keys(item, inner):
                if key.path not in seen:  # the ops of a list share op and short_names
                    seen.add(key.path)
                    yield key


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: list[Key]) -> list[str]:
    lines = ["| key | type | default | what it sets |", "|---|---|---|---|"]
    for key in rows:
        default = f"`{_cell(key.default)}`" if key.default else ""
        lines.append(f"| `{key.path}` | {_cell(key.type)} | {default} | {_cell(key.comment)} |")
    return lines


def configuration_reference() -> str:
    """The configuration reference page: every key of ``featureline.yaml`` and of the
    parameter server's ``hps.yaml``, from their models."""
    from featureline.config import SHARED_SECTIONS, FeaturelineConfig
    from featureline.etl.config import OP_SETTINGS
    from featureline.hps.config import HpsConfig

    lines = [
        "# Configuration reference",
        "",
        "Generated from the settings models at every build of this guide: every key, its "
        "type, its default and what it sets. Unknown keys are errors; a wrong value is an "
        "error naming its key, before any work starts ([Configuration](../configuration.md)).",
        "",
    ]
    ops = {key.path for op in OP_SETTINGS for key in keys(op, "etl.features[].")}
    every = list(keys(FeaturelineConfig))
    for name in FeaturelineConfig.model_fields:
        rows = [key for key in every if key.path == name
                or key.path.startswith((f"{name}.", f"{name}[]."))]
        if name == "etl":  # the ops below; the top-level shared sections are copied in
            rows = [key for key in rows if key.path not in ops and not key.path.startswith(
                tuple(f"etl.{section}" for section in SHARED_SECTIONS))]
        lines += [f"## `{name}`", "", *_table(rows), ""]
        if name == "etl":
            lines += ["### `etl.features`: the ops", "",
                      "Each item names its `op`; the keys each op takes:", ""]
            for op in OP_SETTINGS:
                op_name = typing.get_args(op.model_fields["op"].annotation)[0]
                doc = " ".join((op.__doc__ or "").split())
                lines += [f"#### `{op_name}`", "", *([doc, ""] if doc else []),
                          *_table(list(keys(op, "etl.features[]."))), ""]
    lines += ["## `hps.yaml`: the parameter server", "",
              "A file of its own (`api.hps` names it); its keys sit under `hps:`.", "",
              *_table(list(keys(HpsConfig, "hps."))), ""]
    return "\n".join(lines)


def _schema_text(schema: dict[str, Any]) -> str:
    """A JSON schema as a short type: a link to a named schema, ``array of …``, ``a or b``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(dict.fromkeys(_schema_text(part) for part in schema["anyOf"]))
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_schema_text(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of string to {_schema_text(schema['additionalProperties'])}"
    if "enum" in schema:
        return " or ".join(json.dumps(value) for value in schema["enum"])
    return str(kind)


def _body_schema(content: dict[str, Any]) -> str:
    return ", ".join(f"{_schema_text(media.get('schema', {}))} (`{kind}`)"
                     for kind, media in content.items())


def api_reference(openapi: dict[str, Any] | None = None) -> str:
    """The API reference page from the service's OpenAPI document: every operation, its
    parameters, body and responses, then every schema's fields."""
    if openapi is None:
        from featureline.api.app import create_app

        openapi = create_app().openapi()
    lines = [
        "# API reference",
        "",
        f"{openapi['info']['title']} {openapi['info']['version']}, generated from its OpenAPI "
        "document at every build of this guide (a running server serves the same document at "
        "`/openapi.json`, with Swagger UI at `/docs`). How the endpoints behave: "
        "[The ranking API](../api.md).",
        "",
    ]
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            lines += [f"## `{method.upper()} {path}`", "", operation.get("summary", ""), ""]
            if operation.get("description"):
                lines += [" ".join(operation["description"].split()), ""]
            parameters = operation.get("parameters", [])
            if parameters:
                lines += ["| parameter | in | type | required |", "|---|---|---|---|"]
                lines += [f"| `{p['name']}` | {p['in']} | "
                          f"{_cell(_schema_text(p.get('schema', {})))} | "
                          f"{'yes' if p.get('required') else 'no'} |" for p in parameters]
                lines.append("")
            body = operation.get("requestBody")
            if body:
                lines += [f"Request body: {_body_schema(body.get('content', {}))}", ""]
            lines += ["| status | meaning | body |", "|---|---|---|"]
            for status, response in operation.get("responses", {}).items():
                lines.append(f"| {status} | {response.get('description', '')} | "
                             f"{_cell(_body_schema(response.get('content', {})))} |")
            lines.append("")
    lines += ["## Schemas", ""]
    for name, schema in openapi.get("components", {}).get("schemas", {}).items():
        lines += [f"### {name}", ""]
        if schema.get("description"):
            lines += [" ".join(schema["description"].split()), ""]
        properties = schema.get("properties", {})
        if properties:
            required = set(schema.get("required", []))
            lines += ["| field | type | required | description |", "|---|---|---|---|"]
            for field, spec in properties.items():
                lines.append(f"| `{field}` | {_cell(_schema_text(spec))} | "
                             f"{'yes' if field in required else 'no'} | "
                             f"{_cell(' '.join(spec.get('description', '').split()))} |")
            lines.append("")
    return "\n".join(lines)


# A Markdown link: [text](target).
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


# Repository files a page links to, and the site's page for each (README.md is the home page).
SITE_PAGES = {"README.md": "index.md", "benchmarks/README.md": "benchmarks.md",
              "featureline.yaml": "reference/configuration.md",
              "api/models.py": "reference/api.md"}


def site_markdown(text: str, folder: str = "") -> str:
    """A repository page as a page of the site. ``folder``: the page's folder in the
    repository (``docs`` for the guide's pages; the README's and benchmarks/README.md's
    links start at the root). A link into docs/ points at the site's page; a link to a
    file the site renders (:data:`SITE_PAGES`: the benchmarks, the annotated
    featureline.yaml as the configuration reference, the API's models as the API reference)
    at that page; a link to any other file of the repository keeps its text only. A guide
    page's links to its neighbours stay as they are."""

    def relink(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if target.startswith(("http://", "https://", "#", "mailto:")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        if folder:
            if not path.startswith("../"):
                return match.group(0)  # a neighbour in the guide
            path = path.removeprefix("../")
        suffix = f"#{anchor}" if anchor else ""
        if path.startswith("docs/"):
            return f"[{label}]({path.removeprefix('docs/')}{suffix})"
        if path in SITE_PAGES:
            return f"[{label}]({SITE_PAGES[path]}{suffix})"
        return label

    return _LINK.sub(relink, text)
