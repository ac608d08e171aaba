"""Schema post-processing: every error an API operation can answer is in the schema, in the one error shape.

Views document the errors of their own logic (``npuportal.api.errors.error_responses``).
The ones that come from the framework around them are the same for every
operation of a kind, so they are added here rather than repeated on each view:

* 400 where there are query parameters (a filter or ``limit`` it cannot read) or a body;
* 401 everywhere (every operation needs a signed-in user) and 429 (throttling) everywhere;
* 403 on writes (a session without its CSRF token) besides those a role may not make;
* 404 where the path names an object;
* 413 and 415 where there is a body (too large; not ``application/json``).

An operation that can answer CSV (``?format=csv``) answers its errors as CSV too.

Free-text input (request body strings, string query parameters) gets the pattern
``^[^\x00]*$``: every text field refuses a NUL character (PostgreSQL cannot store
one), so a client reading the schema knows the value will be refused.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.plumbing import get_lib_doc_excludes

ERROR_REF = {"$ref": "#/components/schemas/Error"}

_DESCRIPTIONS = {
    400: "Bad input: `field` names the first offending field (body or query parameter)",
    401: "Not signed in (no or a bad token)",
    403: "Signed in, but your role may not do this (or a session write without its CSRF token)",
    404: "No such object, or it belongs to another team",
    413: "The body is larger than the server takes",
    415: "The body is not `application/json`",
    429: "Throttled: too many requests; retry after the `Retry-After` seconds",
}


def doc_excludes() -> list[Any]:
    """Classes whose docstrings are not operation descriptions: drf-spectacular's, and our API bases.

    ``FormatSuffixes`` is a base of every viewset; its docstring is for the code's readers.
    """
    from npuportal.api.parsers import FormatSuffixes

    return [*get_lib_doc_excludes(), FormatSuffixes]


_WRITES = {"post", "put", "patch", "delete"}

NO_NUL = "^[^\\x00]*$"


def _forbid_nul(schema: dict[str, Any]) -> None:
    """Add :data:`NO_NUL` to a plain string schema (one with no format, enum or pattern of its own)."""
    if schema.get("type") == "string" and not {"format", "enum", "pattern", "readOnly"} & set(schema):
        schema["pattern"] = NO_NUL


def _codes(path: str, method: str, operation: dict[str, Any]) -> list[int]:
    codes = [401, 429]
    has_query = any(p.get("in") == "query" for p in operation.get("parameters", []))
    has_body = "requestBody" in operation
    if has_query or has_body:
        codes.append(400)
    if method in _WRITES:
        codes.append(403)
    if "{" in path:
        codes.append(404)
    if has_body:
        codes += [413, 415]
    return codes


def document_errors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular ``POSTPROCESSING_HOOKS`` entry: add the framework's error responses."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request"):
            component.setdefault("additionalProperties", False)  # npuportal.api.fields.InputSerializer
            for prop in component.get("properties", {}).values():
                _forbid_nul(prop)
                if isinstance(prop.get("items"), dict):
                    _forbid_nul(prop["items"])
    for path, item in result.get("paths", {}).items():
        if not path.startswith("/api/"):
            continue
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "query" and isinstance(parameter.get("schema"), dict):
                    _forbid_nul(parameter["schema"])
            responses = operation["responses"]
            csv = any("text/csv" in (r.get("content") or {}) for code, r in responses.items() if code.startswith("2"))
            for code in _codes(path, method, operation):
                responses.setdefault(
                    str(code),
                    {"content": {"application/json": {"schema": ERROR_REF}}, "description": _DESCRIPTIONS[code]},
                )
            if csv:
                for code, response in responses.items():
                    if code.startswith(("4", "5")):
                        response.setdefault("content", {}).setdefault("text/csv", {"schema": {"type": "string"}})
            operation["responses"] = dict(sorted(responses.items()))
    return result
