import os
import tempfile

import jax

jax.config.update("jax_enable_x64", True)
# the CLI enables JAX's persistent compilation cache: tests keep it out of the user's cache folder
os.environ.setdefault("ATTNFLOW_CACHE_DIR", tempfile.mkdtemp(prefix="attnflow-test-cache-"))


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
