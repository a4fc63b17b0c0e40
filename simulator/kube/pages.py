"""Chunked lists, served the way the real kube-apiserver serves them: ``limit`` and ``continue``.

Pages in key order, one snapshot per list (the first page's resourceVersion), ``remainingItemCount``
without selectors. Snapshots of the last few lists are kept and forgotten on compaction (then 410). A
foreign token, or a continue with a ``resourceVersion``, is a 400.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

from remediation.simulator.kube.store import ApiError, status

TOO_OLD = (
    "The provided continue parameter is too old to display a consistent list result. You can start a "
    "new list without the continue parameter."
)
Entry = tuple[str, bytes]  # (key, the object's JSON)


@dataclass(frozen=True)
class Page:
    items: list[bytes]
    rv: int
    token: str  # "" on the last page
    remaining: int | None  # items after this page; None with selectors, as the real server


def bad_request(message: str) -> ApiError:
    return ApiError(status(400, "BadRequest", message))


def encode_token(rv: int, last: str) -> str:
    """A token for the page after the key ``last``: its successor in key order is ``last`` + NUL."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": last + "\x00"}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> tuple[int, str]:
    """The resourceVersion and the smallest key to answer from; 400 when it is not one of ours."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        rv, start = raw["rv"], raw["start"]
        if raw.get("v") != "meta.k8s.io/v1" or not isinstance(rv, int) or not isinstance(start, str):
            raise ValueError("unknown token version")
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from None
    return rv, start


def parse_limit(text: str | None) -> int:
    """``limit`` as a number of items; 0 (or absent) is no limit."""
    if not text:
        return 0
    if not text.isdigit():
        raise bad_request(f"invalid value for limit: {text!r}")
    return int(text)


class Snapshots:
    """The entries of recent paged lists, by (kind, selectors, resourceVersion)."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._snaps: OrderedDict[tuple[str, str, int], list[Entry]] = OrderedDict()

    def forget(self) -> None:
        with self._lock:
            self._snaps.clear()

    def first(self, kind: str, selectors: str, entries: list[Entry], *, rv: int, limit: int) -> Page:
        entries = sorted(entries)
        if limit and len(entries) > limit:
            with self._lock:
                self._snaps[(kind, selectors, rv)] = entries
                while len(self._snaps) > self.keep:
                    self._snaps.popitem(last=False)
        return _page(entries, 0, rv, limit=limit, selectors=selectors)

    def next(self, kind: str, selectors: str, token: str, *, limit: int) -> Page:
        rv, start = decode_token(token)
        with self._lock:
            entries = self._snaps.get((kind, selectors, rv))
        if entries is None:
            raise ApiError(status(410, "Expired", TOO_OLD))
        at = bisect.bisect_left(entries, start, key=lambda e: e[0])
        return _page(entries, at, rv, limit=limit, selectors=selectors)


def _page(entries: list[Entry], at: int, rv: int, *, limit: int, selectors: str) -> Page:
    end = len(entries) if not limit else min(len(entries), at + limit)
    items = [blob for _, blob in entries[at:end]]
    if end >= len(entries):
        return Page(items, rv, "", None)
    return Page(
        items, rv, encode_token(rv, entries[end - 1][0]), None if selectors.strip("|") else len(entries) - end
    )
