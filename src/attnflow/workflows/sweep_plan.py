"""Sweep grids: parse ``--grid`` options and validate every point (pure: nothing runs or is written).

A sweep is a base config and a grid: one or more axes ``section.key = v1, v2, ...``; the points
are the Cartesian product (the first axis varies slowest)::

    axes = [parse_grid("model.beta=1,2,4"), parse_grid("init.seed=0,1")]
    plan = plan_sweep(load_config("base.toml"), axes)   # 6 validated points, or a ConfigError

Grid syntax (``--grid``): ``section.key=v1,v2,...``. The values are split on the commas that lie
outside brackets and quotes, and each one is read like a ``--set`` value (a TOML value when it
parses as one, else a bare string) and validated with the field's type, so lists are written in
brackets: ``--grid 'gauge.frequencies=[1.0],[0.5,0.25]'`` is two points. A point is known by its
config hash (:func:`attnflow.io.config.config_hash`), which names its run folder.

A point is the config that :func:`~attnflow.io.config.load_config` would make of the base's
written keys (the file's and ``--set``'s: :func:`written_keys`) with the point's values given by
``--set``: a key the base leaves out stays left out, so what it implies is implied again at each
point (``--grid gauge.kind=none,rope`` over a base without ``aux.kind`` gives the RoPE point
``aux.kind = "positions"``; an implied ``aux.kind`` in the base itself counts as written, see
:func:`written_keys`), and a key the point's chosen kind does not read
(:mod:`attnflow.io.config_unused`) is handled point by point, the point taken as a whole:

- a **grid key** that its point's choices do not read is refused, naming ``--grid`` and the
  point (``--grid solver.atol=1e-6,1e-7`` over ``rk4``; ``--grid solver.method=rk4,adaptive
  --grid solver.atol=1e-6,1e-7`` too: its rk4 points would differ in a key that they do not
  read; run the adaptive points as a sweep of their own);
- a **base key** that some points read and others do not is left out of the points that do not
  read it (``solver.atol`` in an adaptive base with ``--grid solver.method=rk4,adaptive``: the rk4
  point is the rk4 config without ``atol``, the one ``attnflow run`` accepts, and its hash does not
  change with a setting it does not read; :attr:`SweepPoint.left_out` names such keys). A base
  key that no point reads is refused, as ``--set`` of the grid's choices would be.

The value of each axis is first checked alone (its type and range, the rules across keys with
the base), without the rule about unread keys: another axis may change the kind that reads it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

from attnflow.io.config import (
    Config,
    ConfigError,
    apply_overrides,
    config_from_dict,
    config_hash,
    resolved_dict,
)
from attnflow.io.config_unused import check_unused

__all__ = [
    "GridAxis",
    "SweepPlan",
    "SweepPoint",
    "parse_grid",
    "plan_sweep",
    "split_values",
    "written_keys",
]

GRID = "--grid"


@dataclasses.dataclass(frozen=True)
class GridAxis:
    """One axis of a grid: a dotted config key and its values (Python values, as TOML reads them)."""

    key: str
    values: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One point: its validated config, the config hash (its folder name), its grid values and
    the keys of the base that it leaves out (its choices do not read them; see the module)."""

    hash: str
    values: dict[str, Any]
    config: Config
    left_out: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """A validated sweep: the base config, the axes and the points, in grid order."""

    base: Config
    axes: tuple[GridAxis, ...]
    points: tuple[SweepPoint, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(axis.key for axis in self.axes)


def _grid_error(key: str | None, constraint: str, value: Any, hint: str = "") -> ConfigError:
    return ConfigError.from_parts(key, constraint, value, hint=hint, where=GRID)


_FORMAT = "given as section.key=v1,v2,... (comma-separated values)"
_EXAMPLE = "For example: --grid model.beta=0.5,1,2 or --grid 'gauge.frequencies=[1.0],[0.5,0.25]'."
_CLOSING = {"[": "]", "{": "}"}


def split_values(text: str) -> list[str]:
    """Split ``text`` on the commas outside brackets (``[]``, ``{}``) and quotes; strip each item.

    ``"1,2"`` → ``["1", "2"]``; ``"[1.0],[0.5, 0.25]"`` → ``["[1.0]", "[0.5, 0.25]"]``;
    ``'"a,b",c'`` → ``['"a,b"', "c"]``. Unbalanced brackets or quotes raise a ConfigError.
    """
    items, current, stack, quote = [], [], [], None
    for char in text:
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in _CLOSING:
            stack.append(_CLOSING[char])
        elif char in "]}":
            if not stack or stack.pop() != char:
                raise _grid_error(None, "a list of values with balanced brackets", text, hint=_EXAMPLE)
        elif char == "," and not stack:
            items.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if stack or quote is not None:
        raise _grid_error(None, "a list of values with balanced brackets and quotes", text, hint=_EXAMPLE)
    items.append("".join(current).strip())
    return items


def parse_grid(spec: str) -> GridAxis:
    """Parse one ``--grid`` option, ``section.key=v1,v2,...``, into a :class:`GridAxis`.

    Each value is read like a ``--set`` value (TOML, else a bare string). The key must exist; the
    values are checked against the field's type by :func:`plan_sweep`. Errors are ConfigErrors
    whose message starts with ``--grid:`` and names the key, the rule and the value.
    """
    key, sep, text = spec.partition("=")
    key = key.strip()
    if not sep or not key:
        raise _grid_error(key or None, _FORMAT, spec, hint=_EXAMPLE)
    if not text.strip():
        raise _grid_error(key, "a non-empty, comma-separated list of values", text, hint=_EXAMPLE)
    texts = split_values(text)
    if any(not item for item in texts):
        raise _grid_error(
            key, "a comma-separated list of values with no empty entry", text, hint="Remove the extra comma."
        )
    values = []
    for item in texts:
        parsed = apply_overrides({}, [f"{key}={item}"], where=GRID)  # checks the key exists
        section, name = key.split(".")
        values.append(parsed[section][name])
    for i, value in enumerate(values):
        if any(_same(value, other) for other in values[:i]):
            raise _grid_error(key, "a list of distinct values", text, hint=f"{texts[i]!r} is repeated.")
    return GridAxis(key=key, values=tuple(values))


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (_is_number(a) and _is_number(b) and a == b)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _with_values(base: Mapping[str, Any], assignment: Mapping[str, Any]) -> dict[str, Any]:
    data = deepcopy(dict(base))
    for key, value in assignment.items():
        section, name = key.split(".")
        if name == "path" and isinstance(value, str) and value:
            value = str((Path.cwd() / Path(value).expanduser()).resolve())  # like --set
        data[section] = {**data.get(section, {}), name: value}
    return data


def _describe(assignment: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={json.dumps(value)}" for key, value in assignment.items())


def written_keys(base: Config) -> dict[str, dict[str, Any]]:
    """The keys that ``base`` was given, as JSON values: each section's fields set (pydantic's
    ``model_fields_set``: for a config from :func:`~attnflow.io.config.load_config`, the file's
    keys and ``--set``'s). A key left out is not here, so that what it implies is implied again
    when a grid changes the base. One exception, which the config cannot tell apart: an
    ``aux.kind = "positions"`` that load_config implied (a RoPE gauge or a positional factor
    without ``aux.kind``) is here as if written, so a point that turns that kernel off keeps the
    positions."""
    data: dict[str, dict[str, Any]] = {}
    for section in type(base).model_fields:
        settings = getattr(base, section)
        if section not in base.model_fields_set or settings is None:
            continue
        dumped = settings.model_dump(mode="json")  # a key at its default may be left out of it
        given = settings.model_fields_set
        data[section] = {
            name: dumped[name] for name in type(settings).model_fields if name in given and name in dumped
        }
    return data


def _at_point(error: ConfigError, assignment: Mapping[str, Any], sentence: str = "") -> ConfigError:
    """``error`` as ``--grid``'s, ending with ``sentence`` (default: the grid point it names),
    unchanged when it is about the only key of the point (its message names the key and value)."""
    if len(assignment) == 1 and error.key in assignment and not sentence:
        return error
    sentence = sentence or f"At grid point {_describe(assignment)}."
    if error.constraint is None:
        return ConfigError(f"{error} {sentence}")
    return _grid_error(error.key, error.constraint, error.value, hint=f"{error.hint} {sentence}".strip())


def _validate(data: Mapping[str, Any], assignment: Mapping[str, Any]) -> Config:
    try:
        return config_from_dict(data, where=GRID)
    except ConfigError as error:
        raise _at_point(error, assignment) from None


def _point(written: Mapping[str, Any], assignment: Mapping[str, Any]) -> tuple[Config, list[ConfigError]]:
    """The config of the grid point ``assignment`` over the base's ``written`` keys, and the
    refusals of the base keys it leaves out (its choices do not read them); a grid key that its
    choices do not read is refused (ConfigError)."""
    data = _with_values(written, assignment)
    left_out: list[ConfigError] = []
    while True:
        config = _validate(data, assignment)
        try:
            check_unused(data, config, where=GRID, overridden=set(assignment), override_where=GRID)
        except ConfigError as error:
            if error.key is None or error.key in assignment or "." not in error.key:
                raise _at_point(error, assignment) from None
            section, name = error.key.split(".")
            data[section] = {key: value for key, value in data[section].items() if key != name}
            left_out.append(error)
            continue
        return config, left_out


MAX_POINTS = 1000  # above, a grid is planned only when confirmed (``--yes``): planning costs ~ms a point


def plan_sweep(base: Config, axes: Sequence[GridAxis], *, max_points: int | None = MAX_POINTS) -> SweepPlan:
    """Validate every point of the grid ``axes`` over ``base`` (pure: nothing runs or is written).

    Each value is first checked alone (so an error names the axis and the value), then every
    combination (rules that tie keys together, and the keys that the point's choices do not read:
    a grid key is refused there, a base key left out of that point, or refused if no point reads
    it; see the module). A point is built from the base's :func:`written_keys`, as ``load_config``
    builds the base with ``--set`` of the point's values. A grid of more than ``max_points`` points
    is refused before any is validated (``None``: no limit; the command line's ``--yes``).
    Raises ConfigError (``--grid: ...``).
    """
    if base.density is not None:
        raise ConfigError.from_parts(
            "density",
            "absent in a sweep (its points are particle runs; `attnflow run` solves a [density] config)",
            "a [density] section",
        )
    axes = tuple(axes)
    size = math.prod(len(axis.values) for axis in axes)
    if axes and max_points is not None and size > max_points:
        shape = " x ".join(str(len(axis.values)) for axis in axes)
        raise _grid_error(
            None,
            f"a grid of at most {max_points} points",
            f"{size} points ({shape})",
            hint="Pass --yes to run it.",
        )
    if not axes:
        raise _grid_error(None, "at least one axis (--grid section.key=v1,v2,...)", [], hint=_EXAMPLE)
    seen: set[str] = set()
    for axis in axes:
        if axis.key in seen:
            raise _grid_error(axis.key, "given in one --grid option only", axis.key, hint="Merge the values.")
        seen.add(axis.key)
        if not axis.values:
            raise _grid_error(axis.key, "a non-empty list of values", [], hint=_EXAMPLE)
    written = written_keys(base)
    for axis in axes:  # each value alone: an error names its axis and value
        for value in axis.values:
            _validate(_with_values(written, {axis.key: value}), {axis.key: value})
    points, hashes, unread = [], {}, None
    for combination in itertools.product(*(axis.values for axis in axes)):
        assignment = dict(zip((axis.key for axis in axes), combination, strict=True))
        config, left_out = _point(written, assignment)
        keys = {error.key: (error, assignment) for error in left_out}
        unread = keys if unread is None else {key: unread[key] for key in unread if key in keys}
        digest = config_hash(config)
        if digest in hashes:
            raise _grid_error(
                None,
                "a grid of distinct configurations",
                _describe(assignment),
                hint=f"It resolves to the same config as {_describe(hashes[digest])} (hash {digest}).",
            )
        hashes[digest] = assignment
        resolved = resolved_dict(config)
        values = {key: _resolved_value(config, resolved, key) for key in assignment}
        points.append(SweepPoint(hash=digest, values=values, config=config, left_out=tuple(keys)))
    if unread:  # a base key that no point reads: refused, as --set of a point's choices would be
        error, assignment = next(iter(unread.values()))
        unread_sentence = (
            "The base config (its file or --set) sets it and no point of the grid reads it "
            f"(the first: {_describe(assignment)})."
        )
        raise _at_point(error, assignment, unread_sentence)
    return SweepPlan(base=base, axes=axes, points=tuple(points))


def _resolved_value(config, resolved: dict, key: str):
    """The value of ``key`` as the resolved config writes it; a key left out of it at its default
    (``model.layer_norm = "post"``, ``gauge.scaling``) read from the config itself."""
    section, name = key.split(".")
    if name in resolved.get(section, {}):
        return resolved[section][name]
    return getattr(getattr(config, section), name)
