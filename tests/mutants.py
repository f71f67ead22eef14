"""Wrong simulators for the mutation test (tests/test_mutants.py) and its full-size table
(scripts/mutants_table.py).

A mutant is the real vector field with one part of the model done wrong: the sign, beta, the clock,
the gauge, the labels, Q^T for Q, the values, the factor, the causal mask, the softmax, the
expansion's tolerance, the layer norm (post-LN instead of the configured one; under a layer norm
the other mutants change its layer). Two more are mistakes of the build from the config to the
field (:data:`BUILD_MUTANTS`: a preset's RoPE scaling ignored, beta = model.beta instead of
gamma log n): a function of the build is replaced, and the field is the real field of what the
wrong build made. For the others, ``solve`` is replaced, in every attnflow module that imported it,
by a function that swaps the field it is given for its mutant and calls the real ``solve``: every
simulated experiment and every realisation really runs the wrong field. The mutant is an instance
of a subclass of the field's class (``Mutant[<name>]``) that applies the mutation inside its
``__call__``: the field's class is part of its program's key
(:func:`attnflow.numerics.program_cache.split_field`), so no program compiled for the real field
(nor for another mutant) can stand in for it. The mutants that differ only by a number (the clock's
-1, 0.5, 2; beta's 0.5, 2) share ``Mutant[clock]`` and ``Mutant[beta]``: one program, whose
argument ``number`` is each mutant's own, so each still runs its own wrong field.

A mutant *can act* on a run when the part it changes is in the run's field (:func:`acts`: a gauge,
an asymmetric gauge for Q^T, a factor, a mask, the softmax, the expansion, a layer norm other than
post-LN; the sign, beta and the clock always; a build mutant where the function it replaces returns
another value than the real one, e.g. for a gauge.preset with a scaling rule). Where it cannot, its
field is the real one (:func:`changes` evaluates both), no row can notice it, and the table says so
(:data:`CANNOT_ACT`).
:data:`BLIND` lists the cells where it acts and every row still passes, with the reason
(docs/mutants.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

import attnflow.numerics.solve as solve_module
from attnflow.core import factors, gauges, rope_presets
from attnflow.core.pytree import pytree_field
from attnflow.numerics.dynamics import AttentionField
from attnflow.numerics.heads_field import HeadsField
from attnflow.numerics.layer_norms import LayerNormField
from attnflow.workflows import build as build_module
from attnflow.workflows import realize, reproduce  # noqa: F401  (realize: its solve is patched)

# the field of a mutant differs from the real one by more than this (relative to max |v|) at the
# initial state: round-off of a regrouped sum is 1e-15, the loosened expansion's change 1e-7
ACTS_RTOL = 1e-11
SHUFFLE_SEED = 12345
LOOSER = 1e4  # the expansion's tolerance loosened this many times

MUTANTS = {
    "sign flipped": "v -> -v (gradient descent)",
    "beta x 0.5": "beta halved inside the dynamics",
    "beta x 2": "beta doubled inside the dynamics",
    "time x 0.5": "the field times 0.5 (the clock at half speed)",
    "time x 2": "the field times 2 (the clock at double speed)",
    "gauge ignored": "Q(xi) = I inside the dynamics",
    "labels shuffled": "the gauges and factor rows of the tokens permuted (a fixed permutation)",
    "Q^T for Q": "every Q(xi_i) transposed",
    "values swapped": "value gradient <-> logits_only (heads: rotated <-> plain)",
    "factor ignored": "w = 1 inside the dynamics",
    "causal ignored": "no mask",
    "sa as usa": "the softmax rows replaced by 1/n",
    "expansion loosened": f"the expansion's tolerance times {LOOSER:g}",
    "layer norm dropped": "post-LN instead of the configured layer norm (pre, peri: dz/dt = r P_x A, "
    "the radius held)",
}
# Mistakes of the build (config -> field), not of the field: the function replaced, and what it does.
BUILD_MUTANTS = {
    "preset scaling ignored": "rope_presets.scaled_frequencies returns the base frequencies: a "
    "gauge.preset's context-extension rule (llama3, YaRN, ...) dropped",
    "beta fixed instead of scaled": "build.model_beta returns model.beta: beta = gamma log n "
    "(model.beta_scaling = 'log_n') dropped",
}
MUTANTS |= BUILD_MUTANTS


_ALL = tuple(f"E{k}" for k in range(18))
_BARE = ("E0", "E10", "E11", "E12", "E14")  # no gauge, no factor (E10-E12: layers without them)
_NO_GAUGE = (*_BARE, "E4", "E5")
# Where a mutant cannot act: the part it changes is not there (its field is the real one; checked
# by tests/test_mutants.py): no gauge; a symmetric gauge (E8's Householder reflections) for Q^T;
# w = 1; no mask; usa; the exact path.
CANNOT_ACT = {
    **{("gauge ignored", e): "no gauge" for e in _NO_GAUGE},
    **{("labels shuffled", e): "no gauge, no factor: no label enters the field" for e in _BARE},
    **{("Q^T for Q", e): "no gauge" for e in _NO_GAUGE},
    ("Q^T for Q", "E8"): "Householder reflections are symmetric: Q^T = Q",
    **{("values swapped", e): "no gauge: both values are x_j" for e in _NO_GAUGE},
    **{("factor ignored", e): "w = 1" for e in _ALL if e not in ("E4", "E5", "E16")},
    **{("causal ignored", e): "no mask" for e in _ALL if e != "E10"},
    **{("sa as usa", e): "usa already" for e in _ALL if e not in ("E10", "E14")},
    **{("expansion loosened", e): "the exact path" for e in _ALL if e != "E14"},
    **{("layer norm dropped", e): "post-LN already" for e in _ALL if e != "E15"},
    **{("preset scaling ignored", e): "no gauge.preset" for e in _ALL if e != "E17"},
    **{("beta fixed instead of scaled", e): "beta_scaling = 'none'" for e in _ALL if e != "E17"},
}
# Where a mutant acts on the field but no measured value can tell it from the real one in law (the
# reasons are in docs/mutants.md); every other acting cell has a failing row.
BLIND = {
    ("labels shuffled", "E9"): "iid uniform tokens: permuted labels have the law of permuted tokens, and "
    "every value of E9 (the collapse to a Dirac, its rate, whose weights are permuted with their "
    "spectrum) is symmetric in the tokens",
    ("Q^T for Q", "E9"): "RoPE's Q^T is the rotation by the opposite angle: the positions reversed, the "
    "same law, as for the labels",
}


def _permutation(n: int) -> np.ndarray:
    return np.random.default_rng(SHUFFLE_SEED).permutation(n)


def _shuffle_gauge(gauge):
    if isinstance(gauge, gauges.DenseGauge):
        return gauges.DenseGauge(q=gauge.q[_permutation(gauge.n)])
    if isinstance(gauge, gauges.RoPE):
        return dataclasses.replace(gauge, angles=gauge.angles[_permutation(gauge.n)])
    return gauge  # the identity: nothing to permute


def _shuffle_factor(factor):
    if isinstance(factor, factors.MatrixFactor):
        p = _permutation(factor.n)
        return dataclasses.replace(factor, w=factor.w[p][:, p])
    if hasattr(factor, "xi"):
        return dataclasses.replace(factor, xi=factor.xi[_permutation(factor.n)])
    return factor  # w = 1


def _transpose_gauge(gauge):
    if isinstance(gauge, gauges.DenseGauge):
        return gauges.DenseGauge(q=jnp.swapaxes(gauge.q, 1, 2))
    if isinstance(gauge, gauges.RoPE):
        return dataclasses.replace(gauge, angles=-gauge.angles)
    return gauge


def _identity_gauge(gauge):
    return gauges.IdentityGauge(n=gauge.n, d=gauge.d)


def _no_factor(factor):
    return factors.NoFactor(n=factor.n)


def _scaled_beta(profile, k: float):
    try:  # a concrete beta stays concrete, a NumPy number (the expansion chooses its degree from it)
        beta = np.asarray(profile.beta) * k
    except jax.errors.TracerArrayConversionError:  # a program argument: scaled in the program
        beta = profile.beta * k
    return dataclasses.replace(profile, beta=beta)


# (kernel or head part, what it becomes) for the parameter mutants
_KERNEL_PARTS: dict[str, tuple[str, Callable]] = {
    "gauge ignored": ("gauge", _identity_gauge),
    "Q^T for Q": ("gauge", _transpose_gauge),
    "factor ignored": ("factor", _no_factor),
}
_SCALES = {"sign flipped": -1.0, "time x 0.5": 0.5, "time x 2": 2.0}
_BETAS = {"beta x 0.5": 0.5, "beta x 2": 2.0}
# the mutants that differ only by a number share one class per base (``Mutant[clock]``,
# ``Mutant[beta]``) with the number as a leaf: one compiled program serves sign flipped, time x 0.5
# and time x 2 (and beta x 0.5, beta x 2), each run with its own number as an argument
_SHARED = {**dict.fromkeys(_SCALES, "clock"), **dict.fromkeys(_BETAS, "beta")}
_OPTIONS: dict[str, Callable[[object], dict]] = {
    "causal ignored": lambda f: {"causal": False},
    "sa as usa": lambda f: {"normalization": "usa"},
    "expansion loosened": lambda f: {"tolerance": min(0.5, f.tolerance * LOOSER)},
}


def _wrong_attention_field(field: AttentionField, name: str, number=None) -> AttentionField:
    kernel = field.kernel
    options = {}
    if name in _BETAS:
        k = _BETAS[name] if number is None else number
        kernel = dataclasses.replace(kernel, profile=_scaled_beta(kernel.profile, k))
    elif name in _KERNEL_PARTS:
        part, change = _KERNEL_PARTS[name]
        kernel = dataclasses.replace(kernel, **{part: change(getattr(kernel, part))})
    elif name == "labels shuffled":
        kernel = dataclasses.replace(
            kernel, gauge=_shuffle_gauge(kernel.gauge), factor=_shuffle_factor(kernel.factor)
        )
    elif name == "values swapped":
        options = {"value": "logits_only" if field.value == "gradient" else "gradient"}
    elif name in _OPTIONS:
        options = _OPTIONS[name](field)
    values = {f.name: getattr(field, f.name) for f in dataclasses.fields(AttentionField)}
    return AttentionField(**(values | options | {"kernel": kernel}))


def _wrong_head(head, name: str):
    if name in _KERNEL_PARTS:
        part, change = _KERNEL_PARTS[name]
        return dataclasses.replace(head, **{part: change(getattr(head, part))})
    if name == "labels shuffled":
        gauge, factor = _shuffle_gauge(head.gauge), _shuffle_factor(head.factor)
        return dataclasses.replace(head, gauge=gauge, factor=factor)
    if name == "values swapped":
        return dataclasses.replace(head, values="plain" if head.values == "rotated" else "rotated")
    return head


def _wrong_heads_field(field: HeadsField, name: str, number=None) -> HeadsField:
    values = {f.name: getattr(field, f.name) for f in dataclasses.fields(HeadsField)}
    options = _OPTIONS[name](field) if name in _OPTIONS else {}
    if name in _BETAS:
        options["profile"] = _scaled_beta(field.profile, _BETAS[name] if number is None else number)
    heads = tuple(_wrong_head(head, name) for head in field.heads)
    return HeadsField(**(values | options | {"heads": heads}))


def _base_frequencies(real: Callable) -> Callable:
    def scaled_frequencies(preset, scaling=None):  # noqa: ARG001  (the rule, dropped)
        return rope_presets.base_frequencies(preset)

    return scaled_frequencies


def _fixed_beta(real: Callable) -> Callable:
    def model_beta(config):  # the same config with beta_scaling 'none': model.beta
        model = config.model.model_copy(update={"beta_scaling": "none"})
        return real(config.model_copy(update={"model": model}))

    return model_beta


# the build mutants: (module, function, the wrong function made from the real one)
_BUILD: dict[str, tuple[object, str, Callable]] = {
    "preset scaling ignored": (rope_presets, "scaled_frequencies", _base_frequencies),
    "beta fixed instead of scaled": (build_module, "model_beta", _fixed_beta),
}


def _build_patch(name: str, on_call: Callable[[bool], None], *, wrong: bool) -> tuple[object, str, Callable]:
    """``(module, attribute, function)``: the build function of the mutant ``name`` replaced by one that
    calls the real and the wrong function, reports ``on_call(whether they differ)`` and returns the
    wrong value (``wrong``) or the real one (the cheap pass of :func:`acting`)."""
    module, attribute, make_wrong = _BUILD[name]
    real = getattr(module, attribute)
    mistaken = make_wrong(real)

    def patched(*args, **kwargs):
        right, bad = real(*args, **kwargs), mistaken(*args, **kwargs)
        on_call(not np.array_equal(np.asarray(right), np.asarray(bad)))
        return bad if wrong else right

    return module, attribute, patched


def wrong_field(field, name: str, number=None):
    """The real field with the mutation ``name`` (an instance of the real field's class); a build
    mutant's field is the real one (its mistake is made before the field, in the build). ``number``:
    the beta mutants' factor (a program argument in ``Mutant[beta]``; default its own)."""
    if name in BUILD_MUTANTS:
        return field
    if isinstance(field, LayerNormField):  # the layer's mutation, under the same norm
        return dataclasses.replace(field, layer=wrong_field(field.layer, name, number))
    if isinstance(field, HeadsField):
        return _wrong_heads_field(field, name, number)
    if isinstance(field, AttentionField):
        return _wrong_attention_field(field, name, number)
    raise TypeError(f"mutants: no mutation of a {type(field).__name__}")


_CLASSES: dict[tuple[type, str], type] = {}


def mutant_class(base: type, name: str) -> type:
    """``Mutant[name]``, a subclass of ``base`` whose ``__call__`` runs the wrong field (one class
    per base and mutant: the runs of one structure share its compiled program). The mutants of
    :data:`_SHARED` share ``Mutant[clock]`` (the field times ``number``) or ``Mutant[beta]`` (beta
    times ``number``), whose field ``number`` is a leaf: an argument of the program, not a constant."""
    kind = _SHARED.get(name, name)
    if (base, kind) in _CLASSES:
        return _CLASSES[base, kind]

    def __call__(self, x):
        real = base(**{f.name: getattr(self, f.name) for f in dataclasses.fields(base)})
        if kind == "layer norm dropped":
            return _post_instead(real, x)
        if kind == "clock":
            v = base.__call__(real, x)
            return v * jnp.asarray(self.number).astype(v.dtype)  # -1, 0.5, 2: exact
        if kind == "beta":
            return base.__call__(wrong_field(real, name, self.number), x)  # any beta mutant: its number
        return base.__call__(wrong_field(real, name), x)

    namespace = {"__call__": __call__, "__module__": __name__}
    data = base.pytree_data_fields  # arrays as arguments, as the base's
    if kind in ("clock", "beta"):
        namespace |= {"__annotations__": {"number": "object"}, "number": 1.0}
    cls = type(f"Mutant[{kind}]", (base,), namespace)
    if kind in ("clock", "beta"):
        cls = dataclasses.dataclass(frozen=True)(cls)
        data = (*data, "number")
    cls = pytree_field(data_fields=data)(cls)
    _CLASSES[base, kind] = cls
    return cls


def _post_instead(field, state):
    """The velocity of ``state`` under post-LN instead of ``field``'s layer norm: the layer's own
    field (nGPT: on the sphere); for pre and peri (``state`` is ``z = r x``) ``r P_x A``, so that the
    direction moves as under post-LN and the radius does not change."""
    if not isinstance(field, LayerNormField) or field.kind == "post":
        return field(state)
    if not field.radial:
        return field.layer(state)
    r = jnp.linalg.norm(state, axis=-1, keepdims=True)
    return r * field.layer(state / r)


def mutant(field, name: str):
    """``field`` as the mutant ``name`` (same arrays and options, the mutant's class); a build mutant's
    field is ``field`` itself (the build made it wrong, or not)."""
    if name in BUILD_MUTANTS:
        return field
    base = type(field)
    values = {f.name: getattr(field, f.name) for f in dataclasses.fields(base)}
    if name in _SHARED:  # its number, as a leaf of the shared class
        values["number"] = np.float64((_SCALES | _BETAS)[name])
    return mutant_class(base, name)(**values)


def changes(field, name: str, x0) -> bool:
    """Whether the mutation changes the field at ``x0`` (one state, or the first of a batch), by
    evaluating both (relative difference above :data:`ACTS_RTOL`)."""
    x = jnp.asarray(x0)
    x = x.reshape(-1, *x.shape[-2:])[0]
    real = np.asarray(field(x))
    wrong = np.asarray(mutant(field, name)(x))
    scale = max(float(np.max(np.abs(real))), 1e-300)
    return bool(np.max(np.abs(wrong - real)) > ACTS_RTOL * scale)


def _matrices(gauge) -> np.ndarray | None:
    return None if gauge.is_identity else np.asarray(gauge.matrices())


def _parts(field) -> list[tuple]:
    """``(gauge matrices or None, factor matrix)`` of each head (the paper's field: one)."""
    if isinstance(field, HeadsField):
        return [(_matrices(h.gauge), np.asarray(h.factor.dense())) for h in field.heads]
    return [(_matrices(field.kernel.gauge), np.asarray(field.kernel.factor.dense()))]


def _acts_on(q, w, name: str) -> bool:
    eye = np.eye(q.shape[-1]) if q is not None else None
    if name == "gauge ignored":
        return q is not None and not np.array_equal(q, np.broadcast_to(eye, q.shape))
    if name == "Q^T for Q":
        return q is not None and not np.array_equal(q, np.swapaxes(q, 1, 2))
    if name == "values swapped":  # Q_i^T Q_j = I for every pair iff all Q_i are one matrix
        return q is not None and not np.array_equal(q, np.broadcast_to(q[:1], q.shape))
    if name == "labels shuffled":
        p = _permutation(w.shape[0])
        return not np.array_equal(w[p][:, p], w) or (q is not None and not np.array_equal(q[p], q))
    if name == "factor ignored":
        return not np.all(w == 1.0)
    raise KeyError(name)


def acts(field, name: str, x0=None) -> bool:  # noqa: ARG001  (x0: the signature of `changes`)
    """Whether the mutation ``name`` changes the field's definition: the sign, beta and the clock
    always; the others where the part they change is there (a gauge that is not the identity, an
    asymmetric gauge for Q^T, a gauge that is not one matrix for the values, labels that a
    permutation moves, a factor that is not 1, a mask, the softmax, the expansion). Where it does
    not, the mutant's field is the real one (``changes`` checks it numerically). A build mutant: False
    (the field cannot tell; whether it acts is recorded in the build, by :func:`installed` and
    :func:`acting`)."""
    if name in BUILD_MUTANTS:
        return False
    if name in _SCALES or name in _BETAS:
        return True
    if name == "layer norm dropped":
        return isinstance(field, LayerNormField) and field.kind != "post"
    if isinstance(field, LayerNormField):  # the other mutants act on the layer
        field = field.layer
    if name == "causal ignored":
        return field.causal is not False
    if name == "sa as usa":
        return field.normalization == "sa"
    if name == "expansion loosened":
        return field.interaction == "expansion"
    return any(_acts_on(q, w, name) for q, w in _parts(field))


@contextlib.contextmanager
def installed(name: str, monkeypatch=None) -> Iterator[dict]:
    """Within the block every attnflow ``solve`` runs the mutant ``name`` (a build mutant: its build
    function returns the wrong value, and ``solve`` runs the field so built); yields a record
    ``{job label: acts}`` of the runs (the label of the job being run, whether the mutant can act
    on its field, or changed its build). With ``monkeypatch`` (pytest) the patches are its own; else
    undone on exit."""
    original, original_run_job = solve_module.solve, reproduce.run_job
    record: dict[str, bool] = {}
    current = {"label": None}

    def mutant_solve(field, x0, **options):
        label = current["label"]
        record[label] = record.get(label, False) or acts(field, name, x0)
        return original(mutant(field, name), x0, **options)

    def run_job(job, tick):
        current["label"] = (job.experiment.id, job.variant.name, job.n)
        return original_run_job(job, tick)

    def built(differs: bool) -> None:  # a build mutant acts on the job whose build it changed
        record[current["label"]] = record.get(current["label"], False) or differs

    modules = [m for key, m in list(sys.modules.items()) if key.startswith("attnflow.")]
    if name in BUILD_MUTANTS:  # the solve is the real one, of the field the wrong build made
        patches = [_build_patch(name, built, wrong=True)]
    else:
        patches = [(m, "solve", mutant_solve) for m in modules if getattr(m, "solve", None) is original]
    patches.append((reproduce, "run_job", run_job))
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patches]
    try:
        for module, attr, value in patches:
            if monkeypatch is not None:
                monkeypatch.setattr(module, attr, value)
            else:
                setattr(module, attr, value)
        yield record
    finally:
        if monkeypatch is None:
            for module, attr, value in saved:
                setattr(module, attr, value)


