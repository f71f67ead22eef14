"""Validated run configuration (SPEC §7.2): TOML files, ``--set`` overrides, a stable hash.

A configuration is plain, frozen data: six sections (``model``, ``aux``, ``gauge``, ``factor``,
``init``, ``solver``), each a pydantic model whose defaults are the library's defaults. Constraints
on one value (type, range, allowed choices) live on the field; rules that tie several values
together are small functions listed in ``_RULES``, run once every field is valid. Options that only
matter for one ``kind`` (``init.rho0`` for ``equiangular``, ``gauge.rates`` for
``generalized_rope``, ...) are cross-checked only when that kind is selected.

Every problem is a :class:`ConfigError` whose message is one line::

    {where}: `{key}` must be {constraint}; got {value!r}. {hint}

``where`` is the config file as given (``"config"`` for a Python dict, ``"--set"`` for a malformed
or unknown override).

Typical use::

    config = load_config("run.toml", overrides=["solver.method=euler", "model.n=128"])
    resolved_dict(config)   # JSON-ready, every default filled in (the run folder's config.json)
    config_hash(config)     # 12 hex characters, stable across processes (names sweep points)

Relative ``path`` values in a file resolve against the file's folder; those given by ``--set``
resolve against the working directory. Stored paths are absolute.
"""

import difflib
import hashlib
import json
import tomllib
import types
from collections.abc import Callable, Iterable, Mapping
from copy import deepcopy
from os import PathLike
from pathlib import Path
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

import numpy as np
from annotated_types import Ge, Gt, MinLen
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

__all__ = [
    "AuxConfig",
    "Config",
    "ConfigError",
    "FactorConfig",
    "GaugeConfig",
    "InitConfig",
    "ModelConfig",
    "SolverConfig",
    "apply_overrides",
    "config_from_dict",
    "config_hash",
    "load_config",
    "resolved_dict",
]

FIXED_STEP_METHODS = ("euler", "rk4", "geodesic_rk4")
MULTIPLE_RTOL = 1e-9  # relative tolerance for "save_every is a whole multiple of dt"
SKEW_ATOL = 1e-12  # entrywise tolerance on |G + G^T| for generalized_rope generators

PositiveFloat = Annotated[float, Gt(0)]
NonNegativeFloat = Annotated[float, Ge(0)]
Seed = Annotated[int, Ge(0)]
FloatList = Annotated[tuple[float, ...], MinLen(1)]
Matrix = tuple[tuple[float, ...], ...]
FilePath = Annotated[str | None, Field(description="a file path (a non-empty string)", min_length=1)]


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


def _render(where: str, key: str | None, constraint: str, value: Any, hint: str) -> str:
    subject = f"`{key}`" if key else "the configuration"
    message = f"{where}: {subject} must be {constraint}; got {value!r}."
    if hint:
        message = f"{message} {hint}"
    return " ".join(message.splitlines())


# --- the sections -------------------------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ModelConfig(_Frozen):
    """The kernel profile and the dynamics (SPEC §1.1-1.2)."""

    n: int = Field(64, ge=2)
    d: int = Field(3, ge=2)
    beta: PositiveFloat = 1.0
    time_scale: Literal["plain", "rescaled"] = "plain"
    profile: Literal["exp", "linear"] = "exp"
    normalization: Literal["usa", "sa"] = "usa"
    causal: bool = False
    value: Literal["gradient", "logits_only"] = "gradient"
    noise: NonNegativeFloat = 0.0


class AuxConfig(_Frozen):
    """The frozen auxiliary labels xi (positions, prompt ids, or from a file)."""

    kind: Literal["none", "positions", "prompts", "file"] = "none"
    spacing: Literal["index", "unit", "midpoint"] | PositiveFloat = "index"
    n_prompts: int = Field(4, ge=1)
    assignment: Literal["cyclic", "random"] = "cyclic"
    seed: Seed = 0
    path: FilePath = None


