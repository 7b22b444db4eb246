"""Every route of the dashboard and its parameters, read from the application itself."""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.routing import Mount


def every_operation(app: FastAPI) -> list[dict[str, Any]]:
    """(method, path, query / path parameter names, body kind and its fields) of every
    route of *app*: the OpenAPI schema of all its API routes, hidden ones included,
    plus its other routes (the schema itself, static files)."""
    routes = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            shown = copy.copy(route)
            shown.include_in_schema = True
            routes.append(shown)
    schema = get_openapi(title="walk", version="0", routes=routes)
    components = schema.get("components", {}).get("schemas", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return components[ref.rsplit("/", 1)[1]] if ref else node

    operations = []
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            body_kind, fields = None, []
            for kind, content in (op.get("requestBody") or {}).get("content", {}).items():
                body_kind = kind
                fields = list(resolve(content["schema"]).get("properties", {}))
            operations.append(
                {
                    "method": method.upper(),
                    "path": path,
                    "query": [p["name"] for p in op.get("parameters", []) if p["in"] == "query"],
                    "path_params": [
                        p["name"] for p in op.get("parameters", []) if p["in"] == "path"
                    ],
                    "body": body_kind,
                    "fields": fields,
                }
            )
    for route in app.routes:
        if isinstance(route, Mount):
            operations.append(
                {"method": "GET", "path": route.path + "/{path}", "query": [],
                 "path_params": ["path"], "body": None, "fields": []}
            )  # fmt: skip
        elif not isinstance(route, APIRoute):
            operations.append(
                {"method": "GET", "path": route.path, "query": [], "path_params": [],
                 "body": None, "fields": []}
            )  # fmt: skip
    return operations
