"""The one exception hierarchy of gridpilot.

Every message is written for the person who reads it; the cause for debugging travels in
``__cause__`` (``raise ... from exc``). ``retryable`` says whether trying again can help.
"""

from __future__ import annotations


class GridpilotError(Exception):
    """Base of every error gridpilot raises on purpose."""

    retryable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigurationError(GridpilotError):
    """The settings file, an environment variable or a configuration value is wrong."""


class InvalidInputError(GridpilotError):
    """Input from a user, a pilot or an operator is malformed; the message says what and where."""


class InvalidResourceError(InvalidInputError):
    """A pilot's resource description cannot be used for matching."""


class InvalidRequirementsError(InvalidInputError):
    """A job's RFC 7 requirements cannot be canonicalised into a SubmitPool."""


class NotFoundError(GridpilotError):
    """A job, task queue, pilot or SubmitPool that was asked for does not exist."""


class IllegalTransitionError(GridpilotError):
    """A job status change that the state machine does not allow."""


class ConflictError(GridpilotError):
    """The stored state changed under the caller (another process got there first)."""

    retryable = True


class DatabaseUnavailableError(GridpilotError):
    """The database did not answer in time (connect, pool or statement timeout) or cannot be
    reached; nothing was committed, and the same work may succeed a little later."""


class CatalogueUnavailableError(DatabaseUnavailableError):
    """The replica catalogue (a Rucio server) did not answer or refused gridpilot's call;
    nothing was committed, and the same work may succeed a little later."""


class ForbiddenError(GridpilotError):
    """The caller may not act on this object (a pilot reporting on a job it was not given)."""
