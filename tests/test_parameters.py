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


def test_a_library_rule_is_checked_on_config_values_under_config_keys():
    """One rule of core.constraints, as the library says it and as a config says it."""
    from attnflow.core.constraints import FREQUENCIES, SAVE_EVERY, T_END
    from attnflow.io.parameters import check_rule

    library = r"^solve: `save_every` must be a whole multiple of `dt` = 0\.1; got 0\.25\.$"
    with pytest.raises(ValueError, match=library):
        SAVE_EVERY.check(0.25, where="solve", dt=0.1)
    config = r"^config: `solver\.save_every` must be a whole multiple of `solver\.dt` = 0\.1; got 0\.25\. Try"
    with pytest.raises(ConfigError, match=config) as info:
        check_rule(SAVE_EVERY, 0.25, dt=0.1, hint="Try 0.3.")
    assert (info.value.key, info.value.value) == ("solver.save_every", 0.25)
    check_rule(SAVE_EVERY, 0.3, dt=0.1)  # 0.3 / 0.1 = 2.9999999999999996: whole to 1e-9
    heads = r"`gauge\.frequencies` must be at most `attention\.head_dim` // 2 = 1 "
    with pytest.raises(ConfigError, match=heads):
        check_rule(FREQUENCIES, [1.0, 2.0], d=3, keys={"d": "attention.head_dim"})
    with pytest.raises(ConfigError, match=r"`solver\.t_end` must be a whole multiple"):  # a ratio of inf
        check_rule(T_END, 1e300, save_every=1e-300)
