"""The list+watch thread of the Kubernetes watcher: Nodes in, queued items out, nothing published.

It works the way an informer does: list, then watch from the list's resourceVersion, resume each
timed-out watch from the last resourceVersion seen (bookmarks included), relist on 410 Expired and
every ``kube.resync_interval_s``; errors back off and relist. The main thread (:mod:`watchers.kube`)
consumes the queue, so no wait in here can starve the leader lock's renewal.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from remediation.settings import Settings
from watchers.health import WatcherHealth

log = logging.getLogger("watchers.kube")

Item = tuple[str, Any]  # ("RELIST", [node, ...]) or ("ADDED"|"MODIFIED"|"DELETED", node)


class NodeStream(threading.Thread):
    """list+watch of Nodes, queueing RELIST snapshots and watch events for the main loop."""

    def __init__(
        self, api: client.CoreV1Api, settings: Settings, out: queue.Queue[Item], health: WatcherHealth | None = None
    ) -> None:
        super().__init__(name="kube-node-stream", daemon=True)
        self.api, self.s, self.out = api, settings.kube, out
        self.health = health
        self._halt = threading.Event()
        self._watch: watch.Watch | None = None

    def stop(self) -> None:
        self._halt.set()
        if self._watch is not None:
            self._watch.stop()  # shuts the socket, so a blocked read returns now

    def _list(self) -> str:
        # Raw JSON: deserializing 10,000 V1Node models costs seconds; we need a few fields of each.
        started = time.monotonic()
        resp = self.api.list_node(_preload_content=False, _request_timeout=self.s.request_timeout_s)
        body = json.loads(resp.data)
        self.out.put(("RELIST", body.get("items") or []))
        rv = str(body["metadata"]["resourceVersion"])
        if self.health is not None:
            self.health.succeeded(time.monotonic() - started)
        return rv

    def run(self) -> None:
        backoff = 0.5
        while not self._halt.is_set():
            try:
                rv = self._list()
                backoff = 0.5
                resync_at = time.monotonic() + self.s.resync_interval_s
                while not self._halt.is_set() and time.monotonic() < resync_at:
                    timeout = max(1, min(self.s.watch_timeout_s, int(resync_at - time.monotonic()) or 1))
                    rv = self._watch_once(rv, timeout)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch expired (%s); relisting", exc.reason)
                    continue
                log.warning("Kubernetes API error %s %s; relisting in %.1fs", exc.status, exc.reason, backoff)
                self._halt.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError) as exc:
                if self._halt.is_set():
                    break
                log.warning("Kubernetes API unreachable (%s); relisting in %.1fs", exc, backoff)
                self._halt.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _watch_once(self, rv: str, timeout: int) -> str:
        self._watch = watch.Watch()
        for event in self._watch.stream(
            self.api.list_node,
            resource_version=rv,
            timeout_seconds=timeout,
            allow_watch_bookmarks=True,
            deserialize=False,
            _request_timeout=(self.s.request_timeout_s, timeout + self.s.request_timeout_s),
        ):
            obj = event["object"]
            rv = str(obj["metadata"]["resourceVersion"])
            if event["type"] != "BOOKMARK":
                self.out.put((event["type"], obj))
            if self.health is not None:
                self.health.succeeded()
            if self._halt.is_set():
                break
        if self.health is not None and not self._halt.is_set():
            self.health.succeeded()  # a quiet watch that ran its timeout out answered too
        return rv