class GaugeConfig(_Frozen):
    """The gauge Q(xi) in O(d) (SPEC §1.1)."""

    kind: Literal["none", "rope", "generalized_rope", "prompt", "file"] = "none"
    frequencies: Literal["roformer", "full_period"] | FloatList = "full_period"
    base: PositiveFloat = 10000.0
    axes: Annotated[tuple[Literal["x", "y", "z"], ...], MinLen(1)] = ("z", "x")
    generators: Annotated[tuple[Matrix, ...], MinLen(1)] | None = Field(
        None, description="a list of square skew-symmetric matrices (each a list of rows)"
    )
    rates: FloatList = (1.0, 3.0)
    omega: Literal["full_period"] | float = "full_period"
    seed: Seed = 100
    path: FilePath = None

    @field_validator("generators")
    @classmethod
    def _square_and_skew(cls, generators: tuple[Matrix, ...] | None) -> tuple[Matrix, ...] | None:
        if generators is None:
            return None
        size = len(generators[0])
        if any(len(g) != size or any(len(row) != size for row in g) for g in generators):
            raise ValueError("a list of square matrices, all of one size d x d")
        for k, g in enumerate(generators):
            asymmetry = float(np.max(np.abs(np.asarray(g) + np.asarray(g).T)))
            if asymmetry > SKEW_ATOL:
                raise ValueError(
                    f"skew-symmetric matrices, |G + G^T| <= {SKEW_ATOL:g} entrywise "
                    f"(generator {k} is off by {asymmetry:.3g})"
                )
        return generators


class FactorConfig(_Frozen):
    """The factor w(xi, zeta) (SPEC §1.1)."""

    kind: Literal["none", "distance_bias", "toeplitz_cos", "file"] = "none"
    slope: NonNegativeFloat = 1.0
    omega: float = 2 * np.pi
    path: FilePath = None


class InitConfig(_Frozen):
    """Initial data on the sphere (SPEC §5)."""

    kind: Literal["uniform", "cap", "equiangular", "file"] = "uniform"
    seed: Seed = 0
    center: FloatList = (0.0, 0.0, 1.0)
    sigma: PositiveFloat = 0.2
    rho0: float = 0.1
    path: FilePath = None

    @field_validator("center")
    @classmethod
    def _nonzero(cls, center: tuple[float, ...]) -> tuple[float, ...]:
        if not any(center):
            raise ValueError("a nonzero list of numbers (a direction)")
        return center


class SolverConfig(_Frozen):
    """The integrator and the time grid (SPEC §5). ``block_size = None`` chooses automatically."""

    method: Literal["euler", "rk4", "geodesic_rk4", "adaptive"] = "rk4"
    dt: PositiveFloat = 0.01
    t_end: PositiveFloat = 20.0
    save_every: PositiveFloat = 0.1
    rtol: PositiveFloat = 1e-8
    atol: PositiveFloat = 1e-10
    dtype: Literal["float64", "float32"] = "float64"
    block_size: Annotated[int, Ge(1)] | None = None


