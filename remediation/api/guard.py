"""Authenticate, then cap, every request body before anything reads it.

A pure ASGI middleware in front of the routes: a request with a body must first show a known bearer token
(``/api``) or a live session (else 401 or a redirect to the login page), and a body over the cap is a 413.
The login form is the one body taken without credentials. Roles are still the routes' job.

Why: docs/running.md#the-api-and-the-dashboard
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from remediation.api.auth import browser_principal, identify

LOGIN_PATH = "/login"
LOGIN_MAX_BYTES = 16384  # the login form: a token, a name and a local path


class BodyTooLarge(HTTPException):
    def __init__(self, cap: int) -> None:
        super().__init__(413, f"request body larger than {cap} bytes")


class BodyGuard:
    """The middleware; ``max_bytes`` caps every body but the login form's."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        path: str = scope["path"]
        cap = LOGIN_MAX_BYTES if path == LOGIN_PATH else self.max_bytes
        try:
            length = int(declared) if declared is not None else 0
        except ValueError:
            await _answer(send, 400, {"detail": "Content-Length is not a number"})
            return
        if (chunked or length > 0) and path != LOGIN_PATH and not await self._known(scope):
            await _refuse(scope, send)
            return
        if length > cap:
            await _answer(send, 413, {"detail": f"request body larger than {cap} bytes"})
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    raise BodyTooLarge(cap)
            return message

        await self.app(scope, counted, send)

    async def _known(self, scope: Scope) -> bool:
        request = Request(scope)  # headers and cookies only: no receive, so it cannot read the body
        if scope["path"].startswith("/api/"):
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else None
            return identify(token, request.app.state.settings.api) is not None
        # A session lives in the database: look it up off the event loop.
        return await run_in_threadpool(browser_principal, request) is not None


async def _refuse(scope: Scope, send: Send) -> None:
    if scope["path"].startswith("/api/"):
        await _answer(
            send,
            401,
            {"detail": "a valid bearer token must come before a body"},
            extra=[(b"www-authenticate", b"Bearer")],
        )
        return
    location = "/login?" + urlencode({"next": scope["path"]})
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [(b"location", location.encode()), (b"content-length", b"0")],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def _answer(
    send: Send, status: int, body: dict[str, str], *, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
