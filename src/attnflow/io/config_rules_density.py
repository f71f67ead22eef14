"""The rules of a ``[density]`` section (``attnflow run`` then solves the law instead of particles):
which particle keys it refuses, its domain, labels, solver and initial law. Each rule is a rule of
:mod:`attnflow.io.config_rules` (which runs them: the first before every other rule, the rest last)."""

from attnflow.io.config_errors import ConfigError, as_lists, numbers
from attnflow.io.config_unused import check_density_unused

DENSITY_METHODS = ("euler", "rk4", "adaptive")  # the identity retraction: a density is not renormalised


def density_reads_only_its_keys(config) -> None:
    """With a [density] section, the particle keys it does not read are refused first
    (:data:`attnflow.io.config_unused.DENSITY_IGNORED`), before a rule about one of them."""
    check_density_unused(config, where="config")


def _density_domain_fits(config) -> None:
    """One domain: ``density.grid`` on S^1 (``model.d = 2``) or ``density.lmax`` on S^2 (``d = 3``)."""
    density, d = config.density, config.model.d
    if density is None:
        return
    if (density.grid is None) == (density.lmax is None):
        raise ConfigError.from_parts(
            "density.grid",
            "set for S^1 (model.d = 2), or `density.lmax` for S^2 (model.d = 3): exactly one of them",
            density.grid,
            hint="For example: [density] grid = 64 with [model] d = 2.",
        )
    wanted, key = (2, "density.grid") if density.grid is not None else (3, "density.lmax")
    if d != wanted:
        raise ConfigError.from_parts(
            "model.d", f"{wanted} with `{key}` (the density lives on S^{wanted - 1})", d
        )


def _density_leaves_out_particle_sections(config) -> None:
    if config.density is not None and config.attention is not None:
        raise ConfigError.from_parts(
            "attention",
            "left out with a [density] section (the density solves the paper's single head)",
            "an [attention] section",
            hint="Remove the [attention] section, or the [density] section to run particles.",
        )


def _density_labels_fit(config) -> None:
    """``density.labels`` and ``density.label_rule`` make the position nodes: read only for positions."""
    density = config.density
    if density is None or config.aux.kind == "positions":
        return
    fields = type(density).model_fields
    for name in ("labels", "label_rule"):
        if getattr(density, name) != fields[name].default:
            raise ConfigError.from_parts(
                f"density.{name}",
                f"left out when `aux.kind` = {config.aux.kind!r} (it sets the nodes of positions on [0, 1))",
                getattr(density, name),
                hint="Remove it, or set aux.kind = 'positions'.",
            )


def _density_solver_fits(config) -> None:
    density = config.density
    if density is None:
        return
    method = config.solver.method
    if method not in DENSITY_METHODS:
        raise ConfigError.from_parts(
            "solver.method",
            f"one of {DENSITY_METHODS} with a [density] section (a density is not renormalised: no "
            "geodesic steps)",
            method,
        )


def _density_mixture_fits(config) -> None:
    density, d = config.density, config.model.d
    if density is None or density.init != "vmf":
        return
    if density.centers is None:
        raise ConfigError.from_parts(
            "density.centers",
            f"a list of directions (lists of model.d = {d} numbers) when `density.init` = 'vmf'",
            None,
            hint="For example: centers = [[1.0, 0.0], [-1.0, 0.0]].",
        )
    for center in density.centers:
        if len(center) != d:
            raise ConfigError.from_parts(
                "density.centers",
                f"a list of directions of `model.d` = {d} numbers each",
                as_lists(density.centers),
            )
    if density.weights is not None and len(density.weights) != len(density.centers):
        raise ConfigError.from_parts(
            "density.weights",
            f"a list of {numbers(len(density.centers))}, one per center",
            list(density.weights),
        )


def _density_file_is_given(config) -> None:
    density = config.density
    if density is not None and density.init == "file" and density.path is None:
        raise ConfigError.from_parts(
            "density.path",
            "a file path when `density.init` = 'file'",
            None,
            hint="A .npy of the initial density's values on the grid (one row per label node, or one row).",
        )


DENSITY_RULES = (
    _density_domain_fits,
    _density_leaves_out_particle_sections,
    _density_labels_fit,
    _density_solver_fits,
    _density_mixture_fits,
    _density_file_is_given,
)
