"""The configuration's error: one line naming where, the key, the rule and the value.

Every problem with a configuration is a :class:`ConfigError` whose message is one line::

    {where}: `{key}` must be {constraint}; got {value!r}. {hint}

``where`` is the config file as given (``"config"`` for a Python dict, ``"--set"`` for a malformed
or unknown override). A value whose ``repr`` is longer than :data:`MAX_SHOWN` characters is cut.
"""

from typing import Any

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """Invalid configuration, reported as one line naming where, the key, the rule and the value.

    ``ConfigError(message)`` takes a finished line; :meth:`from_parts` builds it from the
    template and keeps the parts as attributes ``where``, ``key`` (dotted, e.g.
    ``"solver.method"``; ``None`` for the whole file), ``constraint``, ``value`` and ``hint``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.where: str | None = None
        self.key: str | None = None
        self.constraint: str | None = None
        self.value: Any = None
        self.hint = ""

    @classmethod
    def from_parts(
        cls, key: str | None, constraint: str, value: Any, *, hint: str = "", where: str = "config"
    ) -> "ConfigError":
        """``{where}: `{key}` must be {constraint}; got {value!r}. {hint}`` as one line."""
        error = cls(_render(where, key, constraint, value, hint))
        error.where, error.key, error.value, error.hint = where, key, value, hint
        error.constraint = constraint
        return error

    def at(self, where: str) -> "ConfigError":
        """The same error, reported for another place (a file instead of ``"config"``)."""
        if self.constraint is None:
            return self
        return ConfigError.from_parts(self.key, self.constraint, self.value, hint=self.hint, where=where)


MAX_SHOWN = 200  # characters of a value's repr in a message; a longer one is cut (a 600-digit integer)


def _shown(value: Any) -> str:
    text = repr(value)
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[: MAX_SHOWN - 40]}... ({len(text)} characters)"


def _render(where: str, key: str | None, constraint: str, value: Any, hint: str) -> str:
    subject = f"`{key}`" if key else "the configuration"
    message = f"{where}: {subject} must be {constraint}; got {_shown(value)}."
    if hint:
        message = f"{message} {hint}"
    return " ".join(message.splitlines())
