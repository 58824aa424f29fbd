"""Replica lookups in a Rucio server (``[catalogue] backend = "rucio"``), through Rucio's own
client library (``rucio-clients``, imported only when this catalogue is chosen).

An LFN names a Rucio DID as DIRAC's Rucio file catalogue names it: the scope is the LFN's
second path component (``/lhcb/data/run1.dst`` is ``data:/lhcb/data/run1.dst``), the name is
the LFN itself. Only replicas Rucio reports available count. A server that does not answer,
or refuses gridpilot's account, raises :class:`CatalogueUnavailableError`: the submission is
refused with 503 and nothing is stored, and the optimizer agent tries its jobs again later.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from taskqueue.core.errors import CatalogueUnavailableError
from taskqueue.core.settings import CatalogueSettings
from taskqueue.db.database import Session

#: DIDs asked for per call (Rucio's bulk replica lookup).
_CHUNK = 500


def did_of(lfn: str) -> dict[str, str]:
    """The DID of an LFN: DIRAC's convention (the scope is the second path component; the
    first when there is only one)."""
    parts = lfn.rstrip("/").split("/")
    return {"scope": parts[2] if len(parts) > 2 else parts[1], "name": lfn}


class RucioCatalogue:
    """The replicas a Rucio server knows (its RSEs are the storage elements of
    conf/resources.toml's SE and CloseSE lists)."""

    def __init__(self, settings: CatalogueSettings) -> None:
        self.settings = settings
        self.name = f"Rucio at {settings.rucio_url}"
        self._client: Any = None
        self._lock = threading.Lock()

    def _connected(self) -> Any:
        with self._lock:
            if self._client is None:
                from rucio.client import Client

                s = self.settings
                try:
                    self._client = Client(
                        rucio_host=s.rucio_url, auth_host=s.rucio_auth_url or s.rucio_url,
                        account=s.rucio_account, auth_type="userpass",
                        creds={"username": s.rucio_username,
                               "password": s.rucio_password()},
                        timeout=s.rucio_timeout)
                except Exception as exc:  # the client raises its own classes, and OSErrors
                    raise CatalogueUnavailableError(
                        f"the replica catalogue ({self.name}) cannot be reached as account "
                        f"{s.rucio_account}: {exc}") from exc
            return self._client

    def locate(self, session: Session, vo: str, lfns: Sequence[str]
               ) -> Mapping[str, frozenset[str]]:
        """The RSEs holding an available replica of each file; files Rucio does not know are
        left out. (``session`` and ``vo`` are not used: the server is the VO's.)"""
        client = self._connected()
        found: dict[str, frozenset[str]] = {}
        wanted = set(lfns)
        try:
            for start in range(0, len(lfns), _CHUNK):
                dids = [did_of(lfn) for lfn in lfns[start:start + _CHUNK]]
                for replica in client.list_replicas(dids, all_states=False):
                    name = replica.get("name")
                    rses = frozenset(replica.get("rses") or {})
                    if name in wanted and rses:
                        found[name] = rses
        except Exception as exc:  # a lost connection, a refused token, a server error
            raise CatalogueUnavailableError(
                f"the replica catalogue ({self.name}) did not answer: {exc}") from exc
        return found
