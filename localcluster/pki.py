"""Throwaway certificate authorities and certificates for a local control plane and webhook.

Everything is made in memory with `cryptography` (EC P-256, SHA-256) and written as PEM by
the caller. Lifetimes are short (default 7 days): these are test and demo credentials.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, both PEM-encoded bytes."""

    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class CertificateAuthority:
    """A self-signed CA that issues serving and client certificates.

    `issue_server(names)` gives a serving cert whose SANs are the DNS names and IP addresses
    in `names`; `issue_client(user, groups)` a client cert with CN=user and O=groups (what
    kube-apiserver's x509 authenticator maps to user name and groups).
    """

    def __init__(self, common_name: str, *, days: int = 7) -> None:
        self._key = _key()
        self._days = days
        now = dt.datetime.now(dt.timezone.utc)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self._name = name
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM."""
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def _issue(self, subject: x509.Name, usage: x509.ObjectIdentifier,
               sans: list[x509.GeneralName] | None) -> KeyPair:
        key = _key()
        now = dt.datetime.now(dt.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=self._days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def issue_server(self, names: list[str]) -> KeyPair:
        """A serving certificate for `names` (IP literals become IP SANs, others DNS SANs)."""
        sans: list[x509.GeneralName] = []
        for n in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                sans.append(x509.DNSName(n))
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
        return self._issue(subject, ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def issue_client(self, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate for Kubernetes user `user` in `groups` (CN and O attributes)."""
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        return self._issue(x509.Name(attrs), ExtendedKeyUsageOID.CLIENT_AUTH, None)


def rsa_service_account_keys() -> KeyPair:
    """An RSA key pair for service-account token signing: (public key PEM, private key PEM)."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    priv = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    return KeyPair(pub, priv)
