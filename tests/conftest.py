import os

import jax
import pytest
from jax._src import compilation_cache

jax.config.update("jax_enable_x64", True)
# the CLI enables JAX's persistent compilation cache: off in tests (out of the user's cache folder,
# and XLA's CPU serialisation of some programs crashes the process: a worker segfaulted writing one
# while a Dask client's threads ran); the tests of the cache turn it on in a folder of their own
os.environ["ATTNFLOW_CACHE_DIR"] = "off"


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (CI runs them)")


def pytest_collection_modifyitems(config, items):
    """A developer's default run leaves out the tests marked slow; `--slow` runs everything."""
    if config.getoption("--slow"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(autouse=True)
def _persistent_cache_stays_with_its_test():
    """A command run in-process turns JAX's persistent compilation cache on for the whole process;
    turned off again after its test, so that later tests of the same worker do not write every
    program they compile to disk (slower, and XLA's CPU serialisation of some programs crashes the
    process: a density test segfaulted in ``executable.serialize()`` after a CLI test)."""
    before = jax.config.jax_compilation_cache_dir
    yield
    if jax.config.jax_compilation_cache_dir != before:
        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()
