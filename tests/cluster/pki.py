"""Throwaway certificate authority, certificates and kubeconfigs for the test control plane.

Everything is ECDSA P-256 and valid for a week, like controller-runtime's envtest:
one CA signs the API server's serving certificate and every client certificate.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=7)


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return cert, key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _sign(
    builder: x509.CertificateBuilder, signer: ec.EllipticCurvePrivateKey, key: ec.EllipticCurvePrivateKey
) -> KeyPair:
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        builder.public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .sign(signer, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class CertificateAuthority:
    def __init__(self, common_name: str = "queueworker-test-ca"):
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._subject = _name(common_name)
        self.pair = _sign(
            x509.CertificateBuilder()
            .subject_name(self._subject)
            .issuer_name(self._subject)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                    key_encipherment=False, data_encipherment=False, key_agreement=False,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            ),
            self._key,
            self._key,
        )

    def _leaf(self, subject: x509.Name, usage: x509.ObjectIdentifier) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._subject)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )

    def serving(self, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> KeyPair:
        """A server certificate whose SANs cover the loopback names clients connect with."""
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = self._leaf(_name(hosts[0]), ExtendedKeyUsageOID.SERVER_AUTH).add_extension(
            x509.SubjectAlternativeName(names), critical=False
        )
        return _sign(builder, self._key, ec.generate_private_key(ec.SECP256R1()))

    def client(self, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate: the API server reads the user from CN and the groups from O."""
        builder = self._leaf(_name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH)
        return _sign(builder, self._key, ec.generate_private_key(ec.SECP256R1()))


def service_account_signer() -> KeyPair:
    """The key pair kube-apiserver signs ServiceAccount tokens with (the 'cert' is the public key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(public, _key_pem(key))


def write_kubeconfig(path: Path, server: str, ca: KeyPair, user: KeyPair, name: str = "queueworker-test") -> Path:
    """A self-contained kubeconfig (certificates inline); JSON is valid YAML."""
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca.cert_pem)}}],
        "users": [{"name": name, "user": {
            "client-certificate-data": b64(user.cert_pem), "client-key-data": b64(user.key_pem),
        }}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path
