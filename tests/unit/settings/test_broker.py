"""The embedded mode is decided once, from the broker URLs' scheme."""

from __future__ import annotations

from remediation.settings import BrokerSettings


def test_memory_urls_are_the_embedded_mode() -> None:
    embedded = BrokerSettings(redis_url="memory://", celery_broker_url="memory://")
    assert embedded.embedded and embedded.celery_embedded


def test_redis_urls_are_not() -> None:
    real = BrokerSettings(redis_url="redis://127.0.0.1:6379/0")
    assert not real.embedded and not real.celery_embedded
    assert not BrokerSettings(redis_url="rediss://memory.example:6380/0").embedded  # a host named memory
