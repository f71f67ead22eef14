"""The paper's experiments (E0–E9) as data: one TOML file per experiment, validated here.

A file holds metadata, the run configuration and the expectations that ``attnflow reproduce``
checks; nothing about an experiment lives in code branches. Layout of ``E1.toml``::

    id = "E1"
    title = "RoPE: latitude circle"
    setting = "RoPE, xi_i = i, ..."        # one line for the report
    shape = "latitude circle"              # what the final state looks like (figure titles)
    kind = "simulate"                      # or "realize_orbit" / "realize_sphere" (realisations)
    sizes = [64, 128, 256]
    seeds = [0, 1, ..., 9]
    report_times = [0.0, 20.0]             # snapshots measured (and drawn) besides the final one
    series_metrics = []                    # per-snapshot series to keep, e.g. ["gauge_n_clusters"]
    report_metrics = ["u_star_3"]          # shown in the report besides the expectations' metrics

    [quick]                                # what --quick runs (CI)
    sizes = [64]
    seeds = [0, 1, 2]
    overrides = []                         # config overrides ("section.key=value") under --quick
    realize = {}                           # realisation parameters replaced under --quick

    [config.gauge]                         # run config sections (kind = "simulate"); model.n and
    kind = "rope"                          # init.seed are set per size and seed

    [realize]                              # parameters of the realisation (kind = "realize_*")

    [[variants]]                           # optional; each variant is run at every size
    name = "a"
    label = "(a) full_period"
    shape = ""                             # optional, replaces the experiment's shape
    overrides = ["gauge.frequencies=\"full_period\""]

    [[expect]]                             # checked by evaluate() below
    text = "orbit_residual <= 1e-4 at tau = 20"
    metric = "orbit_residual"              # a measured value (attnflow.io.outcomes.METRICS)
    op = "<="                              # "<", "<=", ">", ">=", "==", "~=" (|a - b| <= tol), "in"
    bound = 1e-4                           # a number, a boolean, [lo, hi] for "in";
    # bound_metric = "circle_deficit"      # ... or another measured value of the same seed
    # tol = 1e-4                           # added to the bound ("<=", "<"), or the "~=" tolerance
    scope = "every seed"                   # or an aggregate over seeds: "median", "min", "max", "count",
                                           # "two-sample" (below)
    # min_count = 2                        # "count": how many seeds must satisfy the comparison
    # at = 20.0                            # a report time (default: the final snapshot)
    # sizes = [64]; variants = ["a"]       # restrict where it applies
    # across = "some size"                 # pass if it holds for at least one size

A value whose law has no closed form is compared with a *reference sample*: the same value of
the real simulator on seeds no experiment runs, stored in an experiment file (and made by
``python -m attnflow.workflows.reproduce_reference``)::

    [reference.collapse_time]              # E0.toml: the sample "E0.collapse_time"
    metric = "collapse_time"
    seeds = [1000, 1039]                   # the first and the last seed of the sample
    values = {64 = [...], 128 = [...]}     # per size

    [[expect]]                             # in E0.toml, or in another file (E1.toml)
    metric = "collapse_time"
    op = ">="
    bound = 0.01                           # the level: the row passes at p >= bound
    scope = "two-sample"                   # the p-value of the two-sample Kolmogorov–Smirnov test
    reference = "E0.collapse_time"         # of the seeds' values against the sample of this size

One generic evaluator, :func:`evaluate`, checks every expectation against the values measured
per seed (:mod:`attnflow.workflows.reproduce` measures them); no experiment has code of its own.

Every configuration (each variant at each size, quick overrides included) is validated through
:func:`attnflow.io.config.config_from_dict` when the file is loaded, so a broken file fails before
anything runs, with a :class:`~attnflow.io.config.ConfigError` naming the file and the key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from attnflow.io.config import Config, ConfigError, apply_overrides, config_from_dict
from attnflow.io.outcomes import time_label

__all__ = [
    "evaluate",
    "Expectation",
    "Experiment",
    "ReferenceSample",
    "QuickSettings",
    "Variant",
    "experiment_ids",
    "load_experiment",
    "load_experiments",
]

KINDS = ("simulate", "realize_orbit", "realize_sphere")
REALIZE_PARAMETERS = {
    "realize_orbit": ("weights", "kappas", "mus", "beta", "t_end", "dt", "save_every"),
    "realize_sphere": ("target_seed", "v0", "gauge", "sigma", "beta", "t_end", "dt", "save_every"),
    "density": (),  # the setting is attnflow.workflows.density_particles's
}
OPS = ("<", "<=", ">", ">=", "==", "~=", "in")
SCOPES = ("every seed", "median", "min", "max", "count", "two-sample")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Expectation(_Frozen):
    """One expected outcome: ``metric op bound`` for every seed, or for an aggregate over seeds."""

    text: str
    metric: str
    op: Literal["<", "<=", ">", ">=", "==", "~=", "in"]
    bound: bool | float | tuple[float, float] | None = None
    bound_metric: str | None = None
    tol: float = Field(0.0, ge=0)
    scope: Literal["every seed", "median", "min", "max", "count", "two-sample"] = "every seed"
    min_count: int = Field(1, ge=1)
    reference: str | None = None  # "two-sample": the reference sample, "<experiment id>.<name>"
    at: float | None = Field(None, ge=0)
    sizes: tuple[int, ...] | None = None
    variants: tuple[str, ...] | None = None
    across: Literal["each size", "some size"] = "each size"

    @model_validator(mode="after")
    def _one_bound(self) -> Self:
        if (self.bound is None) == (self.bound_metric is None):
            raise ValueError("exactly one of `bound` and `bound_metric`")
        if self.op == "in" and not isinstance(self.bound, tuple):
            raise ValueError("a `bound` = [lo, hi] when `op` = 'in'")
        if self.op != "in" and isinstance(self.bound, tuple):
            raise ValueError("a single number for `bound` unless `op` = 'in'")
        if self.bound_metric is not None and self.scope != "every seed":
            raise ValueError("`scope` = 'every seed' with `bound_metric` (a per-seed bound)")
        if (self.reference is None) != (self.scope != "two-sample"):
            raise ValueError("a `reference` ('<experiment id>.<name>') exactly when `scope` = 'two-sample'")
        if self.scope == "two-sample" and not (self.op == ">=" and isinstance(self.bound, float) and
                                               0.0 < self.bound < 1.0):  # fmt: skip
            raise ValueError("`op` = '>=' and a level 0 < `bound` < 1 when `scope` = 'two-sample'")
        return self


class ReferenceSample(_Frozen):
    """Values of ``metric`` measured by the real simulator on the seeds ``seeds[0]..seeds[1]``, per size."""

    metric: str
    seeds: tuple[int, int]
    values: dict[int, tuple[float, ...]]

    @model_validator(mode="after")
    def _one_value_per_seed(self) -> Self:
        count = self.seeds[1] - self.seeds[0] + 1
        wrong = {n: len(v) for n, v in self.values.items() if len(v) != count}
        if count < 2 or wrong:
            raise ValueError(f"one value per seed of `seeds` ({count}, at least 2) at each size; got {wrong}")
        return self


class Variant(_Frozen):
    """A named set of config overrides; every variant runs at every size."""

    name: str = ""
    label: str = ""
    shape: str = ""  # replaces the experiment's `shape` in figure titles
    overrides: tuple[str, ...] = ()


class QuickSettings(_Frozen):
    """What ``--quick`` runs: fewer sizes and seeds, optional overrides."""

    sizes: tuple[int, ...] = (64,)
    seeds: tuple[int, ...] = (0, 1, 2)
    overrides: tuple[str, ...] = ()
    realize: dict[str, Any] = Field(default_factory=dict)


class Experiment(_Frozen):
    """An experiment of the paper: metadata, configuration (or realisation parameters), expectations."""

    id: str
    title: str
    setting: str
    shape: str = ""
    kind: Literal["simulate", "realize_orbit", "realize_sphere", "density"] = "simulate"
    sizes: tuple[int, ...] = Field(min_length=1)
    seeds: tuple[int, ...] = Field(min_length=1)
    report_times: tuple[float, ...] = ()
    series_metrics: tuple[Literal["gauge_n_clusters"], ...] = ()
    report_metrics: tuple[str, ...] = ()
    quick: QuickSettings = Field(default_factory=QuickSettings)
    config: dict[str, Any] = Field(default_factory=dict)
    realize: dict[str, Any] = Field(default_factory=dict)
    variants: tuple[Variant, ...] = (Variant(),)
    # each seed solved a second time with the gauge taken out (the same kernel and solver, Q = I),
    # from its gauge frame's initial state u_i(0) = Q(xi_i) x_i(0): by conjugacy the gauge frame
    # follows that flow (for E1, E0's), and ``conjugate_gap`` measures how far it strays
    conjugate: bool = False
    # the reference samples of the file ([reference.<name>], "<id>.<name>" here) and those its
    # two-sample rows name in other files
    reference: dict[str, ReferenceSample] = Field(default_factory=dict)
    expect: tuple[Expectation, ...] = Field(min_length=1)
    source: str = ""

    def simulation_config(
        self, variant: Variant, n: int, *, quick: bool = False, overrides: Sequence[str] = ()
    ) -> Config:
        """The validated config of ``variant`` at ``n`` tokens (seed 0; the runner sets the seed);
        ``overrides`` (``key=value``) come last, e.g. ``solver.method=rk4``."""
        extra = overrides
        overrides = [f"model.n={n}", *variant.overrides, *(self.quick.overrides if quick else ()), *extra]
        where = self.source or self.id
        data = apply_overrides(self.config, overrides, where=where)
        return config_from_dict(data, where=where)

    def realize_parameters(self, *, quick: bool = False) -> dict[str, Any]:
        """The realisation parameters (``kind`` = "realize_*"), with the quick ones under ``--quick``."""
        return {**self.realize, **(self.quick.realize if quick else {})}


def _experiments_folder() -> Path:
    return Path(str(resources.files("attnflow").joinpath("workflows", "paper")))


def experiment_ids() -> list[str]:
    """Ids of the packaged experiments, in order (``E0``, ``E1``, ...)."""
    files = sorted(_experiments_folder().glob("*.toml"), key=lambda p: (len(p.stem), p.stem))
    return [p.stem for p in files]


def _fail(where: str, key: str | None, constraint: str, value: Any) -> ConfigError:
    return ConfigError.from_parts(key, constraint, value, where=where)


def _check(experiment: Experiment, where: str) -> None:
    if experiment.kind == "simulate":
        if experiment.realize or experiment.quick.realize:
            raise _fail(where, "realize", "absent when `kind` = 'simulate'", experiment.realize)
        for variant in experiment.variants:
            for quick in (False, True):
                sizes = experiment.quick.sizes if quick else experiment.sizes
                for n in sizes:
                    config = experiment.simulation_config(variant, n, quick=quick)
                    t_end = config.solver.t_end
                    late = [t for t in experiment.report_times if t > t_end]
                    if late:
                        raise _fail(where, "report_times", f"times <= solver.t_end = {t_end:g}", late)
                    if experiment.conjugate and config.gauge.kind == "none":
                        no_gauge = "false for a run without a gauge (nothing to take out)"
                        raise _fail(where, "conjugate", no_gauge, experiment.conjugate)
    else:
        if experiment.config:
            raise _fail(where, "config", f"absent when `kind` = {experiment.kind!r}", experiment.config)
        if experiment.conjugate:
            raise _fail(where, "conjugate", "false when `kind` = 'simulate' is not", experiment.conjugate)
        allowed = REALIZE_PARAMETERS[experiment.kind]
        for key in (*experiment.realize, *experiment.quick.realize):
            if key not in allowed:
                raise _fail(where, f"realize.{key}", f"one of {', '.join(allowed)}", key)
    names = [v.name for v in experiment.variants]
    for expectation in experiment.expect:
        unknown = [v for v in expectation.variants or () if v not in names]
        if unknown:
            raise _fail(where, "expect.variants", f"names of [[variants]] ({names})", unknown)
        if expectation.reference is not None:
            sample = experiment.reference[expectation.reference]
            sizes = {*experiment.sizes, *experiment.quick.sizes} & set(expectation.sizes or experiment.sizes)
            missing = sorted(sizes - set(sample.values))
            if missing:
                constraint = f"a sample with values at every size ({missing} missing)"
                raise _fail(where, "expect.reference", constraint, expectation.reference)


def _references(data: dict[str, Any], folder: Path, where: str) -> dict[str, Any]:
    """The file's own reference samples (``[reference.<name>]``) named ``"<id>.<name>"``, and those of
    other files of ``folder`` that its two-sample rows name."""
    own_id, own = data.get("id"), data.get("reference") or {}
    if not isinstance(own, dict):  # refused by the model, naming the key
        return own
    samples = {f"{own_id}.{name}": sample for name, sample in own.items()}
    for index, row in enumerate(data.get("expect") or ()):
        name = row.get("reference") if isinstance(row, dict) else None
        if not isinstance(name, str) or name in samples:
            continue
        eid, _, short = name.partition(".")
        source = folder / f"{eid}.toml"
        try:
            with source.open("rb") as handle:
                other = tomllib.load(handle).get("reference") or {}
        except (OSError, tomllib.TOMLDecodeError):
            other = {}
        if eid == own_id or short not in other:
            constraint = "'<experiment id>.<name>' of a [reference.<name>] table of that experiment's file"
            raise _fail(where, f"expect.{index}.reference", constraint, name)
        samples[name] = other[short]
    return samples


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate one experiment file; errors are ConfigError naming the file and the key."""
    path = Path(path)
    where = str(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as error:
        raise _fail(where, None, "a readable TOML file", error.strerror or str(error)) from None
    except tomllib.TOMLDecodeError as error:
        raise _fail(where, None, "valid TOML", str(error)) from None
    references = _references(data, path.parent, where)
    try:
        experiment = Experiment.model_validate({**data, "reference": references, "source": path.name})
    except ValidationError as error:
        first = error.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or None
        raise _fail(where, key, first["msg"].removeprefix("Value error, "), first.get("input")) from None
    _check(experiment, where)
    return experiment


def load_experiments(only: Sequence[str] | None = None) -> list[Experiment]:
    """The packaged experiments (all, or the ids in ``only``, in file order)."""
    ids = experiment_ids()
    wanted = ids if only is None else [i for i in ids if i in set(only)]
    folder = _experiments_folder()
    return [load_experiment(folder / f"{i}.toml") for i in wanted]


# --------------------------------------------------------------------------- evaluate


def _holds(value: Any, op: str, bound: Any, tol: float) -> bool:
    if value is None or bound is None:
        return False
    if op == "==":
        return value == bound
    if op == "~=":
        return abs(value - bound) <= tol
    if op == "in":
        return bound[0] <= value <= bound[1]
    compare = {"<": float.__lt__, "<=": float.__le__, ">": float.__gt__, ">=": float.__ge__}[op]
    return compare(float(value), float(bound) + (tol if op in ("<", "<=") else -tol))


def _aggregate(values: list, scope: str) -> Any:
    if any(v is None for v in values) or not values:
        return None
    reduce = {"median": np.median, "min": np.min, "max": np.max}[scope]
    return float(reduce(np.asarray(values, dtype=float)))


def two_sample_p(values: Sequence[float], reference: Sequence[float]) -> float:
    """The p-value of the two-sample Kolmogorov–Smirnov test (exact, two-sided) of ``values`` against
    ``reference`` (ties, as on a grid of saved times, make it conservative)."""
    from scipy.stats import ks_2samp  # scipy.stats is slow to import: only where a row needs it

    return float(ks_2samp(np.asarray(values, float), np.asarray(reference, float), method="exact").pvalue)


def _evaluate_job(expectation: Expectation, job: Any, sample: ReferenceSample | None = None) -> dict:
    label = time_label(expectation.at)
    row = {"n": job.n, "variant": job.variant, "status": "FAIL", "measured": None, "per_seed": {},
           "failing_seeds": []}  # fmt: skip
    if job.status in ("skipped", "error"):
        return row | {"status": "SKIP" if job.status == "skipped" else "FAIL", "note": job.reason}
    per_seed = [(v["seed"], v.get(label, {})) for v in job.values]
    measured = [at.get(expectation.metric) for _, at in per_seed]
    row["per_seed"] = {str(seed): value for (seed, _), value in zip(per_seed, measured, strict=True)}
    if expectation.scope == "every seed":
        bounds = [at.get(expectation.bound_metric) if expectation.bound_metric else expectation.bound
                  for _, at in per_seed]  # fmt: skip
        ok = [_holds(v, expectation.op, b, expectation.tol) for v, b in zip(measured, bounds, strict=True)]
        row["failing_seeds"] = [seed for (seed, _), good in zip(per_seed, ok, strict=True) if not good]
        row["measured"] = _worst(measured, bounds, expectation)
        if expectation.bound_metric:
            row["bound_per_seed"] = {str(seed): b for (seed, _), b in zip(per_seed, bounds, strict=True)}
        passed = all(ok)
    elif expectation.scope == "count":
        ok = [_holds(v, expectation.op, expectation.bound, expectation.tol) for v in measured]
        row["measured"] = int(sum(ok))
        passed = row["measured"] >= expectation.min_count
    elif expectation.scope == "two-sample":
        reference = sample.values.get(job.n) if sample is not None else None
        if reference is None:  # a size of --sizes that the sample does not have
            return row | {"status": "SKIP", "note": f"no reference sample at n = {job.n}"}
        missing = any(v is None for v in measured)  # a seed that never reached the value: FAIL
        row["measured"] = None if missing or not measured else two_sample_p(measured, reference)
        passed = _holds(row["measured"], expectation.op, expectation.bound, expectation.tol)
    else:
        row["measured"] = _aggregate(measured, expectation.scope)
        passed = _holds(row["measured"], expectation.op, expectation.bound, expectation.tol)
    if job.status != "ok":
        row["note"] = job.reason
    row["status"] = "PASS" if passed else "FAIL"
    return row


def _worst(values: list, bounds: list, expectation: Expectation) -> Any:
    """The seed value closest to failing (or failing most), as the row's headline number."""
    if any(v is None for v in values) or not values:
        return None
    if expectation.op == "==":
        return values[0] if all(v == values[0] for v in values) else sorted(set(values), key=str)
    if expectation.op == "~=":
        return max(abs(v - b) for v, b in zip(values, bounds, strict=True) if b is not None)
    if expectation.op in ("<", "<="):
        return max(values) if expectation.bound_metric is None else max(
            (v - b for v, b in zip(values, bounds, strict=True) if b is not None), default=None)  # fmt: skip
    if expectation.op in (">", ">="):
        return min(values)
    return [min(values), max(values)]  # "in"


def evaluate(experiment: Experiment, jobs: Sequence[Any]) -> list[dict[str, Any]]:
    """Check every expectation of ``experiment`` against measured values; one row per
    (expectation, variant, size), or per (expectation, variant) with ``across = "some size"``.

    ``jobs`` are the results of the experiment's runs (:class:`attnflow.io.outcomes.JobResult`): each
    has ``variant``, ``n``, ``status`` ("ok", "skipped", "error", or a solver status), ``reason``,
    and ``values``, one dict per seed: ``{"seed": s, "final": {metric: value}, "t=20": {...}}``.
    A value that is missing or None never satisfies a comparison. Rows hold the measured value
    (the worst seed for "every seed", the aggregate otherwise), the per-seed values, the failing
    seeds and the status PASS / FAIL / SKIP (the run was skipped).
    """
    rows = []
    for index, expectation in enumerate(experiment.expect):
        head = {"experiment": experiment.id, "index": index, "text": expectation.text,
                "metric": expectation.metric, "at": time_label(expectation.at), "op": expectation.op,
                "bound": expectation.bound if expectation.bound_metric is None else expectation.bound_metric,
                "tol": expectation.tol, "scope": expectation.scope}  # fmt: skip
        if expectation.scope == "count":
            head["min_count"] = expectation.min_count
        if expectation.reference is not None:
            head["reference"] = expectation.reference
        for variant in experiment.variants:
            if expectation.variants is not None and variant.name not in expectation.variants:
                continue
            mine = [j for j in jobs if j.variant == variant.name]
            mine = [j for j in mine if expectation.sizes is None or j.n in expectation.sizes]
            sample = experiment.reference.get(expectation.reference) if expectation.reference else None
            per_size = [head | _evaluate_job(expectation, job, sample) for job in mine]
            if expectation.across == "each size" or not per_size:
                rows.extend(per_size)
                continue
            statuses = [r["status"] for r in per_size]
            status = "PASS" if "PASS" in statuses else ("SKIP" if set(statuses) == {"SKIP"} else "FAIL")
            rows.append(head | {"n": "some", "variant": variant.name, "status": status,
                                "measured": {str(r["n"]): r["measured"] for r in per_size},
                                "per_size": per_size})  # fmt: skip
    return rows
