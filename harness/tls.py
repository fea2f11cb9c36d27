"""A certificate authority of the tests' own (trustme) and a server certificate it signed for
127.0.0.1 and localhost, written as PEM files: what the TLS tests' Redis, RabbitMQ and PostgreSQL
present, and what their clients verify them against."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class TLSFiles:
    ca: Path  # the authority's certificate: what a client trusts
    cert: Path  # the server's certificate chain
    key: Path  # the server's private key


def make_tls(folder: Path) -> TLSFiles:
    """A new authority and a server certificate for 127.0.0.1 and localhost, in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    authority = trustme.CA(organization_name="sas_app tests")
    server = authority.issue_cert("127.0.0.1", "localhost")
    files = TLSFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    authority.cert_pem.write_to_path(str(files.ca))
    files.cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(files.key))
    files.key.chmod(0o600)
    return files
