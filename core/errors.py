"""The error tree. Third-party errors are wrapped at the boundary into these.

Every error names the thing that failed and says what to do; the CLI prints `message` and `hint`
without a traceback.
"""

from __future__ import annotations


class ArgusError(Exception):
    """Base of every error Argus raises on purpose."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(ArgusError):
    """Settings or a config file is invalid."""


class RuleError(ConfigError):
    """A detection rule file is invalid; the message names the file and line."""


class SourceUnavailable(ArgusError):
    """An outside system (Ray, Prometheus, a database, an exporter) could not be reached."""

    def __init__(self, thing: str, address: str, cause: str, *, hint: str | None = None) -> None:
        super().__init__(f"cannot reach {thing} at {address}: {cause}", hint=hint)
        self.thing = thing
        self.address = address


class MissingBinary(ArgusError):
    """A program Argus needs to start (prometheus, sshd, ray) is not installed."""

    def __init__(self, binary: str, *, hint: str | None = None) -> None:
        super().__init__(f"required program '{binary}' was not found on PATH", hint=hint)
        self.binary = binary


class StoreError(ArgusError):
    """The incident store failed."""


class NotFound(ArgusError):
    """A named object (incident, action, job, node) does not exist."""


class InputError(ArgusError):
    """Input from a user or an outside system is malformed."""


class NotAllowed(InputError):
    """The request is well formed but this Argus's configuration does not allow it (a code path outside the code
    roots an admin set, an SSH key outside the key folders): an admin, not the request's form, must change."""


class Conflict(InputError):
    """The request is well formed but the object's current state forbids it (a job still running, a node
    in the wrong state, another change that came first)."""


class NotConfigured(ConfigError):
    """This Argus runs without a setting a request needs (a GCS address for node steps): the service, not
    the request, must change."""