class Config(_Frozen):
    """A whole run configuration: the six sections of SPEC §7.2 plus cross-section rules."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    aux: AuxConfig = Field(default_factory=AuxConfig)
    gauge: GaugeConfig = Field(default_factory=GaugeConfig)
    factor: FactorConfig = Field(default_factory=FactorConfig)
    init: InitConfig = Field(default_factory=InitConfig)
    solver: SolverConfig = Field(default_factory=SolverConfig)

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        for rule in _RULES:
            rule(self)
        return self


_SECTIONS: dict[str, type[BaseModel]] = {
    name: field.annotation for name, field in Config.model_fields.items()
}


# --- rules across fields (each raises ConfigError naming the key to change) ---------------------


def _file_kinds_have_paths(config: Config) -> None:
    for name in ("aux", "gauge", "factor", "init"):
        section = getattr(config, name)
        if section.kind == "file" and section.path is None:
            raise ConfigError.from_parts(
                f"{name}.path",
                f"a file path when `{name}.kind` = 'file'",
                None,
                hint="Relative paths resolve against the config file's folder.",
            )


def _cap_center_has_d_entries(config: Config) -> None:
    d, init = config.model.d, config.init
    if init.kind == "cap" and len(init.center) != d:
        raise ConfigError.from_parts(
            "init.center",
            f"a list of `model.d` = {d} numbers when `init.kind` = 'cap'",
            list(init.center),
        )


def _equiangular_is_realisable(config: Config) -> None:
    n, d, init = config.model.n, config.model.d, config.init
    if init.kind != "equiangular":
        return
    lower = -1 / (n - 1)
    if not lower < init.rho0 < 1:
        raise ConfigError.from_parts(
            "init.rho0",
            f"in (-1/(n-1), 1) = ({lower:.6g}, 1) for `model.n` = {n}",
            init.rho0,
            hint="rho0 is the common pairwise cosine; -1/(n-1) is the most spread n unit vectors "
            "allow, 1 puts every token at one point.",
        )
    if d < n:
        raise ConfigError.from_parts(
            "init.kind",
            f"'uniform', 'cap' or 'file' when `model.d` = {d} < `model.n` = {n}",
            init.kind,
            hint=f"n unit vectors with pairwise cosine rho0 span n dimensions, so equiangular data "
            f"needs d >= n; use init.kind = 'uniform', or set model.d >= {n}.",
        )


def _whole_multiple(total: float, step: float) -> bool:
    k = round(total / step)
    return k >= 1 and abs(total - k * step) <= MULTIPLE_RTOL * total


def _nearest_multiple(total: float, step: float) -> str:
    return f"{max(1, round(total / step)) * step:.12g}"


def _time_grid_is_whole(config: Config) -> None:
    solver = config.solver
    if solver.method in FIXED_STEP_METHODS and not _whole_multiple(solver.save_every, solver.dt):
        raise ConfigError.from_parts(
            "solver.save_every",
            f"a whole multiple of `solver.dt` = {solver.dt!r} for method {solver.method!r}",
            solver.save_every,
            hint=f"Try save_every = {_nearest_multiple(solver.save_every, solver.dt)}, or change solver.dt.",
        )
    if not _whole_multiple(solver.t_end, solver.save_every):
        raise ConfigError.from_parts(
            "solver.t_end",
            f"a whole multiple of `solver.save_every` = {solver.save_every!r}",
            solver.t_end,
            hint=f"Try t_end = {_nearest_multiple(solver.t_end, solver.save_every)}.",
        )


_POSITIONAL = {"gauge": ("rope", "generalized_rope"), "factor": ("distance_bias", "toeplitz_cos")}


def _labels_fit_the_kernel(config: Config) -> None:
    aux = config.aux
    if config.gauge.kind == "prompt" and aux.kind != "prompts":
        raise ConfigError.from_parts(
            "aux.kind",
            "'prompts' when `gauge.kind` = 'prompt'",
            aux.kind,
            hint="A prompt gauge gives each prompt id its own rotation; set aux.kind = 'prompts'.",
        )
    for name, positional in _POSITIONAL.items():
        kind = getattr(config, name).kind
        if kind in positional and aux.kind not in ("positions", "file"):
            raise ConfigError.from_parts(
                "aux.kind",
                f"'positions' or 'file' when `{name}.kind` = {kind!r}",
                aux.kind,
                hint=f"{name} {kind!r} is a function of positions xi; set aux.kind = 'positions'.",
            )


def _softmax_has_nonnegative_factor(config: Config) -> None:
    if config.model.normalization == "sa" and config.factor.kind == "toeplitz_cos":
        raise ConfigError.from_parts(
            "factor.kind",
            "a non-negative factor ('none', 'distance_bias', or 'file' with w >= 0) "
            "when `model.normalization` = 'sa'",
            config.factor.kind,
            hint="Softmax divides row i by sum_k w_ik exp(beta s_ik), which can vanish or turn "
            "negative when w = cos(omega (xi - zeta)) changes sign; use model.normalization = 'usa'.",
        )


def _rope_frequencies_fit(config: Config) -> None:
    gauge, d = config.gauge, config.model.d
    explicit = isinstance(gauge.frequencies, tuple)
    if gauge.kind == "rope" and explicit and len(gauge.frequencies) > d // 2:
        raise ConfigError.from_parts(
            "gauge.frequencies",
            f"at most `model.d` // 2 = {_numbers(d // 2)} (one per coordinate pair)",
            list(gauge.frequencies),
            hint="Drop the extra frequencies or raise model.d.",
        )


def _generators_fit(config: Config) -> None:
    gauge, d = config.gauge, config.model.d
    if gauge.kind != "generalized_rope":
        return
    if gauge.generators is None:
        if d != 3:
            raise ConfigError.from_parts(
                "gauge.axes",
                f"replaced by `gauge.generators` ({d} x {d} skew-symmetric matrices) when `model.d` = {d}",
                list(gauge.axes),
                hint="Axis names 'x', 'y', 'z' name rotations of R^3 only.",
            )
        count, per = len(gauge.axes), "axis in `gauge.axes`"
    else:
        size = len(gauge.generators[0])
        if size != d:
            raise ConfigError.from_parts(
                "gauge.generators",
                f"{d} x {d} matrices to match `model.d` = {d}",
                _as_lists(gauge.generators),
                hint=f"The generators given are {size} x {size}.",
            )
        count, per = len(gauge.generators), "matrix in `gauge.generators`"
    if len(gauge.rates) != count:
        raise ConfigError.from_parts(
            "gauge.rates", f"a list of {_numbers(count)}, one per {per}", list(gauge.rates)
        )


_RULES: tuple[Callable[[Config], None], ...] = (
    _file_kinds_have_paths,
    _cap_center_has_d_entries,
    _equiangular_is_realisable,
    _time_grid_is_whole,
    _labels_fit_the_kernel,
    _softmax_has_nonnegative_factor,
    _rope_frequencies_fit,
    _generators_fit,
)


def _numbers(count: int) -> str:
    return f"{count} number" if count == 1 else f"{count} numbers"


def _as_lists(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_as_lists(item) for item in value]
    return value


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
    field = _SECTIONS[section].model_fields[name]
    constraint = str(cause) if isinstance(cause, ValueError) else _constraint(field)
    hints = [_did_you_mean(error["input"], _choices(field.annotation))]
    if error["type"] == "finite_number":
        hints.append("Infinite and NaN values are not allowed.")
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
            list(_SECTIONS[parents[0]].model_fields),
            "key",
            f"one of the keys of [{parents[0]}]",
        )
    else:
        allowed, noun, constraint = list(_SECTIONS), "section", "one of the sections"
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
    return field.description or _phrase(field.annotation, tuple(field.metadata))


def _phrase(annotation: Any, metadata: tuple[Any, ...] = ()) -> str:
    parts = _alternatives(annotation, metadata)
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
    words = [f" > {m.gt:g}" for m in metadata if isinstance(m, Gt)]
    words += [f" >= {m.ge:g}" for m in metadata if isinstance(m, Ge)]
    return "".join(words)


# --- loading, overrides, hashing ----------------------------------------------------------------


def config_from_dict(data: Mapping[str, Any], where: str = "config") -> Config:
    """Validate a plain dict (as read from TOML) into a :class:`Config`; errors as ConfigError."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise _from_validation_error(exc, data, where) from None


