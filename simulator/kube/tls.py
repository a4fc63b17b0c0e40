"""The fake kube-apiserver's PKI: a per-run cluster CA and a serving certificate it signed.

Writes ``kube-ca.crt`` (the only file clients need) and ``kube-apiserver.crt``/``.key`` with a real
apiserver's SANs plus 127.0.0.1, ``localhost`` and any names given. SAN parsing comes from
:mod:`remediation.simulator.azure_api`.

Why: docs/kubernetes.md#inside-the-local-kube-apiserver
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remediation.simulator.azure_api import _alt_names

IN_CLUSTER_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def _usage(x509: Any, **enabled: bool) -> Any:
    """A KeyUsage extension with only ``enabled`` set (the constructor takes all nine flags)."""
    flags = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
             "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")  # fmt: skip
    return x509.KeyUsage(**{flag: enabled.get(flag, False) for flag in flags})


@dataclass(frozen=True)
class ClusterPKI:
    ca_file: Path
    cert_file: Path
    key_file: Path


def write_cluster_pki(directory: Path, hosts: Sequence[str] = (), *, valid_days: int = 1) -> ClusterPKI:
    """Generate the CA and the serving certificate into ``directory`` and return their paths."""
    return write_pki(
        directory,
        ("kubernetes", "kube-ca"),
        "kube-apiserver",
        hosts=[*IN_CLUSTER_NAMES, *hosts],
        valid_days=valid_days,
    )


def write_pki(
    directory: Path, ca_names: tuple[str, str], server: str, *, hosts: Sequence[str] = (), valid_days: int = 1
) -> ClusterPKI:
    """A CA (``ca_names``: its CN and file stem) and a ``serverAuth`` certificate it signed (CN and file stem
    ``server``) for 127.0.0.1, localhost and ``hosts``, written into ``directory``. The simulated
    BMC (:mod:`remediation.simulator.redfish_bmc`) serves its HTTPS the same way."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    now = dt.datetime.now(dt.UTC)
    window = (now - dt.timedelta(minutes=5), now + dt.timedelta(days=valid_days))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        _certificate(ca_names[0], ca_names[0], ca_key.public_key(), window=window)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(x509, digital_signature=True, key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _certificate(server, ca_names[0], key.public_key(), window=window)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(x509, digital_signature=True, key_encipherment=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(
            x509.SubjectAlternativeName(_alt_names(["127.0.0.1", "localhost", *hosts])),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = ClusterPKI(
        directory / f"{ca_names[1]}.crt", directory / f"{server}.crt", directory / f"{server}.key"
    )
    pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    pki.key_file.chmod(0o600)
    return pki


def _certificate(
    subject: str, issuer: str, public_key: Any, *, window: tuple[dt.datetime, dt.datetime]
) -> Any:
    """A certificate builder for CN ``subject`` issued by CN ``issuer``, valid over ``window``, with a
    random serial number and no extensions yet."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    return (
        x509.CertificateBuilder()
        .subject_name(name(subject))
        .issuer_name(name(issuer))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(window[0])
        .not_valid_after(window[1])
    )
