"""``api``: the dashboard, the JSON API and /metrics, and its bearer tokens (``REMEDIATION_API__*``).
A token's value is never echoed in an error."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from remediation.settings.base import Section

MIN_TOKEN_LENGTH = 16  # every bearer token, named or not: short enough to type, too long to guess
MIN_SESSION_KEY_LENGTH = 32  # the HMAC key of session ids: 32 characters of a random string or more


class ApiToken(Section):
    """One named bearer token. Its ``name`` is the actor every lever pulled with it is audited as."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][\w.@-]*$",
                      description="Who holds the token (a person or a team), recorded as the audit actor.")
    role: Literal["read", "admin", "repair"] = Field(
        description="read: every read; admin: reads and levers; repair: the repair system's callback "
        "(POST /api/v1/repair-requests/ID/callback) and nothing else.")
    token_file: Path | None = Field(None, description="File holding the token (a mounted Secret); read at "
                                    "start-up, surrounding whitespace stripped.")
    token: SecretStr | None = Field(None, description="The token itself, when no file is used (e.g. "
                                    "from the environment); give exactly one of token and token_file.")

    @model_validator(mode="after")
    def _one_source(self) -> ApiToken:
        if (self.token is None) == (self.token_file is None):
            raise ValueError(f"token {self.name!r}: give exactly one of token and token_file")
        if self.token_file is not None:
            try:
                secret = self.token_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"token {self.name!r}: cannot read token_file {self.token_file}: "
                                 f"{exc.strerror}") from None
            self.token = SecretStr(secret)
        if len(self.secret()) < MIN_TOKEN_LENGTH:
            raise ValueError(f"token {self.name!r}: a token must be at least {MIN_TOKEN_LENGTH} characters")
        return self

    def secret(self) -> str:
        return self.token.get_secret_value() if self.token is not None else ""


class ApiSettings(Section):
    """The dashboard, JSON API and /metrics, and who may use them."""
    bind: str = Field("127.0.0.1", description="Address the API and dashboard listen on.")
    port: int = Field(8080, ge=1, le=65535, description="Port of the API and dashboard.")
    admin_tokens: list[SecretStr] = Field(
        default_factory=list, description="Bearer tokens allowed to read and to act (levers)."
    )
    read_tokens: list[SecretStr] = Field(default_factory=list, description="Read-only bearer tokens.")
    tokens: list[ApiToken] = Field(
        default_factory=list,
        description="Named tokens with a role ({name, role, token_file}): the audit actor of a lever is "
        "the token's name. The unnamed admin_tokens and read_tokens stay accepted; their names are "
        "derived (admin-<first 8 hex digits of the token's sha256>, read-<...>).",
    )
    max_body_bytes: int = Field(
        65536, ge=1024, le=16 * 1024 * 1024,
        description="Largest request body accepted, in bytes; a larger one is refused (413) before it is "
        "read. A lever's JSON body is under 2 KiB, so 64 KiB leaves room without letting a client make "
        "the API hold megabytes.",
    )
    session_ttl_s: int = Field(
        12 * 3600, ge=60, le=7 * 86400,
        description="How long a dashboard login lasts, in seconds, before the token is asked again. A "
        "session also ends at logout, and when its token is removed from this configuration.",
    )
    session_key: SecretStr | None = Field(
        None,
        description="Server secret (32 characters or more) under which the database keeps dashboard "
        "session ids (HMAC-SHA-256), so a copy of the table cannot be matched against a cookie. Give "
        "every replica the same key (from a Secret); changing it ends every session. Unset, each "
        "process makes a random key at start-up: safe, but sessions end at a restart and are not "
        "shared between replicas.",
    )
    login_attempts_per_minute: int = Field(
        10, ge=1, le=10_000,
        description="Dashboard login attempts one client (address) may make in any minute; one more is "
        "refused with 429 before the token is compared. 10 leaves room for typos and stops a client "
        "trying tokens at the API's speed. Counted per API process.",
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        description="Comma-separated addresses (or CIDRs, or *) of the proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto uvicorn believes. Behind a TLS ingress, name the ingress's addresses so the "
        "session cookie keeps its Secure flag and the login limit counts the real client; the default "
        "believes only a proxy on the same host.",
    )
    metrics_require_token: bool = Field(
        False,
        description="Require a read or admin bearer token on /metrics. Off by default because "
        "/metrics carries only cluster-wide counts (no node names) and Prometheus scrapes it; turn it "
        "on when the port is reachable beyond the monitoring network.",
    )

    @field_validator("admin_tokens", "read_tokens")
    @classmethod
    def _long_enough(cls, value: list[SecretStr], info: ValidationInfo) -> list[SecretStr]:
        for i, secret in enumerate(value):
            if len(secret.get_secret_value()) < MIN_TOKEN_LENGTH:
                raise ValueError(f"{info.field_name}[{i}]: a token must be at least {MIN_TOKEN_LENGTH} characters")
        return value

    @field_validator("session_key")
    @classmethod
    def _key_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_SESSION_KEY_LENGTH:
            raise ValueError(f"the session key must be at least {MIN_SESSION_KEY_LENGTH} characters")
        return value

    def session_key_bytes(self) -> bytes:
        """The configured session key, or a fresh random one (this process's sessions only)."""
        if self.session_key is None:
            return secrets.token_bytes(32)
        return self.session_key.get_secret_value().encode()

    @model_validator(mode="after")
    def _distinct_names(self) -> ApiSettings:
        names = [t.name for t in self.tokens]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"api.tokens: each name must be unique (repeated: {', '.join(dup)})")
        return self
