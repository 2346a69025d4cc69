"""Throwaway certificate authorities for TLS tests: the `cryptography` package if installed, else the
`openssl` command; tests skip with the reason when neither is there."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Issued:
    cert: str
    key: str


@dataclass(frozen=True)
class ClusterCa:
    ca: str
    node: Issued  # signed by `ca`, for 127.0.0.1/localhost, server and client use


def make_ca(directory: Path, name: str = "cluster") -> ClusterCa:
    """A CA and one certificate it signed, as PEM files under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("TLS tests need the cryptography package or the openssl command; neither is installed")
        return _with_openssl(directory, name)
    return _with_cryptography(directory, name)


def _with_openssl(d: Path, name: str) -> ClusterCa:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ca_key, ca_pem = d / f"{name}-ca.key", d / f"{name}-ca.pem"
    key, csr, pem, ext = d / f"{name}-node.key", d / f"{name}-node.csr", d / f"{name}-node.pem", d / f"{name}.ext"
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
        str(ca_key), "-out", str(ca_pem), "-days", "2", "-subj", f"/CN={name} test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
        "-out", str(csr), "-subj", f"/CN={name} node")
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   "extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_pem), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(pem), "-days", "2", "-extfile", str(ext))
    return ClusterCa(str(ca_pem), Issued(str(pem), str(key)))


def _with_cryptography(d: Path, name: str) -> ClusterCa:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cn(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def write_key(path: Path, k: ec.EllipticCurvePrivateKey) -> None:
        path.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder().subject_name(cn(f"{name} test CA")).issuer_name(cn(f"{name} test CA"))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(cn(f"{name} node")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_pem, pem, key_pem = d / f"{name}-ca.pem", d / f"{name}-node.pem", d / f"{name}-node.key"
    ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_key(key_pem, key)
    return ClusterCa(str(ca_pem), Issued(str(pem), str(key_pem)))
