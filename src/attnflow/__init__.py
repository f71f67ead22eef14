"""attnflow: mean-field self-attention dynamics with frozen auxiliary variables."""

import jax

# float64 is the default precision of the library (float32 is a per-run option).
jax.config.update("jax_enable_x64", True)

__version__ = "0.1.0"
