"""``/api/docs``: the Swagger UI of the JSON API, for someone who may use the API, served from here.

The page needs a bearer token or a dashboard session; its assets are the ``fastapi-offline`` package's
Swagger UI files, served under ``/api/docs/assets``. The spec stays at ``/openapi.json``.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from remediation.api.auth import browser_principal, header_token, identify
from remediation.api.ui import LoginRequired

DOCS = "/api/docs"
ASSETS = f"{DOCS}/assets"
SWAGGER_UI = Path(fastapi_offline.__file__).parent / "static"

router = APIRouter(include_in_schema=False)


@router.get(DOCS)
def swagger_ui(request: Request) -> HTMLResponse:
    known = identify(header_token(request), request.app.state.settings.api) or browser_principal(request)
    if known is None:
        raise LoginRequired(DOCS)
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url or "/openapi.json",
        title=f"{request.app.title}: API",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon.png",
    )


def mount_docs(app: FastAPI) -> None:
    """The docs page and the Swagger UI files it loads (the files are public: no data in them)."""
    app.include_router(router)
    app.mount(ASSETS, StaticFiles(directory=SWAGGER_UI), name="swagger-ui")
