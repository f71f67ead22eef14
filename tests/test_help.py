"""``import attnflow`` and ``--help`` load no JAX (the public names load on first use), JAX still
runs float64 by default on every path into it, and the help reads CONFIG, SECTION.KEY=VALUE, DIR
rather than typer's ``{CONFIG}``/``<list[str]>``/``<bool>`` placeholders, and a command that takes a
config lists the config's sections and keys."""

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import attnflow
from attnflow.cli import app
from attnflow.io.config_schema import SECTIONS

COMMANDS = ("run", "plot", "animate", "reproduce", "realize", "sweep", "phase", "landscape")


def python(code: str) -> str:
    """stdout of ``code`` in a fresh interpreter, without a JAX_ENABLE_X64 of this environment."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_command_line_imports_no_jax():
    assert python("import attnflow.cli, sys; print('jax' in sys.modules)") == "False\n"


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["reproduce", "--help"]])
def test_help_through_the_console_entry_imports_no_jax(args):
    code = ("import atexit, sys; atexit.register(lambda: print('jax' in sys.modules)); "
            f"sys.argv[1:] = {args!r}; from attnflow_entry import main; main()")  # fmt: skip
    *help_lines, jax_loaded = python(code).splitlines()
    assert jax_loaded == "False"
    text = "\n".join(help_lines)
    assert "Usage:" in text
    if args == ["--help"]:  # every command is listed
        assert all(f" {command} " in text for command in COMMANDS), text


@pytest.mark.slow
@pytest.mark.parametrize(
    "code",
    [
        "import attnflow; import jax.numpy as jnp; print(jnp.zeros(1).dtype)",  # jax after the package
        "import jax.numpy as jnp; import attnflow; print(jnp.zeros(1).dtype)",  # jax before it
        "from attnflow.analysis import metrics; import jax.numpy as jnp; print(jnp.zeros(1).dtype)",
        "import attnflow; print(attnflow.make_profile(beta=0.5).beta.dtype)",  # a public name, loaded lazily
    ],
)
def test_every_path_into_jax_runs_float64(code):
    assert python(code).splitlines()[-1] == "float64"


def test_public_names_load_on_first_use():
    assert python("import attnflow, sys; print('jax' in sys.modules)") == "False\n"
    assert python("import attnflow, sys; attnflow.Trajectory; print('jax' in sys.modules)") == "True\n"
    assert set(attnflow.__all__) <= set(dir(attnflow))
    namespace: dict = {}
    exec("from attnflow import *", namespace)  # noqa: S102 - the star import resolves every name
    assert set(attnflow.__all__) <= set(namespace)
    assert attnflow.solve is attnflow.numerics.solve.solve
    with pytest.raises(AttributeError, match="module 'attnflow' has no attribute 'sovle'"):
        attnflow.sovle  # noqa: B018


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_its_values_readably(command):
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "<list[str]>" not in text and "<str>" not in text and "<bool>" not in text
    assert "SPEC" not in text and "shared/" not in text  # the help stands alone
    assert "{" not in text.split("Usage:")[1].splitlines()[0]  # the usage line names CONFIG, RUN_DIR plainly
    if command in ("run", "sweep", "landscape"):
        assert "--set" in text and "SECTION.KEY=VALUE" in text
        assert f"Usage: attnflow {command} [OPTIONS] CONFIG" in text
        for section, model in SECTIONS.items():  # every key of the schema, by section
            assert f"{section}: {', '.join(model.model_fields)}" in " ".join(text.split()), section
