"""X.509 proxy certificates (RFC 3820) with ``cryptography``: read a credential file, sign a
certificate request as a proxy of that credential (how a client delegates to an ARC-CE), and
make a proxy of a user certificate (what ``arcproxy`` or ``voms-proxy-init`` do, without VOMS).

A proxy file holds the proxy certificate, its private key, then the certificates that issued
it (the user certificate, and further proxies if it is a proxy of a proxy). The delegated
proxy handed to the CE is the new certificate followed by that whole chain, never a key.
"""

from __future__ import annotations

import base64
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

#: RFC 3820's ProxyCertInfo extension.
PROXY_CERT_INFO = x509.ObjectIdentifier("1.3.6.1.5.5.7.1.14")
#: Its value for a proxy that inherits all the rights of its issuer, no path length limit:
#: SEQUENCE { SEQUENCE { OBJECT IDENTIFIER id-ppl-inheritAll (1.3.6.1.5.5.7.21.1) } }.
INHERIT_ALL = bytes.fromhex("300c300a06082b06010505071501")
#: A proxy starts a little in the past, for clocks that lag behind ours.
CLOCK_SKEW = timedelta(minutes=5)

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
_KEY_BLOCK = re.compile(rb"-----BEGIN ((?:RSA |EC )?PRIVATE KEY)-----.+?-----END \1-----",
                        re.DOTALL)


class CredentialError(ValueError):
    """A credential file that cannot be used, with what is wrong with it."""


@dataclass(frozen=True)
class Credential:
    """A certificate, its private key and the certificates that issued it, in order."""

    certificate: x509.Certificate
    key: PrivateKey
    chain: tuple[x509.Certificate, ...]

    @property
    def not_after(self) -> datetime:
        return self.certificate.not_valid_after_utc

    @property
    def is_proxy(self) -> bool:
        return _is_proxy(self.certificate)


def _is_proxy(certificate: x509.Certificate) -> bool:
    return any(ext.oid == PROXY_CERT_INFO for ext in certificate.extensions)


def load_credential(path: Path, key_path: Path | None = None) -> Credential:
    """A proxy file (certificate, key, chain in one PEM file), or a certificate file and its
    key file. Raises CredentialError naming the file."""
    try:
        data = path.read_bytes()
        key_data = key_path.read_bytes() if key_path is not None else data
    except OSError as exc:
        raise CredentialError(f"cannot read {exc.filename}: {exc.strerror}") from exc
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise CredentialError(f"{path} holds no PEM certificate") from exc
    found = _KEY_BLOCK.search(key_data)
    if found is None:
        raise CredentialError(f"{key_path or path} holds no unencrypted PEM private key")
    try:
        key = serialization.load_pem_private_key(found.group(0), password=None)
    except (ValueError, TypeError) as exc:
        raise CredentialError(f"{key_path or path}: the private key cannot be read ({exc})"
                              ) from exc
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise CredentialError(f"{key_path or path}: only RSA and EC keys are supported")
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != certificates[0].public_key().public_bytes(*spki):
        raise CredentialError(f"{key_path or path}: the private key is not the certificate's")
    return Credential(certificates[0], key, tuple(certificates[1:]))


def _proxy_certificate(issuer: Credential,
                       public_key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey, *,
                       lifetime: timedelta, now: datetime) -> x509.Certificate:
    serial = secrets.randbits(63) | 1
    subject = x509.Name([*issuer.certificate.subject.rdns,
                         x509.RelativeDistinguishedName(
                             [x509.NameAttribute(NameOID.COMMON_NAME, str(serial))])])
    not_before = max(now - CLOCK_SKEW, issuer.certificate.not_valid_before_utc)
    not_after = min(now + lifetime, issuer.not_after)
    if not_after <= now:
        raise CredentialError(f"the credential of {issuer.certificate.subject.rfc4514_string()} "
                              f"expired at {issuer.not_after:%Y-%m-%d %H:%M:%S} UTC")
    builder = (x509.CertificateBuilder()
               .subject_name(subject)
               .issuer_name(issuer.certificate.subject)
               .public_key(public_key)
               .serial_number(serial)
               .not_valid_before(not_before)
               .not_valid_after(not_after)
               .add_extension(x509.UnrecognizedExtension(PROXY_CERT_INFO, INHERIT_ALL),
                              critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=False, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False,
                                            decipher_only=False), critical=True))
    return builder.sign(issuer.key, hashes.SHA256())


