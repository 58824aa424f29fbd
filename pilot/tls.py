"""Which certificate authorities the pilot and ``gridpilot-client`` trust for the service's
https URL, and what to say when the service's certificate cannot be verified.

The CAs are looked for, first found wins, in:

1. ``--ca-bundle``;
2. ``$GRIDPILOT_CA_BUNDLE``;
3. (the client only) its config file's ``ca_bundle``;
4. ``$X509_CERT_DIR`` (grid worker nodes: ``/etc/grid-security/certificates``);
5. the system's store (``requests``' own, which ``$REQUESTS_CA_BUNDLE`` replaces).

Each is a PEM file of CA certificates or a folder of them named by their OpenSSL subject hash
(``openssl rehash``). A CA given (1-4) is the only one trusted for https: a folder of grid
CAs does not hold the web's public CAs. Standard library and ``requests`` only.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import requests

#: The environment variables read, in order.
CA_BUNDLE_ENV = "GRIDPILOT_CA_BUNDLE"
CERT_DIR_ENV = "X509_CERT_DIR"
#: How to fix a failed verification.
HINT = "give the CA with --ca-bundle or GRIDPILOT_CA_BUNDLE"


class CABundleError(ValueError):
    """The CA bundle named cannot be used; the message says which and why."""


def trusted_cas(option: str | None, environ: Mapping[str, str], *,
                configured: tuple[str, str | None] = ("", None)) -> tuple[str | bool, str]:
    """What ``requests``' ``verify`` is to be (a file or folder path, or True for the system
    store), and where it came from. ``configured``: a config file's setting and where it is.
    Raises :class:`CABundleError` when the one chosen is missing or neither a file nor a
    folder."""
    for source, value in (("--ca-bundle", option),
                          (CA_BUNDLE_ENV, environ.get(CA_BUNDLE_ENV)), configured,
                          (CERT_DIR_ENV, environ.get(CERT_DIR_ENV))):
        if value:
            return check_bundle(value, source), source
    return True, "the system's store"


def check_bundle(value: str, source: str) -> str:
    """``value`` as an absolute path once it names a file or folder."""
    path = Path(value).expanduser()
    if not path.exists():
        raise CABundleError(f"{source}: the CA bundle {value} does not exist")
    if not (path.is_file() or path.is_dir()):
        raise CABundleError(f"{source}: the CA bundle {value} is neither a file nor a folder")
    if path.is_file():
        # Read now, as each https request would: a file OpenSSL cannot use is said here,
        # once, not as a failure of every request to the service.
        try:
            ssl.create_default_context(cafile=str(path))
        except (ssl.SSLError, OSError) as exc:
            raise CABundleError(f"{source}: the CA bundle {value} holds no PEM certificate "
                                f"that can be read: {_reason(exc)}") from None
    return str(path.resolve())


def _reason(exc: ssl.SSLError | OSError) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return exc.strerror or str(exc)


def trusting(session: requests.Session, verify: str | bool | None) -> requests.Session:
    """``session``, verifying https certificates against ``verify`` (None: the system's
    store)."""
    session.verify = True if verify is None else verify
    return session


def certificate_failure(exc: BaseException) -> str | None:
    """The reason a TLS verification failed, when ``exc`` is (or carries) such a failure."""
    for e in causes(exc):
        reason = getattr(e, "verify_message", None)
        if reason:
            return str(reason)
    for e in causes(exc):
        if isinstance(e, requests.exceptions.SSLError) or type(e).__name__ in (
                "SSLCertVerificationError", "SSLError"):
            text = str(e)
            if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
                start = text.find("certificate verify failed")
                return (text[start:].split(" (_ssl")[0].rstrip(")'\" ")
                        if start >= 0 else text[:200])
    return None


def failure_message(url: str, reason: str) -> str:
    """What a failed verification of ``url``'s server says, with the fix."""
    parts = urlsplit(url)
    return (f"the certificate of {parts.scheme}://{parts.netloc} could not be verified: "
            f"{reason}; {HINT}")


def causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and every one it carries (requests wraps urllib3's, which wraps the
    socket's: as arguments, a ``reason``, or the cause)."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack += [a for a in e.args if isinstance(a, BaseException)]
        stack += [c for c in (getattr(e, "reason", None), e.__cause__, e.__context__)
                  if isinstance(c, BaseException)]
