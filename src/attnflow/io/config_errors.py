"""The configuration's error: one line naming where, the key, the rule and the value.

Every problem with a configuration is a :class:`ConfigError` whose message is one line::

    {where}: `{key}` must be {constraint}; got {value!r}. {hint}

``where`` is the config file as given (``"config"`` for a Python dict, ``"--set"`` for a malformed
or unknown override). A value whose ``repr`` is longer than :data:`MAX_SHOWN` characters is cut.
"""

from typing import Any

__all__ = ["ConfigError", "as_lists", "either", "numbers"]


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
    """``value`` as the config writes it: TOML's booleans, no value for a key left unset."""
    if value is None or isinstance(value, bool):
        return {None: "no value", True: "true", False: "false"}[value]
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


def numbers(count: int) -> str:
    """``"1 number"``, ``"3 numbers"``: a length in a message."""
    return f"{count} number" if count == 1 else f"{count} numbers"


def either(choices) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``: allowed values in a message."""
    quoted = [repr(c) for c in choices]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def as_lists(value: Any) -> Any:
    """Nested tuples as lists: a value shown as it was written in TOML."""
    if isinstance(value, tuple | list):
        return [as_lists(item) for item in value]
    return value