def _pem(*certificates: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def _der_element(data: bytes, at: int) -> tuple[int, int, int]:
    """The tag, the start of the content and the end of the DER element at ``at``."""
    if at + 2 > len(data):
        raise CredentialError("the delegation request is cut short")
    tag, length, start = data[at], data[at + 1], at + 2
    if length & 0x80:
        count = length & 0x7F
        length, start = int.from_bytes(data[start:start + count], "big"), start + count
    if start + length > len(data):
        raise CredentialError("the delegation request is cut short")
    return tag, start, start + length


def _pem_body(pem: bytes) -> bytes:
    lines = [line.strip() for line in pem.splitlines()]
    body = b"".join(line for line in lines if line and not line.startswith(b"-----"))
    try:
        return base64.b64decode(body, validate=True)
    except ValueError as exc:
        raise CredentialError("the delegation request is not PEM") from exc


def _load_request(request_pem: bytes) -> tuple[x509.CertificateSigningRequest, bytes]:
    """The request and the bytes its signature covers. A-REX 6 writes its requests with
    version 2 where PKCS#10 has 0, which ``cryptography`` refuses: the version is read as 0,
    and the signature checked over the request as it came."""
    try:
        request = x509.load_pem_x509_csr(request_pem)
        return request, request.tbs_certrequest_bytes
    except x509.InvalidVersion:
        pass
    except ValueError as exc:
        raise CredentialError("the delegation request is not a PEM certificate request"
                              ) from exc
    der = _pem_body(request_pem)
    _, outer, _ = _der_element(der, 0)
    _, info, info_end = _der_element(der, outer)
    tag, version, version_end = _der_element(der, info)
    if tag != 0x02:
        raise CredentialError("the delegation request has no version")
    patched = der[:version] + bytes(version_end - version) + der[version_end:]
    try:
        return x509.load_der_x509_csr(patched), der[outer:info_end]
    except ValueError as exc:
        raise CredentialError("the delegation request is not a certificate request") from exc


def sign_proxy_request(request_pem: bytes, issuer: Credential, *, lifetime: timedelta,
                       now: datetime | None = None) -> bytes:
    """Sign a certificate request (a CE's delegation request) as a proxy of ``issuer``; returns
    the new certificate and the issuer's chain, PEM. The proxy ends with the issuer at the
    latest."""
    request, signed = _load_request(request_pem)
    public_key = request.public_key()
    algorithm = request.signature_hash_algorithm
    try:
        if isinstance(public_key, rsa.RSAPublicKey) and algorithm is not None:
            public_key.verify(request.signature, signed, padding.PKCS1v15(), algorithm)
        elif isinstance(public_key, ec.EllipticCurvePublicKey) and algorithm is not None:
            public_key.verify(request.signature, signed, ec.ECDSA(algorithm))
        else:
            raise CredentialError("the delegation request's key is neither RSA nor EC")
    except InvalidSignature as exc:
        raise CredentialError("the delegation request's signature is not valid") from exc
    certificate = _proxy_certificate(issuer, public_key, lifetime=lifetime,
                                     now=now or datetime.now(UTC))
    return _pem(certificate, issuer.certificate, *issuer.chain)


def make_proxy(issuer: Credential, *, lifetime: timedelta, now: datetime | None = None,
               bits: int = 2048) -> bytes:
    """A new proxy of ``issuer`` with a new key: the PEM text of a proxy file (certificate,
    key, chain), as ``arcproxy`` writes it."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    certificate = _proxy_certificate(issuer, key.public_key(), lifetime=lifetime,
                                     now=now or datetime.now(UTC))
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    return _pem(certificate) + key_pem + _pem(issuer.certificate, *issuer.chain)
