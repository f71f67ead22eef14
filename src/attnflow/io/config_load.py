"""Reading a configuration: TOML files, ``--set`` overrides, pydantic errors as one line, a hash.

Typical use::

    config = load_config("run.toml", overrides=["solver.method=euler", "model.n=128"])
    resolved_dict(config)   # JSON-ready, every default filled in (the run folder's config.json)
    config_hash(config)     # 12 hex characters, stable across processes (names sweep points)

Relative ``path`` values in a file resolve against the file's folder; those given by ``--set``
resolve against the working directory. Stored paths are absolute. A pydantic validation error is
turned into a :class:`~attnflow.io.config_errors.ConfigError` naming the key, the field's
constraint in words ("a number > 0", "one of 'euler', 'rk4'"), the value and a hint.

Every input is bounded (:mod:`attnflow.io.config_limits`): the file is a regular file of at most
16 MiB holding at least one setting, values nest at most 16 deep, integer keys hold signed 64-bit
integers, an override is at most :data:`MAX_OVERRIDE_CHARS` characters. A key that the chosen
kind does not read is refused (:mod:`attnflow.io.config_unused`).
"""

import difflib
import hashlib
import json
import tomllib
import types
from collections.abc import Iterable, Mapping
from copy import deepcopy
from os import PathLike
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from attnflow.io.config_errors import ConfigError
from attnflow.io.config_limits import (
    check_adaptive_snapshots,
    check_depth,
    check_integers,
    depth_error,
    read_config_bytes,
)
from attnflow.io.config_rules import POSITIONAL
from attnflow.io.config_schema import SECTIONS, Config
from attnflow.io.config_unused import check_unused

__all__ = [
    "apply_overrides",
    "config_from_dict",
    "config_hash",
    "load_config",
    "override_keys",
    "resolved_dict",
    "resolved_toml",
]


# --- pydantic errors -> ConfigError ---------------------------------------------------------------


def _from_validation_error(exc: ValidationError, data: Any, where: str) -> ConfigError:
    """The first error of ``exc`` as one readable line (never pydantic's own dump)."""
    error = exc.errors()[0]
    loc, cause = error["loc"], error.get("ctx", {}).get("error")
    if isinstance(cause, ConfigError):
        return cause.at(where)
    if error["type"] == "extra_forbidden":
        return _unknown_key(tuple(map(str, loc)), where)
    if len(loc) < 2:
        return _not_a_table(loc, error["input"], where)
    section, name = str(loc[0]), str(loc[1])
    field = SECTIONS[section].model_fields[name]
    constraint = str(cause) if isinstance(cause, ValueError) else _constraint(field)
    hints = [_did_you_mean(error["input"], _choices(field.annotation))]
    if any(e["type"] == "finite_number" and e["loc"][:2] == loc[:2] for e in exc.errors()):  # in any branch
        hints.append("Infinite and NaN values are not allowed.")  # of a union ('full_period' or numbers)
    return ConfigError.from_parts(
        f"{section}.{name}",
        constraint,
        _raw_value(data, section, name, error["input"]),
        hint=" ".join(h for h in hints if h),
        where=where,
    )


def _unknown_key(parts: tuple[str, ...], where: str) -> ConfigError:
    """Error for an unknown section (``parts = (section,)``) or key (``(section, key)``)."""
    *parents, name = parts
    if parents:
        allowed, noun, constraint = (
            list(SECTIONS[parents[0]].model_fields),
            "key",
            f"one of the keys of [{parents[0]}]",
        )
    else:
        allowed, noun, constraint = list(SECTIONS), "section", "one of the sections"
    close = difflib.get_close_matches(name, allowed, n=1)
    suggestion = f"did you mean {close[0]!r}? Allowed" if close else "allowed"
    hint = f"Unknown {noun}; {suggestion} {noun}s: {', '.join(allowed)}."
    return ConfigError.from_parts(".".join(parts), constraint, name, hint=hint, where=where)


def _not_a_table(loc: tuple[Any, ...], value: Any, where: str) -> ConfigError:
    if loc:
        return ConfigError.from_parts(str(loc[0]), f"a table ([{loc[0]}] section)", value, where=where)
    return ConfigError.from_parts(None, "a table of sections", value, where=where)


def _raw_value(data: Any, section: str, name: str, fallback: Any) -> Any:
    table = data.get(section) if isinstance(data, Mapping) else None
    return table.get(name, fallback) if isinstance(table, Mapping) else fallback


def _did_you_mean(word: Any, choices: list[str]) -> str:
    if not isinstance(word, str) or not choices:
        return ""
    by_lower = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return f"Did you mean {by_lower[close[0]]!r}?" if close else ""


def _choices(annotation: Any) -> list[str]:
    """Every string literal allowed anywhere in a field's type."""
    if get_origin(annotation) is Literal:
        return [value for value in get_args(annotation) if isinstance(value, str)]
    return [choice for arg in get_args(annotation) for choice in _choices(arg)]


# --- field types in words ("a number > 0", "one of 'euler', 'rk4'") -----------------------------

