"""Settings and rules for running past one machine: Redis Sentinel, an HA Postgres URL, and the fence.

The fence's rule (remediation.domain.fencing) is a pure function of the events in stream order and the
highest token seen so far; the settings build Celery's ``sentinel://`` URL and transport options from
``broker.sentinel`` and refuse a multi-host Postgres URL that could settle on a standby.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from remediation.domain.events import EventKind, Fence, NodeEvent, Source
from remediation.domain.fencing import sort_by_fence
from remediation.settings import SettingsError, load_settings

NOW = datetime(2026, 11, 26, tzinfo=UTC)


def ev(key: str, lock: str | None = None, token: int = 0) -> NodeEvent:
    return NodeEvent(
        source=Source.SLURM,
        node="gpu-node-1",
        kind=EventKind.INVENTORY,
        state="IDLE",
        observed_at=NOW,
        dedupe_key=key,
        fence=Fence(lock=lock, token=token) if lock else None,
    )


@pytest.mark.parametrize(
    ("events", "highest", "kept", "stale", "after"),
    [
        ([ev("a", "slurm", 5), ev("b", "slurm", 5)], {}, ["a", "b"], [], {"slurm": 5}),
        (
            [ev("a", "slurm", 5), ev("b", "slurm", 7), ev("c", "slurm", 5)],
            {},
            ["a", "b"],
            ["c"],
            {"slurm": 7},
        ),
        ([ev("a", "slurm", 5)], {"slurm": 7}, [], ["a"], {"slurm": 7}),
        ([ev("a", "slurm", 5), ev("b", "kube", 3)], {"kube": 4}, ["a"], ["b"], {"slurm": 5, "kube": 4}),
        ([ev("a"), ev("b", "slurm", 9), ev("c")], {"slurm": 10}, ["a", "c"], ["b"], {"slurm": 10}),
    ],
    ids=[
        "one-holder",
        "the-old-holder-after-the-new",
        "below-what-the-database-holds",
        "per-lock",
        "unfenced-events-always-count",
    ],
)
def test_the_fence_keeps_what_no_newer_leader_has_replaced(
    events: list[NodeEvent], highest: dict[str, int], kept: list[str], stale: list[str], after: dict[str, int]
) -> None:
    result = sort_by_fence(events, highest)
    assert [e.dedupe_key for e in result.kept] == kept
    assert [e.dedupe_key for e, _ in result.stale] == stale
    assert result.highest == after


def test_an_unfenced_event_is_written_as_before() -> None:
    """A worker not yet upgraded must still read what a `remediation report` publishes."""
    assert "fence" not in ev("a").to_json()
    assert NodeEvent.parse(ev("a", "slurm", 3).to_json()).fence == Fence(lock="slurm", token=3)


def test_sentinel_gives_celery_a_sentinel_url_with_the_components_user() -> None:
    s = load_settings(
        broker={
            "redis_url": "redis://worker:pw@ignored:6379/2",
            "sentinel": {
                "addresses": ["s-0:26379", "s-1:26379"],
                "master": "nr",
                "password": "sentinel-secret",
            },
        }
    )
    assert s.broker.celery_url == "sentinel://worker:pw@s-0:26379/2;sentinel://worker:pw@s-1:26379/2"
    options = s.broker.celery_transport_options()
    assert options["master_name"] == "nr" and options["sentinel_kwargs"]["password"] == "sentinel-secret"
    assert options["global_keyprefix"] == "remediation:celery:"
    assert s.broker.sentinel.hosts() == [("s-0", 26379), ("s-1", 26379)]


def test_without_sentinel_nothing_changes() -> None:
    s = load_settings(broker={"redis_url": "redis://worker:pw@redis:6379/0"})
    assert s.broker.celery_url == "redis://worker:pw@redis:6379/0"
    assert "master_name" not in s.broker.celery_transport_options()
    assert s.broker.replica_acks == 0


def test_sentinel_over_tls_verifies_the_sentinels_and_the_primary() -> None:
    s = load_settings(
        broker={
            "redis_url": "rediss://worker:pw@x/0",
            "ca_file": "/etc/ca.pem",
            "sentinel": {"addresses": ["s-0:26379"]},
        }
    )
    assert s.broker.sentinel_kwargs(5.0)["ssl"] is True
    assert s.broker.sentinel_kwargs(5.0)["ssl_ca_certs"] == "/etc/ca.pem"
    assert s.broker.celery_tls()["ssl_ca_certs"] == "/etc/ca.pem"


@pytest.mark.parametrize("address", ["s-0", "s-0:port", "http://s-0:26379"], ids=["no-port", "word", "a-url"])
def test_a_sentinel_address_is_host_and_port(address: str) -> None:
    with pytest.raises(SettingsError, match="broker.sentinel.addresses"):
        load_settings(broker={"sentinel": {"addresses": [address]}})


def test_the_sentinels_password_never_reaches_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMEDIATION_BROKER__SENTINEL__PASSWORD", "hunter2-sentinel")
    monkeypatch.setenv("REMEDIATION_BROKER__SENTINEL__ADDRESSES", '["nope"]')
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "hunter2-sentinel" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        (
            "postgresql+psycopg://u:s3cr3t-db@/db?host=pg-0:5432&host=pg-1:5432&target_session_attrs=read-write",
            True,
        ),
        ("postgresql+psycopg://u:s3cr3t-db@/db?host=pg-0:5432,pg-1:5432&target_session_attrs=primary", True),
        ("postgresql+psycopg://u:s3cr3t-db@pg-0:5432/db", True),
        ("postgresql+psycopg://u:s3cr3t-db@/db?host=pg-0:5432&host=pg-1:5432", False),
        ("postgresql+psycopg://u:s3cr3t-db@/db?host=pg-0,pg-1&target_session_attrs=any", False),
    ],
    ids=["two-hosts-read-write", "comma-hosts-primary", "one-host", "two-hosts-no-attrs", "two-hosts-any"],
)
def test_a_multi_host_database_url_must_ask_for_the_primary(url: str, ok: bool) -> None:
    if ok:
        assert load_settings(database={"url": url}).database.url == url
        return
    with pytest.raises(SettingsError, match="target_session_attrs=read-write") as caught:
        load_settings(database={"url": url})
    assert "s3cr3t-db" not in str(caught.value)
