"""What every reader of job descriptions shares: the raw fields, the error, how a value is shown.

A JDL (ClassAd) and its JSON equivalent are first turned into a mapping of canonical field
names (the JDL's) to ``(label, value)`` pairs, where the label is how the user wrote the field
("CPUTime", or "attributes.duration" in JSON); optimizers.description validates it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from taskqueue.core.errors import InvalidInputError

Raw = dict[str, tuple[str, Any]]
#: The fields of a parametric description; a named sequence adds ``.NAME`` (Parameters.A).
PARAMETRIC = ("Parameters", "ParameterStart", "ParameterStep", "ParameterFactor")


class JobDescriptionError(InvalidInputError):
    """A job description is malformed; ``field`` names the offending field, if there is one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def show(value: Any) -> str:
    """A value as the user would recognise it in a message (short)."""
    text_of = getattr(value, "text", None)
    if isinstance(text_of, str):
        text = text_of  # an expression
    elif isinstance(value, str):
        text = '"' + value.replace('"', '\\"') + '"'
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "nothing"
    elif isinstance(value, Sequence | Mapping) and not isinstance(value, str):
        text = repr(value)
    else:
        text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