def run(name: str, experiments, jobs, *, workers: int = 1) -> tuple[list, dict]:
    """The results of ``jobs`` run with the mutant ``name`` and which runs it can act on."""
    with installed(name) as record:
        results = reproduce.run_jobs(jobs, lambda units, stage=None: None, workers=workers)
    return results, dict(record)


# --------------------------------------------------------------------------- the table


def _frozen_solve(record: dict, current: dict, names, original) -> Callable:
    """A ``solve`` that records, for each mutant of ``names``, whether it can act on the run's field,
    and returns a trajectory that never moves (no simulation: the cheap pass of :func:`acting`)."""
    from attnflow.numerics.solve import Trajectory, snapshot_count
    from attnflow.numerics.status import Status

    def solve(field, x0, *, t_end, save_every, on_snapshot=None, **options):
        for name in names:
            key = (name, current["label"])
            record[key] = record.get(key, False) or acts(field, name, x0)
        count = snapshot_count(t_end, save_every)
        x0 = np.asarray(x0)
        xs = np.broadcast_to(x0, (count, *x0.shape)).copy()
        batch = x0.shape[:-2]
        zeros = np.zeros(batch, dtype=int)
        statuses = np.full(batch, Status.ok, dtype=object)
        return Trajectory(ts=np.arange(count) * save_every, xs=xs, statuses=statuses, steps=0,
                          accepted=zeros, rejected=zeros, evaluations=zeros)  # fmt: skip

    return solve


