"""One table from the library's parameters to the config keys (attnflow.io.parameters)."""

import pytest

from attnflow.io.config import ConfigError
from attnflow.io.parameters import CONFIG_KEYS, as_config_error, library_errors


def test_a_library_error_names_the_config_key_of_its_parameter():
    error = as_config_error(ValueError("rope: `frequencies` must have at most d//2 = 1 entries; got 2."))
    assert isinstance(error, ConfigError)
    assert str(error) == "config: `gauge.frequencies` must have at most d//2 = 1 entries; got 2."


def test_context_unknown_names_and_config_errors_pass_through():
    assert (
        str(as_config_error(ValueError("x: `zeta` must be 1; got 2.")))
        == "config: x: `zeta` must be 1; got 2."
    )
    line = "expansion: `d` must be small enough; got 40."
    assert str(as_config_error(ValueError(line), context="`solver.interaction` = 'expansion'")) == (
        f"config: `solver.interaction` = 'expansion': {line}"
    )
    original = ConfigError("run.toml: `model.n` must be an integer >= 2; got 1.")
    assert as_config_error(original) is original
    with pytest.raises(ConfigError, match=r"^config: `solver\.dt` must be > 0; got 0\.$"):
        with library_errors():
            raise ValueError("solve: `dt` must be > 0; got 0.")


def test_every_config_key_of_the_table_exists():
    from attnflow.io.config_schema import SECTIONS

    for key in CONFIG_KEYS.values():
        section, name = key.split(".")
        assert name in SECTIONS[section].model_fields, key
