"""HTTP for the fake kube-apiserver: routing, Status errors, auth, fault injection and watch streams.

Bearer token first (401), then an injected fault, then the route; errors are ``Status`` bodies. Watches
are chunked event streams honouring ``resourceVersion``, ``timeoutSeconds`` and ``allowWatchBookmarks``,
ended by a 410 Expired ERROR event when the history is gone.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from remediation.simulator.kube.discovery import (
    AGGREGATED,
    SERVER_VERSION,
    Resource,
    aggregated,
    api_group,
    api_group_list,
    api_versions,
    resource_for,
    resource_list,
    wants_aggregated,
)
from remediation.simulator.kube.pages import bad_request, parse_limit
from remediation.simulator.kube.select import SelectorError, field_selector, label_selector
from remediation.simulator.kube.store import ApiError, Obj, Record, status
from remediation.simulator.kube.table import table, wants_table

if TYPE_CHECKING:
    from remediation.simulator.kube.api import KubeAPIServer

REASONS = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any
    status: int = 0


class Handler(BaseHTTPRequestHandler):
    api: KubeAPIServer
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as the client expects
    disable_nagle_algorithm = True  # headers and body go out in separate writes; don't stall 40 ms

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # the request log is the record; stderr noise would drown test output

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    # ------------------------------------------------------------------------ plumbing
    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        content_type = self.headers.get("Content-Type", "")
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        # Logged just before the response goes out, so a client that got its answer sees its entry.
        self._entry = Request(method, url.path, query, content_type, body)
        try:
            auth = self.headers.get("Authorization")
            # Anonymous requests may read the public paths; a token, if sent, must be right.
            if (auth is not None or url.path not in PUBLIC) and auth != f"Bearer {self.api.token}":
                raise ApiError(status(401, "Unauthorized", "Unauthorized"))
            fault = self.api._take_fault(method, url.path)
            if fault is not None:
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                details = {"retryAfterSeconds": fault.retry_after} if fault.retry_after is not None else None
                reason = REASONS.get(fault.status, "Unknown")
                raise ApiError(status(fault.status, reason, f"injected {reason}", details=details), headers)
            _route(self, replace(self._entry, path=url.path.rstrip("/")))
        except ApiError as exc:
            self._send(exc.code, exc.body, exc.headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-stream (a stopped watch)

    def _log(self, code: int) -> None:
        self.api._record(replace(self._entry, status=code))

    def _send(
        self,
        code: int,
        body: Obj,
        headers: dict[str, str] | None = None,
        *, content_type: str = "application/json",
    ) -> None:
        self._send_raw(code, json.dumps(body).encode(), content_type, headers=headers)

    def _send_raw(
        self, code: int, data: bytes, content_type: str, *, headers: dict[str, str] | None = None
    ) -> None:
        self._log(code)
        if hold := self.api._take_hold(self._entry.method, self._entry.path):
            hold.wait()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, obj: Obj) -> None:
        data = json.dumps(obj).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def watch(
        self,
        res: Resource,
        query: dict[str, str],
        match: Callable[[Obj], bool],
        *,
        render: Callable[[Obj], Obj] = lambda obj: obj,
    ) -> None:
        """Stream the changes to ``res`` that ``match`` as watch events, until ``timeoutSeconds``, the
        server's close, or a resourceVersion the history lost (a 410 ERROR event)."""
        api, store, kind = self.api, self.api.store, res.name
        timeout = float(query.get("timeoutSeconds") or api.default_watch_timeout_s)
        deadline = time.monotonic() + timeout
        bookmarks = query.get("allowWatchBookmarks") == "true"
        # Fixed before the request is logged: a test that saw the watch in the log and then compacts
        # the history knows this watch will get its 410.
        epoch = store.epoch
        self._log(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        pos = self._watch_start(kind, query.get("resourceVersion", ""), match=match, render=render)
        next_bookmark = time.monotonic() + api.bookmark_interval_s
        try:
            while not api._closing.is_set():
                until = min(deadline, next_bookmark if bookmarks else deadline)
                # ApiError(410) once the history lost pos
                records = self._changes(kind, pos, epoch, until=until)
                for record in records:
                    pos = record.rv
                    if match(record.obj):
                        self._chunk({"type": record.type, "object": render(record.obj)})
                now = time.monotonic()
                if now >= deadline:
                    break
                # Like the real apiserver, a bookmark marks a quiet stream: never between two changes
                # that are ready to go, so a client sees every pending change before the next bookmark.
                if bookmarks and now >= next_bookmark and not records:
                    self._bookmark(res, pos)
                    next_bookmark = now + api.bookmark_interval_s
        except ApiError as exc:  # 410: the real server sends the Status as an ERROR event, then closes
            self._chunk({"type": "ERROR", "object": exc.body})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _watch_start(
        self, kind: str, rv_text: str, *, match: Callable[[Obj], bool], render: Callable[[Obj], Obj]
    ) -> int:
        """The history position a watch starts after. No resourceVersion (or "0"): synthetic ADDED
        events for the current state first, then changes from there on."""
        if rv_text not in ("", "0"):
            return int(rv_text) if rv_text.isdigit() else -1
        items, pos = self.api.store.list(kind)
        for obj in items:
            if match(obj):
                self._chunk({"type": "ADDED", "object": render(obj)})
        return pos

    def _changes(self, kind: str, pos: int, epoch: int, *, until: float) -> list[Record]:
        """The changes to ``kind`` after ``pos``, waiting for one until ``until`` (monotonic) if none
        is ready; none once the server is closing."""
        api, store = self.api, self.api.store
        with store.lock:
            records = store.since(kind, pos, epoch)
            if not records:
                wait = until - time.monotonic()
                if wait > 0:
                    store.changed.wait(wait)
                records = [] if api._closing.is_set() else store.since(kind, pos, epoch)
        return records

    def _bookmark(self, res: Resource, pos: int) -> None:
        """A BOOKMARK event: the stream is quiet and has seen everything up to ``pos``."""
        self._chunk(
            {
                "type": "BOOKMARK",
                "object": {
                    "kind": res.kind,
                    "apiVersion": res.api_version,
                    "metadata": {"resourceVersion": str(pos)},
                },
            }
        )


NOT_FOUND = "the server could not find the requested resource"
PUBLIC = ("/version", "/healthz", "/livez", "/readyz")  # open to anonymous users on a real cluster


def _list(res: Resource, items: list[Obj], rv: int) -> Obj:
    return {
        "kind": f"{res.kind}List",
        "apiVersion": res.api_version,
        "metadata": {"resourceVersion": str(rv)},
        "items": items,
    }


@dataclass(frozen=True)
class Shown:
    """How a list shows each object: through ``view``, and as a Table (``as_table``, with the
    ``includeObject`` mode ``include``) or as the kind's list."""

    view: Callable[[Obj], Obj]
    as_table: bool
    include: str


def _paged_list(h: Handler, res: Resource, query: dict[str, str], *, match: Callable[[Obj], bool],
                shown: Shown) -> None:
    """One page of a list with ``limit`` or ``continue`` (:mod:`remediation.simulator.kube.pages`)."""
    view, as_table, include = shown.view, shown.as_table, shown.include
    limit = parse_limit(query.get("limit"))
    selectors = "|".join((query.get("fieldSelector", ""), query.get("labelSelector", "")))
    token = query.get("continue", "")
    if token:
        if query.get("resourceVersion"):
            raise bad_request("specifying resource version is not allowed when using continue")
        page = h.api.pages.next(res.name, selectors, token, limit=limit)
    else:
        entries, rv = h.api.store.list_keyed(res.name, match)
        page = h.api.pages.first(res.name, selectors, entries, rv=rv, limit=limit)
    meta: Obj = {"resourceVersion": str(page.rv)}
    if page.token:
        meta["continue"] = page.token
    if page.remaining is not None:
        meta["remainingItemCount"] = page.remaining
    if as_table or res.name == "poddisruptionbudgets":
        objs = [view(json.loads(blob)) for blob in page.items]
        body = table(res, objs, str(page.rv), include=include) if as_table else _list(res, objs, page.rv)
        body["metadata"] = meta
        h._send(200, body)
        return
    head = json.dumps(_list(res, [], page.rv) | {"metadata": meta}).encode()[:-2]  # without the closing "]}"
    h._send_raw(200, head + b",".join(page.items) + b"]}", "application/json")


def _discovery(h: Handler, path: str) -> bool:
    """Answer the discovery and version paths; False when ``path`` is none of them."""
    accept = h.headers.get("Accept", "")
    if path in ("/healthz", "/livez", "/readyz"):
        h._send_raw(200, b"ok", "text/plain; charset=utf-8")
    elif path == "/version":
        h._send(200, SERVER_VERSION)
    elif path in ("/api", "/apis") and wants_aggregated(accept):
        h._send(200, aggregated(core=path == "/api"), content_type=AGGREGATED)
    elif path == "/api":
        h._send(200, api_versions(h.headers.get("Host", "")))
    elif path == "/apis":
        h._send(200, api_group_list())
    else:
        parts = path.strip("/").split("/")
        if parts[0] == "apis" and len(parts) == 2 and (group := api_group(parts[1])) is not None:
            h._send(200, group)
        elif parts == ["api", "v1"] or (parts[0] == "apis" and len(parts) == 3):
            found = resource_list(*(("", "v1") if parts[0] == "api" else (parts[1], parts[2])))
            if found is None:
                raise ApiError(status(404, "NotFound", NOT_FOUND))
            h._send(200, found)
        else:
            return False
    return True


@dataclass(frozen=True)
class _Target:
    """What a resource path names, and how the request wants it shown."""

    res: Resource
    namespace: str | None
    rest: list[str]  # the resource, then the object's name and a subresource when given
    match: Callable[[Obj], bool]  # in the namespace and the selectors
    view: Callable[[Obj], Obj]
    as_table: bool
    include: str


def _route(h: Handler, req: Request) -> None:
    """Answer a request: a discovery path, a resource's collection, one object or a subresource."""
    if req.method == "GET" and _discovery(h, req.path or "/"):
        return
    t = _target(h, req)
    if len(t.rest) == 1 and req.method == "GET":
        _collection(h, req.query, t)
        return
    if len(t.rest) == 1 and req.method == "POST" and t.res.name == "jobs" and t.namespace is not None:
        h._send(201, h.api.jobs.create(t.namespace, req.body))
        return
    if len(t.rest) >= 2 and t.res.namespaced and t.namespace is None:
        raise ApiError(status(404, "NotFound", NOT_FOUND))
    if not _object(h, req, t):
        raise ApiError(
            status(405, "MethodNotAllowed", f"the server does not allow this method on {req.path}")
        )


def _target(h: Handler, req: Request) -> _Target:
    """The resource, namespace and selectors a path and its query name; 404 for a path naming none."""
    parts = req.path.strip("/").split("/")
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiError(status(404, "NotFound", NOT_FOUND))
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    res = resource_for(group, version, rest[0]) if rest else None
    if res is None or (namespace is not None and not res.namespaced):
        raise ApiError(status(404, "NotFound", NOT_FOUND))
    try:
        fields = field_selector(res.name, req.query.get("fieldSelector"))
        labels = label_selector(req.query.get("labelSelector"))
    except SelectorError as exc:
        raise ApiError(status(400, "BadRequest", str(exc))) from None

    def match(obj: Obj) -> bool:
        in_ns = namespace is None or obj["metadata"].get("namespace") == namespace
        return in_ns and fields(obj) and labels(obj)

    store = h.api.store
    view = store.pdb_with_status if res.name == "poddisruptionbudgets" else (lambda o: o)
    as_table = wants_table(h.headers.get("Accept", ""))
    return _Target(res, namespace, rest, match, view, as_table, req.query.get("includeObject", "Metadata"))


def _collection(h: Handler, query: dict[str, str], t: _Target) -> None:
    """GET on a collection: a watch, a page, or the whole list (as stored, or as a Table)."""
    store, kind = h.api.store, t.res.name
    if query.get("watch") in ("true", "1"):
        h.watch(t.res, query, t.match, render=_table_events(t) if t.as_table else t.view)
        return
    if query.get("limit", "0") != "0" or query.get("continue"):
        _paged_list(h, t.res, query, match=t.match, shown=Shown(t.view, t.as_table, t.include))
        return
    if not t.as_table and kind != "poddisruptionbudgets":  # as stored: straight from the cache
        encoded, rv = store.list_encoded(kind, t.match)
        head = json.dumps(_list(t.res, [], rv)).encode()[:-2]  # without the closing "]}"
        h._send_raw(200, head + b",".join(encoded) + b"]}", "application/json")
        return
    items, rv = store.list(kind)
    selected = [t.view(o) for o in items if t.match(o)]
    h._send(200, table(t.res, selected, str(rv), include=t.include) if t.as_table else _list(t.res, selected, rv))


def _table_events(t: _Target) -> Callable[[Obj], Obj]:
    """A watch's objects as Tables; the column definitions go with the first event only."""
    first = [True]

    def render(obj: Obj) -> Obj:
        rv = obj["metadata"].get("resourceVersion", "")
        out = table(t.res, [t.view(obj)], rv, include=t.include, with_columns=first[0])
        first[0] = False
        return out

    return render


def _object(h: Handler, req: Request, t: _Target) -> bool:
    """One object or its subresource (status, log, eviction); False when the method is not allowed."""
    api, store, kind, rest, method = h.api, h.api.store, t.res.name, t.rest, req.method
    body, content_type, namespace = req.body, req.content_type, t.namespace
    if len(rest) == 2 and method == "GET":
        key: Any = rest[1] if not t.res.namespaced else (namespace, rest[1])
        obj = t.view(store.get(kind, key))
        h._send(
            200, table(t.res, [obj], obj["metadata"]["resourceVersion"], include=t.include) if t.as_table else obj
        )
    elif len(rest) == 2 and method == "PATCH" and kind == "nodes":
        h._send(200, store.patch_node(rest[1], body, content_type))
    elif len(rest) == 2 and method == "PATCH" and kind == "pods":
        h._send(200, store.patch_pod(namespace or "", rest[1], body, content_type=content_type))
    elif len(rest) == 3 and kind == "nodes" and rest[2] == "status" and method == "GET":
        h._send(200, store.get(kind, rest[1]))
    elif len(rest) == 3 and kind == "nodes" and rest[2] == "status" and method == "PATCH":
        h._send(200, store.patch_node(rest[1], body, content_type, subresource="status"))
    elif len(rest) == 2 and method == "DELETE" and kind == "jobs":
        h._send(200, api.jobs.delete(namespace or "", rest[1]))
    elif len(rest) == 3 and kind == "pods" and rest[2] == "log" and method == "GET":
        text = api.jobs.log(namespace or "", rest[1]).encode()
        limit = req.query.get("limitBytes", "")
        h._send_raw(200, text[:int(limit)] if limit.isdigit() else text, "text/plain")  # the log's start, as the kubelet
    elif len(rest) == 3 and kind == "pods" and rest[2] == "eviction" and method == "POST":
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            raise ApiError(status(400, "BadRequest", "body must be a policy/v1 Eviction"))
        h._send(201, store.evict(namespace or "", rest[1], api.evict_grace_s))
    else:
        return False
    return True
