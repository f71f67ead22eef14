import os
import signal

import jax
import pytest
from jax._src import compilation_cache

import compile_report

jax.config.update("jax_enable_x64", True)
# the CLI enables JAX's persistent compilation cache: off in tests (out of the user's cache folder,
# and XLA's CPU serialisation of some programs crashes the process: a worker segfaulted writing one
# while a Dask client's threads ran); the tests of the cache turn it on in a folder of their own
os.environ["ATTNFLOW_CACHE_DIR"] = "off"


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", help="also run the tests marked slow (CI runs them)")
    parser.addoption(
        "--compile-report",
        type=int,
        default=0,
        metavar="N",
        help="after the run: the share of test time spent compiling, and the N tests that compiled longest",
    )


def pytest_configure(config):
    compile_report.register(config)


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


@pytest.fixture(autouse=True)
def _signal_mask_stays_as_it_was():
    """No test leaves this thread's signal mask changed: a mask survives ``exec``, so a SIGINT left
    blocked here would reach no process a later test starts (a Ctrl-C test then waits in vain, as
    one clean-clone run did). A test that changes it fails here, naming what it left blocked."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    after = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if after != before:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        pytest.fail(f"the test left the signal mask {sorted(after)}; it found {sorted(before)}")
