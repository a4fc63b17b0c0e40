"""The evidence store's directory, memory and dry-run backends, and the factory that picks one.

The directory store writes real files under a temporary directory: whole (a temporary file renamed),
private (0600 in 0700 directories), and a location read back never leads out of the directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from remediation.adapters.evidence_store import DirectoryStore, MemoryStore, NoopEvidenceStore, S3Store
from remediation.adapters.factory import evidence_storage
from remediation.adapters.noop import Recorder
from remediation.ports.errors import NotFound, PermanentError
from remediation.ports.evidence import EvidenceStore
from remediation.settings import Settings

KEY = "default/gpu-node-7/r12/s34/nvidia-smi-q"


def test_directory_store_writes_whole_private_files_and_reads_them_back(tmp_path: Path) -> None:
    root = tmp_path / "evidence"
    store = DirectoryStore(root)
    location = store.put(KEY, b"GPU 0: ok\n" * 1000)
    assert location == f"dir:{KEY}"
    path = root / KEY
    assert path.read_bytes() == b"GPU 0: ok\n" * 1000
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    dirs = [root, *(p for p in root.rglob("*") if p.is_dir())]
    assert len(dirs) == 5  # the root, the cluster, the node, the remediation, the step
    for d in dirs:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    # A second put of the same key overwrites, and leaves no temporary file behind.
    assert store.put(KEY, b"second") == location
    assert store.get(location) == b"second"
    assert sorted(p.name for p in path.parent.iterdir()) == ["nvidia-smi-q"]
    store.delete(location)
    assert not path.exists()
    store.delete(location)  # already gone: fine
    with pytest.raises(NotFound):
        store.get(location)


@pytest.mark.parametrize(
    "location",
    ["dir:../outside", "dir:a/../../outside", "dir:/etc/passwd", "dir:", "dir:.", "s3://bucket/key", "outside",
     "dir:link/secret"],
    ids=["dotdot", "nested-dotdot", "absolute", "empty", "the-root", "other-scheme", "no-scheme", "symlink-out"],
)
def test_directory_store_refuses_a_location_that_leaves_the_directory(tmp_path: Path, location: str) -> None:
    root = tmp_path / "evidence"
    (tmp_path / "outside").write_bytes(b"not yours")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret").write_bytes(b"not yours either")
    store = DirectoryStore(root)
    store.put("a/b", b"x")
    (root / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PermanentError) as got:
        store.get(location)
    assert not isinstance(got.value, NotFound)
    with pytest.raises(PermanentError):
        store.delete(location)
    assert (tmp_path / "outside").read_bytes() == b"not yours"
    assert (tmp_path / "elsewhere" / "secret").exists()


@pytest.mark.parametrize("key", ["../x", "a/../b", "/abs", "a//b", ".hidden", "a/b c", ""],
                         ids=["dotdot", "inner-dotdot", "absolute", "empty-segment", "dot", "space", "empty"])
def test_a_bad_key_is_refused_before_anything_is_written(tmp_path: Path, key: str) -> None:
    for store in (DirectoryStore(tmp_path / "evidence"), MemoryStore(), NoopEvidenceStore()):
        with pytest.raises(PermanentError):
            store.put(key, b"x")
    assert not (tmp_path / "evidence").exists()


def test_memory_store_round_trips_and_forgets() -> None:
    store = MemoryStore()
    location = store.put(KEY, b"abc")
    assert store.get(location) == b"abc" and store.blobs == {KEY: b"abc"}
    store.delete(location)
    store.delete(location)
    with pytest.raises(NotFound):
        store.get(location)


def test_noop_store_stores_nothing_and_records_what_it_would() -> None:
    recorder = Recorder()
    store = NoopEvidenceStore(recorder)
    location = store.put(KEY, b"12345")
    with pytest.raises(NotFound):
        store.get(location)
    store.delete(location)
    assert [(a["would"], a.get("key"), a.get("bytes"), a.get("location")) for a in recorder.actions] == [
        ("keep collected evidence", KEY, 5, None), ("delete collected evidence", None, None, location)]


def test_factory_picks_the_backend_evidence_store_names(tmp_path: Path) -> None:
    assert evidence_storage(Settings()).blobs is None  # database: items are cut to fit their row
    assert evidence_storage(Settings()).inline_bytes == 65536
    d = evidence_storage(Settings(evidence={"store": {"backend": "directory", "path": str(tmp_path),
                                                      "inline_bytes": 2048}}))
    assert isinstance(d.blobs, DirectoryStore) and d.blobs.root == tmp_path and d.inline_bytes == 2048
    s3 = evidence_storage(Settings(evidence={"store": {"backend": "s3", "bucket": "b", "region": "eu-west-1",
                                                       "endpoint_url": "http://127.0.0.1:1"}}))
    assert isinstance(s3.blobs, S3Store) and s3.blobs.bucket == "b" and s3.blobs.prefix == "node-remediation/evidence/"
    twin = evidence_storage(Settings(evidence={"store": {"backend": "directory", "path": str(tmp_path)}}),
                            recorder=Recorder())
    assert isinstance(twin.blobs, NoopEvidenceStore)
    assert all(isinstance(x.blobs, EvidenceStore) for x in (d, s3, twin))
    assert os.listdir(tmp_path) == []  # building a store writes nothing