def load_config(path: str | PathLike[str], overrides: Iterable[str] = ()) -> Config:
    """Read a TOML config, apply ``"section.key=value"`` overrides, validate.

    Relative ``path`` values in the file resolve against the file's folder, those in overrides
    against the working directory.
    """
    file, where = Path(path), str(path)
    data = _resolve_paths(_read_toml(file), file.parent)
    data = _resolve_paths(apply_overrides(data, overrides), Path.cwd())
    return config_from_dict(data, where=where)


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
    if parts[0] not in _SECTIONS:
        raise _unknown_key(parts[:1], where)
    if parts[1] not in _SECTIONS[parts[0]].model_fields:
        raise _unknown_key(parts, where)
    return parts[0], parts[1], _parse_value(text.strip())


def _parse_value(text: str) -> Any:
    """A TOML value if ``text`` is one (``1e-3``, ``true``, ``[1, 2]``), else the bare string."""
    try:
        parsed = tomllib.loads(f"value = {text}")
    except tomllib.TOMLDecodeError:
        return text
    return parsed["value"] if list(parsed) == ["value"] else text


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError.from_parts(
            None, "a readable TOML file", exc.strerror or str(exc), where=str(file)
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError.from_parts(None, "valid TOML", str(exc), where=str(file)) from None


def _resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make every non-empty relative ``[section] path`` absolute against ``base``."""
    result = dict(data)
    for name, table in data.items():
        path = table.get("path") if isinstance(table, Mapping) else None
        if isinstance(path, str) and path:
            result[name] = {**table, "path": str((base / Path(path).expanduser()).resolve())}
    return result


def resolved_dict(config: Config) -> dict[str, Any]:
    """The config as JSON-ready data with every default filled in (lists, not tuples)."""
    return config.model_dump(mode="json")


def config_hash(config: Config) -> str:
    """First 12 hex digits of sha256 of the canonical JSON of :func:`resolved_dict`."""
    canonical = json.dumps(resolved_dict(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]