def label(job) -> tuple:
    return (job.experiment.id, job.variant.name, job.n)


def acting(jobs, names=None) -> dict:
    """``{(mutant, job label): acts}`` for ``jobs``, without simulating: each job's field is built
    as reproduce builds it and compared with each mutant's at the initial state (one pass)."""
    names = list(names or MUTANTS)
    record: dict = {}
    current = {"label": None}
    original, original_run_job = solve_module.solve, reproduce.run_job
    frozen = _frozen_solve(record, current, names, original)
    modules = [m for key, m in list(sys.modules.items()) if key.startswith("attnflow.")]
    patched = [m for m in modules if getattr(m, "solve", None) is original]
    original_measure = reproduce.measure

    def no_measure(*args, **kwargs):  # the record is made: a simulated job stops here
        raise _Recorded

    def probe(name):  # a build mutant acts on the job whose build it would change
        def built(differs: bool) -> None:
            key = (name, current["label"])
            record[key] = record.get(key, False) or differs

        return _build_patch(name, built, wrong=False)

    probes = [probe(name) for name in names if name in BUILD_MUTANTS]
    saved = [(module, attribute, getattr(module, attribute)) for module, attribute, _ in probes]
    try:
        for module in patched:
            module.solve = frozen
        for module, attribute, value in probes:
            setattr(module, attribute, value)
        reproduce.measure = no_measure
        for job in jobs:
            current["label"] = label(job)
            original_run_job(job, lambda units, stage=None: None)
    finally:
        for module in patched:
            module.solve = original
        for module, attribute, value in saved:
            setattr(module, attribute, value)
        reproduce.measure = original_measure
    return record


