"""X.509 proxies and delegation signing (agents.ce.x509proxy), with certificates made here."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from agents.ce.x509proxy import (
    INHERIT_ALL,
    PROXY_CERT_INFO,
    Credential,
    CredentialError,
    load_credential,
    make_proxy,
    sign_proxy_request,
)

NOW = datetime.now(UTC).replace(microsecond=0)


def _name(*cns: str) -> x509.Name:
    return x509.Name([x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.ORGANIZATION_NAME,
                                                                         "Test")]),
                      *(x509.RelativeDistinguishedName([x509.NameAttribute(
                          NameOID.COMMON_NAME, cn)]) for cn in cns)])


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def user() -> Credential:
    ca_key, key = _key(), _key()
    ca = (x509.CertificateBuilder().subject_name(_name("CA")).issuer_name(_name("CA"))
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(NOW - timedelta(days=1)).not_valid_after(NOW + timedelta(days=30))
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(_name("alice")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(2)
            .not_valid_before(NOW - timedelta(days=1)).not_valid_after(NOW + timedelta(days=2))
            .sign(ca_key, hashes.SHA256()))
    return Credential(cert, key, (ca,))


def _spki(key: Any) -> bytes:
    return bytes(key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo))


def _verify(cert: x509.Certificate, issuer: x509.Certificate) -> None:
    key = issuer.public_key()
    assert isinstance(key, rsa.RSAPublicKey) and cert.signature_hash_algorithm is not None
    key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(),
               cert.signature_hash_algorithm)


def _assert_proxy_of(cert: x509.Certificate, issuer: Credential) -> None:
    assert cert.issuer == issuer.certificate.subject
    assert list(cert.subject.rdns)[:-1] == list(issuer.certificate.subject.rdns)
    assert cert.subject.rdns[-1].get_attributes_for_oid(NameOID.COMMON_NAME)
    ext = cert.extensions.get_extension_for_oid(PROXY_CERT_INFO)
    assert ext.critical and isinstance(ext.value, x509.UnrecognizedExtension)
    assert ext.value.value == INHERIT_ALL
    assert cert.not_valid_after_utc <= issuer.not_after
    _verify(cert, issuer.certificate)


def test_a_proxy_file_reads_back_as_a_proxy_of_its_user(user: Credential, tmp_path: Path
                                                        ) -> None:
    path = tmp_path / "proxy.pem"
    path.write_bytes(make_proxy(user, lifetime=timedelta(hours=12), now=NOW))
    proxy = load_credential(path)
    assert proxy.is_proxy and not user.is_proxy
    assert proxy.chain == (user.certificate, *user.chain)
    assert proxy.not_after == NOW + timedelta(hours=12)
    _assert_proxy_of(proxy.certificate, user)


def test_a_proxy_never_outlives_its_user(user: Credential) -> None:
    pem = make_proxy(user, lifetime=timedelta(days=10), now=NOW)
    assert x509.load_pem_x509_certificates(pem)[0].not_valid_after_utc == user.not_after


def test_a_delegation_request_is_signed_as_a_proxy_of_the_proxy(user: Credential,
                                                                tmp_path: Path) -> None:
    path = tmp_path / "proxy.pem"
    path.write_bytes(make_proxy(user, lifetime=timedelta(hours=12), now=NOW))
    proxy = load_credential(path)
    ce_key = ec.generate_private_key(ec.SECP256R1())
    request = (x509.CertificateSigningRequestBuilder().subject_name(_name("whatever"))
               .sign(ce_key, hashes.SHA256()))
    pem = sign_proxy_request(request.public_bytes(serialization.Encoding.PEM), proxy,
                             lifetime=timedelta(hours=24), now=NOW)
    chain = x509.load_pem_x509_certificates(pem)
    assert chain[1:] == [proxy.certificate, user.certificate, *user.chain]
    assert b"PRIVATE KEY" not in pem
    delegated = chain[0]
    assert _spki(delegated.public_key()) == _spki(ce_key.public_key())
    _assert_proxy_of(delegated, proxy)
    assert delegated.not_valid_after_utc == proxy.not_after  # 12 h, not the 24 asked for


def _der(tag: int, content: bytes) -> bytes:
    n = len(content)
    length = bytes([n]) if n < 0x80 else bytes([0x80 | ((n.bit_length() + 7) // 8)]) + \
        n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag]) + length + content


def _version_two_request(key: rsa.RSAPrivateKey) -> bytes:
    """A request as A-REX 6 writes it: version 2 (PKCS#10 has 0), validly signed."""
    good = (x509.CertificateSigningRequestBuilder().subject_name(_name("arex"))
            .sign(key, hashes.SHA256()))
    info = bytearray(good.tbs_certrequest_bytes)
    version_at = info.index(bytes([0x02, 0x01, 0x00]))
    info[version_at + 2] = 2
    signature = key.sign(bytes(info), padding.PKCS1v15(), hashes.SHA256())
    algorithm = _der(0x30, _der(0x06, bytes.fromhex("2a864886f70d01010b")) + b"\x05\x00")
    der = _der(0x30, bytes(info) + algorithm + _der(0x03, b"\x00" + signature))
    with pytest.raises(x509.InvalidVersion):  # what cryptography says of it
        x509.load_der_x509_csr(der)
    return _request_pem(der)


def _request_pem(der: bytes) -> bytes:
    return (b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(der)
            + b"-----END CERTIFICATE REQUEST-----\n")


def test_a_request_of_version_two_is_read_as_arex_writes_it(user: Credential) -> None:
    key = _key()
    pem = sign_proxy_request(_version_two_request(key), user, lifetime=timedelta(hours=1),
                             now=NOW)
    delegated = x509.load_pem_x509_certificates(pem)[0]
    assert _spki(delegated.public_key()) == _spki(key.public_key())
    _assert_proxy_of(delegated, user)


def test_a_request_whose_signature_is_wrong_is_refused(user: Credential) -> None:
    der = base64.decodebytes(_version_two_request(_key()).split(b"-----")[2])
    tampered = der[:-5] + bytes([der[-5] ^ 1]) + der[-4:]
    with pytest.raises(CredentialError, match="signature is not valid"):
        sign_proxy_request(_request_pem(tampered), user, lifetime=timedelta(hours=1), now=NOW)
    with pytest.raises(CredentialError, match="not a PEM certificate request"):
        sign_proxy_request(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END", user,
                           lifetime=timedelta(hours=1), now=NOW)


def test_an_expired_credential_signs_nothing(user: Credential) -> None:
    request = (x509.CertificateSigningRequestBuilder().subject_name(_name("x"))
               .sign(_key(), hashes.SHA256()))
    with pytest.raises(CredentialError, match="expired"):
        sign_proxy_request(request.public_bytes(serialization.Encoding.PEM), user,
                           lifetime=timedelta(hours=1), now=NOW + timedelta(days=3))


def test_credential_files_that_cannot_be_used(user: Credential, tmp_path: Path) -> None:
    cert_pem = user.certificate.public_bytes(serialization.Encoding.PEM)
    with pytest.raises(CredentialError, match="cannot read"):
        load_credential(tmp_path / "missing.pem")
    (tmp_path / "cert-only.pem").write_bytes(cert_pem)
    with pytest.raises(CredentialError, match="no unencrypted PEM private key"):
        load_credential(tmp_path / "cert-only.pem")
    other = _key().private_bytes(serialization.Encoding.PEM,
                                 serialization.PrivateFormat.TraditionalOpenSSL,
                                 serialization.NoEncryption())
    (tmp_path / "mixed.pem").write_bytes(cert_pem + other)
    with pytest.raises(CredentialError, match="not the certificate's"):
        load_credential(tmp_path / "mixed.pem")
    (tmp_path / "nothing.pem").write_bytes(b"hello")
    with pytest.raises(CredentialError, match="no PEM certificate"):
        load_credential(tmp_path / "nothing.pem")
    # A certificate and its key in two files, as a user certificate comes.
    (tmp_path / "key.pem").write_bytes(user.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    loaded = load_credential(tmp_path / "cert-only.pem", tmp_path / "key.pem")
    assert loaded.certificate == user.certificate and not loaded.is_proxy
