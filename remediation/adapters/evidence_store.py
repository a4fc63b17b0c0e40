"""The backends of :class:`remediation.ports.evidence.EvidenceStore`: a directory, an S3 (or
S3-compatible) bucket, memory, and the dry-run twin that stores nothing.

A location is what a put returned and a row recorded: ``dir:KEY``, ``s3://BUCKET/PREFIXKEY`` or
``memory:KEY``. Read back, it is data, never trusted: a directory location resolves under the directory
or is refused, and a bucket location names the configured bucket and prefix or is refused.

Why: docs/policy.md#where-it-is-kept
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from remediation.adapters.noop import Recorder
from remediation.ports.errors import ConfigError, NotFound, PermanentError, TransientError, error_for_status

#: A key: segments of letters, digits, dots, dashes and underscores, none starting with a dot.
KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,252}(/[A-Za-z0-9_][A-Za-z0-9._-]{0,252}){0,15}$")
COMPONENT = "evidence"


def checked_key(key: str) -> str:
    """``key`` when it is one (see :data:`KEY`); a key is built by us, so a bad one is our bug."""
    if not KEY.fullmatch(key):
        raise PermanentError(f"not a key for collected evidence: {key!r}")
    return key


class DirectoryStore:
    """Files under ``root``, each written whole (a temporary file renamed over it), mode 0600 in
    directories of mode 0700."""

    SCHEME = "dir:"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def put(self, key: str, data: bytes) -> str:
        path = self.root / checked_key(key)
        with _os_errors(key):
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            for depth in range(1, len(Path(key).parts)):  # each level its own mkdir: each one 0700
                self.root.joinpath(*Path(key).parts[:depth]).mkdir(mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".part")  # mode 0600
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        return self.SCHEME + key

    def get(self, location: str) -> bytes:
        path = self._path(location)
        with _os_errors(location):
            return path.read_bytes()

    def delete(self, location: str) -> None:
        path = self._path(location)
        with _os_errors(location), contextlib.suppress(FileNotFoundError):
            path.unlink()

    def _path(self, location: str) -> Path:
        """The file ``location`` names, resolved (links followed) under the directory, or refused."""
        if not location.startswith(self.SCHEME):
            raise PermanentError(f"{location!r} is not a location in the evidence directory")
        root = self.root.resolve()
        path = (root / location.removeprefix(self.SCHEME)).resolve()
        if path == root or not path.is_relative_to(root):
            raise PermanentError(f"{location!r} leads out of the evidence directory: refused")
        return path


@contextmanager
def _os_errors(what: str) -> Iterator[None]:
    """File errors as the ports' errors: gone is NotFound, refused is the site's configuration."""
    try:
        yield
    except FileNotFoundError as exc:
        raise NotFound(f"collected evidence {what}: no such file") from exc
    except PermissionError as exc:
        raise ConfigError(f"collected evidence {what}: permission denied ({exc.strerror})",
                          component=COMPONENT) from exc
    except OSError as exc:
        raise TransientError(f"collected evidence {what}: {exc.strerror or type(exc).__name__}") from exc


class S3Store:
    """Objects in ``bucket`` under ``prefix``, through boto3 (credentials from the environment and
    boto's chain; ``endpoint_url`` for an S3-compatible store). SDK retries are few: the caller retries."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, client: Any = None) -> None:
        self.bucket, self.prefix = bucket, prefix
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30)
            client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        self._client = client

    def put(self, key: str, data: bytes) -> str:
        name = self.prefix + checked_key(key)
        with _s3_errors(name):
            self._client.put_object(Bucket=self.bucket, Key=name, Body=data)
        return f"s3://{self.bucket}/{name}"

    def get(self, location: str) -> bytes:
        name = self._key(location)
        with _s3_errors(name):
            body: bytes = self._client.get_object(Bucket=self.bucket, Key=name)["Body"].read()
        return body

    def delete(self, location: str) -> None:
        name = self._key(location)
        with _s3_errors(name):
            self._client.delete_object(Bucket=self.bucket, Key=name)  # a key already gone: success

    def _key(self, location: str) -> str:
        """The object key ``location`` names in our bucket under our prefix, or refused."""
        head = f"s3://{self.bucket}/{self.prefix}"
        if not location.startswith(head) or not KEY.fullmatch(location.removeprefix(head)):
            raise PermanentError(f"{location!r} is not an object of the evidence bucket under its prefix")
        return location.removeprefix(f"s3://{self.bucket}/")


@contextmanager
def _s3_errors(name: str) -> Iterator[None]:
    """botocore's errors as the ports' errors, with the service's code and message and no secret."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    try:
        yield
    except ClientError as exc:
        error, meta = exc.response.get("Error", {}), exc.response.get("ResponseMetadata", {})
        code, status = error.get("Code", ""), meta.get("HTTPStatusCode")
        if code == "NoSuchBucket":  # every item would fail alike: the site's configuration
            raise ConfigError(f"collected evidence bucket: {code}: {error.get('Message', '')}",
                              component=COMPONENT) from exc
        if code in ("NoSuchKey", "NotFound"):
            status = 404
        raise error_for_status(status, f"collected evidence {name}: {code}: {error.get('Message', '')}",
                               component=COMPONENT) from exc
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise ConfigError(f"collected evidence bucket: {type(exc).__name__}: no usable credentials",
                          component=COMPONENT) from exc
    except BotoConnectionError as exc:
        raise TransientError(f"collected evidence bucket unreachable ({type(exc).__name__})") from exc
    except BotoCoreError as exc:
        raise PermanentError(f"collected evidence bucket: {type(exc).__name__}") from exc


class MemoryStore:
    """In this process only: tests, and the embedded mode's simulated world."""

    SCHEME = "memory:"

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> str:
        self.blobs[checked_key(key)] = bytes(data)
        return self.SCHEME + key

    def get(self, location: str) -> bytes:
        try:
            return self.blobs[location.removeprefix(self.SCHEME)]
        except KeyError:
            raise NotFound(f"collected evidence {location}: not in memory") from None

    def delete(self, location: str) -> None:
        self.blobs.pop(location.removeprefix(self.SCHEME), None)


class NoopEvidenceStore:
    """The dry-run twin: stores nothing and records what it would have stored or removed."""

    SCHEME = "dry-run:"

    def __init__(self, recorder: Recorder | None = None) -> None:
        self.record = recorder or Recorder()

    def put(self, key: str, data: bytes) -> str:
        self.record("keep collected evidence", key=checked_key(key), bytes=len(data))
        return self.SCHEME + key

    def get(self, location: str) -> bytes:
        raise NotFound(f"collected evidence {location}: a dry run stored nothing")

    def delete(self, location: str) -> None:
        self.record("delete collected evidence", location=location)
