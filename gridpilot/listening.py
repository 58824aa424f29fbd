"""Where ``gridpilot serve`` listens, and whether the URL pilots are given reaches it.

``python -m gridpilot.listening BIND URL`` is what ``gridpilot serve`` runs, in a process of
its own, once it listens: it waits until the service answers on BIND, then asks URL's
/healthz, and says in one line whether URL reaches a gridpilot service (pilots that the site
director starts with a URL that does not reach it never get a job, and exit 5).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
from urllib.parse import urlsplit

import requests

from taskqueue.core.errors import ConfigurationError

#: How long the check waits for the service it belongs to to answer, in seconds.
STARTUP_PATIENCE = 120.0


def split_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) as host and port; a clear error otherwise."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"cannot listen on {bind!r}: give HOST:PORT, e.g. "
                                 f"127.0.0.1:8080")
    return host.removeprefix("[").removesuffix("]"), int(port)


def check_port_free(bind: str) -> None:
    """Refuse, in one line, an address another process listens on (gunicorn would retry five
    times and print each attempt)."""
    host, port = split_bind(bind)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigurationError(f"cannot listen on {bind}: the name {host} does not "
                                 f"resolve") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn does
        try:
            probe.bind(address)
        except OSError as exc:
            why = ("another process listens there" if exc.errno == errno.EADDRINUSE
                   else exc.strerror or str(exc))
            raise ConfigurationError(f"cannot listen on {bind}: {why}") from exc



def _local_url(bind: str) -> str:
    host, port = split_bind(bind)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _answers_as_gridpilot(base: str, timeout: float) -> str | None:
    """None when BASE/healthz answers as a gridpilot service does, else why not."""
    host = urlsplit(base).hostname or ""
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror:
        return f"the name {host} does not resolve"
    try:
        answer = requests.get(f"{base.rstrip('/')}/healthz", timeout=timeout)
    except requests.exceptions.SSLError as exc:
        return f"its TLS certificate is refused: {exc}"
    except requests.ConnectionError:
        return "connection refused or no route"
    except requests.Timeout:
        return f"no answer within {timeout:g} s"
    except requests.RequestException as exc:
        return str(exc)
    kind = answer.headers.get("Content-Type", "")
    if answer.status_code in (200, 503) and "json" in kind:
        return None
    return f"it answers HTTP {answer.status_code}, not as a gridpilot service"


def check_url(bind: str, url: str, *, patience: float = STARTUP_PATIENCE) -> str | None:
    """Wait for the service on BIND to answer, then say whether URL reaches a gridpilot
    service: None if so, else why not. None also when the service never answered (it
    stopped, or failed to start: it says why itself)."""
    deadline = time.monotonic() + patience
    parent = os.getppid()
    own = _local_url(bind)
    while _answers_as_gridpilot(own, 5) is not None:
        if time.monotonic() > deadline or os.getppid() != parent:
            return None
        time.sleep(0.5)
    return _answers_as_gridpilot(url, 10)


def main(argv: list[str]) -> int:
    bind, url = argv
    why = check_url(bind, url)
    if why is None:
        return 0
    print(f"gridpilot serve: warning: [matcher] url {url}, the URL pilots are given, does not "
          f"reach this service ({why}); set [matcher] url (or GRIDPILOT_MATCHER_URL) to the "
          f"address worker nodes reach it at", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
