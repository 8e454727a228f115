"""Throwaway TLS certificates for tests, made with the openssl command line.

    ca = make_ca(tmp_path / "pki")
    server = make_cert(ca, tmp_path / "pki", "server", ["127.0.0.1", "localhost"])
    client = make_cert(ca, tmp_path / "pki", "client")
    server.cert, server.key, server.ca   # PEM files: leaf certificate, its key, the CA

Generic on purpose (Redis and the Kafka broker tests both use it): PEM files only,
unencrypted PKCS#8 keys ("BEGIN PRIVATE KEY", what Kafka's PEM support reads); a
test that needs a keystore converts them itself. Every leaf may serve as server and
as client (extendedKeyUsage both), because brokers are clients of each other.

Why the openssl CLI and not the `cryptography` package: the CLI is on every machine
that runs redis-server or Kafka with TLS, and the certificates it makes are the ones
an operator would make by hand. Extensions follow what Python's ssl checks strictly
(VERIFY_X509_STRICT on newer Pythons): the CA has keyUsage keyCertSign, every leaf
has subject and authority key identifiers and CA:FALSE.
"""

from __future__ import annotations

import ipaddress
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DAYS = 2  # long enough for any test run, short enough that a leaked file is useless soon


@dataclass(frozen=True)
class CertFiles:
    """PEM paths of one certificate: `cert` and `key`; `ca` is the certificate of its
    issuer (the CA's own file for a CA)."""

    name: str
    cert: Path
    key: Path
    ca: Path


def make_ca(directory: Path, name: str = "test-ca") -> CertFiles:
    """A self-signed CA: `<directory>/<name>.crt` and `<name>.key`."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(DAYS),
        "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash",
    )
    return CertFiles(name, cert, key, cert)


def make_cert(
    ca: CertFiles,
    directory: Path,
    name: str,
    sans: Sequence[str] = (),
    *,
    common_name: str | None = None,
    subject_prefix: str = "",
) -> CertFiles:
    """A leaf certificate signed by `ca`: `<directory>/<name>.crt` and `<name>.key`.
    `sans`: subjectAltName entries; a bare IP address becomes `IP:...`, another bare
    name `DNS:...`, and an entry with a type prefix (`email:...`, `URI:...`) is kept.
    The common name is `common_name`, else the first SAN, else `name`; `subject_prefix`
    puts RDNs before it, e.g. "/O=Example/OU=ml" (a broker reads that subject as
    "CN=...,OU=ml,O=Example": RFC 2253 lists the last RDN first)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key, csr, ext = (directory / f"{name}.{s}" for s in ("crt", "key", "csr", "ext"))
    alt = [_san(s) for s in sans]
    cn = common_name or (sans[0] if sans else name)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"{subject_prefix}/CN={cn}",
             "-keyout", str(key), "-out", str(csr))
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "extendedKeyUsage=serverAuth,clientAuth",
        "subjectKeyIdentifier=hash",
        "authorityKeyIdentifier=keyid,issuer",
    ]
    if alt:
        lines.append("subjectAltName=" + ",".join(alt))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-set_serial", str(secrets.randbits(63)), "-days", str(DAYS), "-sha256",
        "-extfile", str(ext), "-out", str(cert),
    )
    csr.unlink()
    ext.unlink()
    return CertFiles(name, cert, key, ca.cert)


def _san(entry: str) -> str:
    if ":" in entry and entry.split(":", 1)[0] in ("IP", "DNS", "email", "URI", "RID", "dirName", "otherName"):
        return entry
    try:
        ipaddress.ip_address(entry)
    except ValueError:
        return f"DNS:{entry}"
    return f"IP:{entry}"


def _openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise RuntimeError("openssl is not on PATH (needed to make test certificates)")
    done = subprocess.run([binary, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed ({done.returncode}): {done.stderr.strip()}")


def encrypt_key(cert: CertFiles, directory: Path, passphrase: str) -> Path:
    """`cert`'s key, AES-encrypted with `passphrase` ("BEGIN ENCRYPTED PRIVATE KEY"),
    as `<directory>/<name>-encrypted.key`: what a program must refuse or decrypt."""
    out = directory / f"{cert.name}-encrypted.key"
    _openssl("pkcs8", "-topk8", "-v2", "aes-256-cbc", "-in", str(cert.key), "-out", str(out),
             "-passout", f"pass:{passphrase}")
    return out
