"""What a CE's error says first: the innermost reason of a failed exchange (issue 34 item 7).

``requests`` wraps urllib3's error, which wraps the socket's: its text reads "HTTPSConnectionPool
(host=…): Max retries exceeded with url: … (Caused by NewConnectionError('<urllib3.connection
.HTTPSConnection object at 0x…>: Failed to establish a new connection: [Errno 111] Connection
refused'))", and a reason kept to 255 characters lost the one part that says what happened.
:func:`innermost` finds that part ("[Errno 111] Connection refused"), which the CE's messages
give first. (The pilot has the same walk in ``pilot.tls.causes``; the agents may not import the
pilot package, docs/ARCHITECTURE.md.)
"""

from __future__ import annotations

import re

#: urllib3's reprs of its connection objects, which say nothing to an operator.
_OBJECT = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>:?\s*")


def _inner(exc: BaseException) -> BaseException | None:
    """The exception ``exc`` carries: as an argument, a ``reason``, or its cause."""
    for candidate in (*exc.args, getattr(exc, "reason", None), exc.__cause__, exc.__context__):
        if isinstance(candidate, BaseException) and candidate is not exc:
            return candidate
    return None


def innermost(exc: BaseException) -> str:
    """The text of the innermost exception ``exc`` carries that says something, without
    urllib3's object reprs."""
    seen = {id(exc)}
    found = exc
    while (inner := _inner(found)) is not None and id(inner) not in seen:
        seen.add(id(inner))
        found = inner
    for e in (found, exc):
        text = _OBJECT.sub("", str(e)).strip()
        if text:
            return text
    return type(exc).__name__