_SINGULAR = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURAL = {int: "integers", float: "numbers", str: "strings"}


def _constraint(field: FieldInfo) -> str:
    """The field's constraint in words: its description where that states one (it starts with
    "a " or "an ", e.g. "an integer in [0, 2**63 - 1]"), else phrased from its type; a description
    that says what the key means ("how the attention sums are computed") is not a constraint."""
    description = field.description or ""
    if description.startswith(("a ", "an ")):
        return description
    return _phrase(field.annotation, tuple(field.metadata))


def _phrase(annotation: Any, metadata: tuple[Any, ...] = ()) -> str:
    parts = _alternatives(annotation, metadata)
    if len(parts) > 1:  # "true or false" among others: true, false or 'strict'
        split = {_SINGULAR[bool]: ["true", "false"]}
        parts = [item for part in parts for item in split.get(part, [part])]
    if len(parts) == 1:
        return parts[0]
    if all(part.startswith("'") for part in parts):
        return "one of " + ", ".join(parts)
    return ", ".join(parts[:-1]) + " or " + parts[-1]


def _alternatives(annotation: Any, metadata: tuple[Any, ...]) -> list[str]:
    annotation, metadata = _unwrap(annotation, metadata)
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        return [part for arg in args for part in _alternatives(arg, ())]
    if origin is Literal:
        return [repr(value) for value in get_args(annotation)]
    if origin is tuple:
        size = "a non-empty list" if any(isinstance(m, MinLen) for m in metadata) else "a list"
        return [f"{size} of {_plural(get_args(annotation)[0])}"]
    return [_SINGULAR[annotation] + _bounds(metadata)]


def _plural(annotation: Any) -> str:
    annotation, metadata = _unwrap(annotation, ())
    origin = get_origin(annotation)
    if origin is Literal:
        values = [repr(value) for value in get_args(annotation)]
        return ", ".join(values[:-1]) + " or " + values[-1]
    if origin is tuple:
        return "lists of " + _plural(get_args(annotation)[0])
    return _PLURAL[annotation] + _bounds(metadata)


