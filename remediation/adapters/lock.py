"""A Redis leader lock with a fencing token: only one watcher of a kind publishes, and only its events count.

The holder renews well inside the TTL; renew and release are compare-and-set scripts. Taking the lock
draws a fencing token (:meth:`LeaderLock.fence`), never below the server's clock in milliseconds; the
ingest drops events fenced below one it recorded (:mod:`remediation.domain.fencing`). With
``broker.replica_acks``, a new holder leads only once replicas hold its lock.

Why: docs/architecture.md#past-one-machine-failover-loses-nothing-and-a-leader-cannot-be-two
"""

from __future__ import annotations

import os
import socket
import uuid

import redis

from remediation.domain.admission import Publisher
from remediation.domain.events import Fence

_ACQUIRE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local token = math.max(tonumber(redis.call('get', KEYS[2]) or '0') + 1, now)
  redis.call('set', KEYS[2], string.format('%d', token))
  return token
end
return 0
"""
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


def drawn_tokens(client: redis.Redis, prefix: str) -> dict[str, int]:
    """Each publisher's lock's fencing-token counter as Redis holds it now, by lock name; a lock that
    never handed out a token is absent. Read after a batch was, it is at or above every token a holder
    of the lock stamped on that batch: only the lock's script raises it, so a token above it is forged."""
    names = [p.value for p in Publisher]
    values = client.mget([f"{prefix}:leader:{name}:token" for name in names])
    return {name: int(value) for name, value in zip(names, values, strict=True) if value is not None}


class LeaderLock:
    def __init__(self, client: redis.Redis, key: str, ttl_s: float = 10.0, *, kind: str | None = None,
                 replica_acks: int = 0, replica_ack_timeout_ms: int = 1000) -> None:
        self.client = client
        self.key = key
        self.kind = kind or key.rpartition(":")[2]
        self.ttl_ms = int(ttl_s * 1000)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.replica_acks, self.replica_ack_timeout_ms = replica_acks, replica_ack_timeout_ms
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self.held = False
        self.token = 0  # the fencing token of the current holding; 0 while not held

    def acquire_or_renew(self) -> bool:
        """Try to hold the lock; returns whether we are the leader now."""
        try:
            if self.held and self._renew(keys=[self.key], args=[self.holder, self.ttl_ms]):
                return True
            self.held, self.token = False, 0
            token = int(self._acquire(keys=[self.key, f"{self.key}:token"], args=[self.holder, self.ttl_ms]))
            if token and self._replicated():
                self.held, self.token = True, token
            elif token:
                self.release()
        except redis.RedisError:
            self.held, self.token = False, 0
        return self.held

    def _replicated(self) -> bool:
        if self.replica_acks <= 0:
            return True
        return int(self.client.wait(self.replica_acks, self.replica_ack_timeout_ms)) >= self.replica_acks

    def fence(self) -> Fence | None:
        """The fencing token to stamp on what we publish; None while we do not hold the lock."""
        return Fence(lock=self.kind, token=self.token) if self.held and self.token else None

    def release(self) -> None:
        try:
            self._release(keys=[self.key], args=[self.holder])
        except redis.RedisError:
            pass
        self.held, self.token = False, 0