class _Recorded(Exception):
    """Raised after the cheap pass has recorded a simulated job (run_job records it as an error)."""


def cell(name: str, experiment, jobs, where: dict) -> tuple[str, list]:
    """The mutant ``name`` against one experiment: ``("cannot act", [])`` when it changes no run's
    field (``where``: :func:`acting`); else its acting jobs run one at a time until a row fails:
    ``("FAIL", the rows that failed)`` or ``("PASS", [])``."""
    from attnflow.workflows import experiments as experiment_files

    mine = [j for j in jobs if j.experiment.id == experiment.id and where.get((name, label(j)))]
    mine.sort(key=lambda j: j.cost())  # the cheapest first: most cells stop at their first job
    if not mine:
        return "cannot act", []
    for job in mine:
        results, _ = run(name, [experiment], [job])
        rows = experiment_files.evaluate(experiment, results)
        failed = [(r["variant"], r["n"], r["metric"], r["text"]) for r in rows if r["status"] == "FAIL"]
        if failed:
            return "FAIL", failed
    return "PASS", []


def table(experiments, *, quick: bool, names=None, skip=(), on_cell=None) -> dict:
    """``{(mutant, experiment id): cell(...)}`` for every mutant (or ``names``) and experiment; the
    cells of ``skip`` (e.g. :data:`BLIND`) where the mutant acts are not run: ``("not run", [])``.
    ``on_cell(name, experiment id, cell)`` is called as each cell is done."""
    jobs = reproduce.plan(experiments, quick=quick)
    where = acting(jobs, names)
    cells = {}
    for name in names or MUTANTS:
        for e in experiments:
            runs = any(where.get((name, label(j))) for j in jobs if j.experiment.id == e.id)
            skipped = runs and (name, e.id) in skip
            cells[name, e.id] = ("not run", []) if skipped else cell(name, e, jobs, where)
            if on_cell is not None:
                on_cell(name, e.id, cells[name, e.id])
    return cells
