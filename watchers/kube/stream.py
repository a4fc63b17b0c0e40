"""The list+watch thread of the Kubernetes watcher: Nodes in, queued items out, nothing published.

List, watch from its resourceVersion, resume after a timeout, relist on 410 and every
``kube.resync_interval_s``; errors back off. Lists are paged (``kube.list_page_size``), Nodes kept slim
(:func:`slim`), and the queue bounded (``kube.queue_max_items``): a slow publisher stops the reading.

Why: docs/architecture.md#the-kubernetes-watchers-memory-does-not-grow-with-the-answer
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from remediation.profiles.rules import label_keys
from remediation.settings import Settings
from remediation.watchers.health import WatcherHealth
from remediation.watchers.kube.nodes import decode_page, slim

log = logging.getLogger("remediation.watchers.kube.watcher")

Item = tuple[str, Any]  # ("RELIST", [node, ...]) or ("ADDED"|"MODIFIED"|"DELETED", node)


class NodeStream(threading.Thread):
    """list+watch of Nodes, queueing RELIST snapshots and watch events for the main loop."""

    def __init__(
        self,
        api: client.CoreV1Api,
        settings: Settings,
        out: queue.Queue[Item],
        *,
        health: WatcherHealth | None = None,
    ) -> None:
        super().__init__(name="kube-node-stream", daemon=True)
        self.api, self.s, self.out = api, settings.kube, out
        self.health = health
        incidents = settings.incidents
        # The failure-domain labels, and the labels the profiles' selectors name.
        domains = tuple(incidents.label_keys) if incidents.enabled else ()
        self.label_keys: tuple[str, ...] = tuple(dict.fromkeys((*domains, *label_keys(settings.profiles))))
        self._halt = threading.Event()
        self._watch: watch.Watch | None = None

    def stop(self) -> None:
        self._halt.set()
        if self._watch is not None:
            self._watch.stop()  # shuts the socket, so a blocked read returns now

    def _list(self) -> str:
        """One relist, page by page, queued as one RELIST snapshot; its resourceVersion."""
        started = time.monotonic()
        nodes: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            # Raw bytes: V1Node models cost seconds at 10,000; decode_page takes the few fields we read.
            resp: Any = self.api.list_node(  # an urllib3 response: _preload_content=False
                limit=self.s.list_page_size,
                _continue=token,
                _preload_content=False,
                _request_timeout=self.s.request_timeout_s,
            )
            page, rv, token = decode_page(resp.data, self.label_keys)
            del resp
            nodes += page
            if not token or self._halt.is_set():
                break
        self._put(("RELIST", nodes))
        if self.health is not None:
            self.health.succeeded(time.monotonic() - started)
        return rv

    def _put(self, item: Item) -> None:
        """Queue ``item``, waiting while the queue is full (back-pressure) unless we are stopping."""
        while not self._halt.is_set():
            try:
                self.out.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

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
                self._put((event["type"], slim(obj, self.label_keys)))
            if self.health is not None:
                self.health.succeeded()
            if self._halt.is_set():
                break
        if self.health is not None and not self._halt.is_set():
            self.health.succeeded()  # a quiet watch that ran its timeout out answered too
        return rv
