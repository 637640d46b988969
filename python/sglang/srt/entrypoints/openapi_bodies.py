"""Request bodies in `/openapi.json`.

The POST routes parse their JSON bodies themselves (`parse_body`, whatever the
Content-Type), so FastAPI cannot see the models. `install_body_schemas` adds each
route's request body to the generated document, with the models' definitions
under `components/schemas`, so clients and API fuzzers see the real schema.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_REF_TEMPLATE = "#/components/schemas/{model}"


def install_body_schemas(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> None:
    """Make `app.openapi()` describe the JSON body of each POST route in `bodies`."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app, bodies)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for path, model in bodies.items():
        operation = doc["paths"].get(path, {}).get("post")
        if operation is None:
            continue
        schema = model.model_json_schema(ref_template=_REF_TEMPLATE)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": _REF_TEMPLATE.format(model=model.__name__)}}
            },
        }
    return doc
