"""attnflow: mean-field self-attention dynamics with frozen auxiliary variables.

Importing the package enables float64 in JAX (the library's default precision; float32 is a
per-run option). Call ``attnflow.use_cpu_cores()`` before the first computation to run large
tiled evaluations on every CPU core (``attnflow.numerics.lanes``; the results are the same
either way). The names below are the main public objects; the layers hold the functions:
``attnflow.core`` (the mathematics), ``attnflow.numerics`` (how it is computed),
``attnflow.analysis`` (diagnostics and theory), ``attnflow.io`` (config, storage),
``attnflow.viz`` (figures), ``attnflow.workflows`` (the commands' bodies). Plotting is not imported here.
"""

import jax

jax.config.update("jax_enable_x64", True)

from attnflow.core.kernel import Kernel, Profile, make_profile  # noqa: E402
from attnflow.io.config import Config, ConfigError, config_from_dict, load_config  # noqa: E402
from attnflow.io.version import __version__  # noqa: E402
from attnflow.numerics.dynamics import make_vector_field  # noqa: E402
from attnflow.numerics.integrators import RK4, Adaptive, Euler, GeodesicRK4, make_integrator  # noqa: E402
from attnflow.numerics.lanes import use_cpu_cores  # noqa: E402
from attnflow.numerics.saving import SaveAt  # noqa: E402
from attnflow.numerics.solve import Trajectory, solve, solve_streaming  # noqa: E402
from attnflow.numerics.status import Status  # noqa: E402
from attnflow.numerics.steps import AdaptiveSteps, ConstantSteps  # noqa: E402
from attnflow.numerics.summation import energy  # noqa: E402
from attnflow.workflows.build import Simulation  # noqa: E402

__all__ = [
    "RK4",
    "Adaptive",
    "AdaptiveSteps",
    "Config",
    "ConfigError",
    "ConstantSteps",
    "Euler",
    "GeodesicRK4",
    "Kernel",
    "Profile",
    "SaveAt",
    "Simulation",
    "Status",
    "Trajectory",
    "__version__",
    "config_from_dict",
    "energy",
    "load_config",
    "make_integrator",
    "make_profile",
    "make_vector_field",
    "solve",
    "solve_streaming",
    "use_cpu_cores",
]
