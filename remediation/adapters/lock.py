"""A Redis leader lock: only one watcher of a kind publishes at a time.

The holder renews the lock well inside its TTL; a watcher that dies loses it after the TTL and a standby
takes over. Renew and release are compare-and-set scripts, so a watcher whose lock expired (say it was
paused for longer than the TTL) can never extend or delete a lock that another watcher now holds.
"""

from __future__ import annotations

import os
import socket
import uuid

import redis

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class LeaderLock:
    def __init__(self, client: redis.Redis, key: str, ttl_s: float = 10.0) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = int(ttl_s * 1000)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self.held = False

    def acquire_or_renew(self) -> bool:
        """Try to hold the lock; returns whether we are the leader now."""
        try:
            if self.held and self._renew(keys=[self.key], args=[self.token, self.ttl_ms]):
                return True
            self.held = bool(self.client.set(self.key, self.token, nx=True, px=self.ttl_ms))
        except redis.RedisError:
            self.held = False
        return self.held

    def release(self) -> None:
        try:
            self._release(keys=[self.key], args=[self.token])
        except redis.RedisError:
            pass
        self.held = False