def _unwrap(annotation: Any, metadata: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    if get_origin(annotation) is Annotated:
        base, *extra = get_args(annotation)
        return base, (*metadata, *extra)
    return annotation, metadata


def _bounds(metadata: tuple[Any, ...]) -> str:
    words = [f"> {m.gt:g}" for m in metadata if isinstance(m, Gt)]
    words += [f">= {m.ge:g}" for m in metadata if isinstance(m, Ge)]
    words += [f"< {m.lt:g}" for m in metadata if isinstance(m, Lt)]
    words += [f"<= {m.le:g}" for m in metadata if isinstance(m, Le)]
    return (" " + " and ".join(words)) if words else ""


# --- loading, overrides, hashing ----------------------------------------------------------------


MAX_OVERRIDE_CHARS = 2**16  # one --set (a few generator matrices fit)


def config_from_dict(data: Mapping[str, Any], where: str = "config") -> Config:
    """Validate a plain dict (as read from TOML) into a :class:`Config`; errors as ConfigError."""
    if isinstance(data, Mapping):
        check_depth(data, where=where)
        data = _with_implied_labels(data)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise _from_validation_error(exc, data, where) from None
    check_integers(data, SECTIONS, where=where)  # after the fields' own bounds (seeds name theirs)
    check_adaptive_snapshots(config, where=where)
    return config


def _with_implied_labels(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` with ``aux.kind = "positions"`` when a kernel that is a function of positions is
    chosen (a RoPE gauge, a distance-bias factor, ...: ``config_rules.POSITIONAL``) and
    ``aux.kind`` is not written: a RoPE config need not repeat ``[aux] kind = "positions"``.
    Labels written (any ``aux.kind``) are kept as written."""
    aux = data.get("aux", {})
    if not isinstance(aux, Mapping) or "kind" in aux:
        return data
    for section, kinds in POSITIONAL.items():
        table = data.get(section)
        if isinstance(table, Mapping) and table.get("kind") in kinds:
            return {**data, "aux": {**aux, "kind": "positions"}}
    return data


def override_keys(overrides: Iterable[str]) -> set[str]:
    """The dotted keys that ``"section.key=value"`` overrides (``--set``) give."""
    return {override.partition("=")[0].strip() for override in overrides}


def load_config(path: str | PathLike[str], overrides: Iterable[str] = ()) -> Config:
    """Read a TOML config, apply ``"section.key=value"`` overrides, validate.

    Relative ``path`` values in the file resolve against the file's folder, those in overrides
    against the working directory. A key that the chosen kind does not read (``factor.path`` with
    ``factor.kind = "none"``) is refused, naming the file or ``--set``; so is a bad value, naming
    ``--set`` when it was given there.
    """
    file, where, overrides = Path(path), str(path), list(overrides)
    data = _resolve_paths(_read_toml(file), file.parent)
    data = _resolve_paths(apply_overrides(data, overrides), Path.cwd())
    overridden = override_keys(overrides)
    try:
        config = config_from_dict(data, where=where)
    except ConfigError as error:  # a value given by --set is --set's error, not the file's
        raise (error.at("--set") if error.key in overridden else error) from None
    check_unused(data, config, where=where, overridden=overridden)
    return config


def apply_overrides(
    data: Mapping[str, Any], overrides: Iterable[str], *, where: str = "--set"
) -> dict[str, Any]:
    """A copy of ``data`` with each ``"section.key=value"`` applied (``data`` is not modified).

    ``value`` is read as a TOML value when it parses as one (``128``, ``1e-3``, ``true``,
    ``[1.0, 2.0]``, ``"x"``), else taken as a bare string (``rk4``). Unknown sections or keys and
    malformed overrides raise ConfigError with ``where`` (default ``"--set"``).
    """
    result = deepcopy(dict(data))
    for override in overrides:
        section, name, value = _parse_override(override, where)
        table = result.get(section, {})
        if not isinstance(table, Mapping):
            raise ConfigError.from_parts(section, f"a table ([{section}] section)", table, where=where)
        result[section] = {**table, name: value}
    return result


def _parse_override(override: str, where: str) -> tuple[str, str, Any]:
    if len(override) > MAX_OVERRIDE_CHARS:
        limit = f"given in at most {MAX_OVERRIDE_CHARS} characters"
        raise ConfigError.from_parts(None, limit, f"{len(override)} characters", where=where)
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError.from_parts(
            key, "given as section.key=value", override, hint="For example: solver.method=euler.", where=where
        )
    parts = tuple(key.split("."))
    if len(parts) != 2 or not all(parts):
        raise ConfigError.from_parts(
            key, "a dotted key section.key", key, hint="For example: solver.method=euler.", where=where
        )
    if parts[0] not in SECTIONS:
        raise _unknown_key(parts[:1], where)
    if parts[1] not in SECTIONS[parts[0]].model_fields:
        raise _unknown_key(parts, where)
    value = _parse_value(text.strip(), key=key, where=where)
    check_depth(value, where=where, key=key, start=3)  # the file 1, the section 2, the value 3
    return parts[0], parts[1], value


def _parse_value(text: str, *, key: str, where: str) -> Any:
    """A TOML value if ``text`` is one (``1e-3``, ``true``, ``[1, 2]``), else the bare string."""
    try:
        parsed = tomllib.loads(f"value = {text}")
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:  # the parser recurses once per nested array
        raise depth_error(where=where, key=key) from None
    return parsed["value"] if list(parsed) == ["value"] else text


def _read_toml(file: Path) -> dict[str, Any]:
    """The settings of a config file: a regular file of at most 16 MiB, valid TOML, nested at most
    16 deep, with at least one section."""
    where = str(file)
    raw = read_config_bytes(file)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError.from_parts(None, "valid TOML", str(exc), where=where) from None
    except RecursionError:  # the parser recurses once per nested array or inline table
        raise depth_error(where=where) from None
    check_depth(data, where=where)
    if not data:
        raise ConfigError.from_parts(
            None,
            "at least one [section] (an empty file would run every default)",
            "an empty file" if not raw.strip() else "no settings",
            hint="For example: [model] and, on the next line, n = 64; every key has a default.",
            where=where,
        )
    return data


def _resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make every non-empty relative ``[section] path`` absolute against ``base``."""
    result = dict(data)
    for name, table in data.items():
        path = table.get("path") if isinstance(table, Mapping) else None
        if isinstance(path, str) and path:
            result[name] = {**table, "path": str((base / Path(path).expanduser()).resolve())}
    attention = data.get("attention")
    weights = attention.get("weights") if isinstance(attention, Mapping) else None
    if isinstance(weights, str) and weights.endswith(".npz"):  # a file, not a named generator
        result["attention"] = {**attention, "weights": str((base / Path(weights).expanduser()).resolve())}
    return result


def resolved_dict(config: Config) -> dict[str, Any]:
    """The config as JSON-ready data with every default filled in (lists, not tuples)."""
    return config.model_dump(mode="json")


def config_hash(config: Config) -> str:
    """First 12 hex digits of sha256 of the canonical JSON of :func:`resolved_dict`."""
    canonical = json.dumps(resolved_dict(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # a JSON string is a TOML basic string once every character outside the BMP is written as
        # itself (JSON's surrogate pairs are not TOML) and DEL escaped (TOML's only extra control)
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    return "[" + ", ".join(_toml_value(item) for item in value) + "]"


def resolved_toml(config: Config) -> str:
    """The config as a TOML file with every default filled in (what :func:`load_config` reads
    back as the same config). A key without a value (``null``: a path not set, a block size chosen
    automatically) is written as a comment."""
    lines: list[str] = []
    for section, table in resolved_dict(config).items():
        lines += ["" if lines else None, f"[{section}]"]
        for key, value in table.items():
            lines.append(f"# {key} = (unset)" if value is None else f"{key} = {_toml_value(value)}")
    return "\n".join(line for line in lines if line is not None) + "\n"
