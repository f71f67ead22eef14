"""Configuration contract: defaults, TOML loading, overrides, errors, hash."""

import json
import math
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from attnflow.io.config import (
    Config,
    ConfigError,
    apply_overrides,
    config_from_dict,
    config_hash,
    load_config,
    resolved_dict,
)

EXAMPLE_TOML = """
[model]
n = 64
d = 3
beta = 1.0
time_scale = "plain"
profile = "exp"
normalization = "usa"
causal = false
value = "gradient"
noise = 0.0

[aux]
kind = "positions"
spacing = "index"
n_prompts = 4
assignment = "cyclic"
path = "xi.npy"

[gauge]
kind = "rope"
frequencies = "full_period"
base = 10000.0
axes = ["z", "x"]
rates = [1.0, 3.0]
omega = "full_period"
seed = 100
path = "Q.npy"

[factor]
kind = "none"
slope = 1.0
omega = 6.283185307179586
path = "W.npy"

[init]
kind = "uniform"
seed = 0
center = [0.0, 0.0, 1.0]
sigma = 0.2
rho0 = 0.1
path = "x0.npy"

[solver]
method = "rk4"
dt = 0.01
t_end = 20.0
save_every = 0.1
rtol = 1e-8
atol = 1e-10
dtype = "float64"
"""

POSITIONS = {"aux": {"kind": "positions"}}


def write(folder: Path, text: str, name: str = "run.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def error_message(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    return str(info.value)


# --- defaults and loading -----------------------------------------------------------------------


def test_defaults_match_spec():
    config = Config()
    assert resolved_dict(config) == {
        "model": {
            "n": 64,
            "d": 3,
            "beta": 1.0,
            "time_scale": "plain",
            "profile": "exp",
            "normalization": "usa",
            "causal": False,
            "value": "gradient",
            "noise": 0.0,
            "sources": 0,
            "beta_scaling": "none",
            "gamma": 1.0,
        },
        "aux": {
            "kind": "none",
            "spacing": "index",
            "n_prompts": 4,
            "assignment": "cyclic",
            "seed": 0,
            "path": None,
        },
        "gauge": {
            "kind": "none",
            "frequencies": "full_period",
            "base": 10000.0,
            "axes": ["z", "x"],
            "generators": None,
            "rates": [1.0, 3.0],
            "omega": "full_period",
            "seed": 100,
            "path": None,
        },
        "factor": {"kind": "none", "slope": 1.0, "omega": 2 * math.pi, "path": None},
        "init": {
            "kind": "uniform",
            "seed": 0,
            "center": [0.0, 0.0, 1.0],
            "sigma": 0.2,
            "rho0": 0.1,
            "path": None,
        },
        "solver": {
            "method": "rk4",
            "dt": 0.01,
            "t_end": 20.0,
            "save_every": 0.1,
            "rtol": 1e-8,
            "atol": 1e-10,
            "dtype": "float64",
            "block_size": None,
            "interaction": "exact",
            "tolerance": 1e-10,
        },
        "storage": {"token_stride": 1, "dtype": None, "snapshots": "all"},
    }


def test_an_empty_dict_gives_defaults_and_an_empty_file_is_refused(tmp_path):
    assert config_from_dict({}) == Config()
    assert load_config(write(tmp_path, "[model]\n")) == Config()  # a section alone: its defaults
    empty = r"the configuration must be at least one \[section\] .*; got 'an empty file'"
    with pytest.raises(ConfigError, match=empty):
        load_config(write(tmp_path, ""))


FILE_KINDS = [f"{section}.kind=file" for section in ("aux", "gauge", "factor", "init")]


def test_spec_example_loads_with_paths_resolved(tmp_path):
    config = load_config(write(tmp_path, EXAMPLE_TOML), FILE_KINDS)  # the kinds that read `path`
    assert config.init.center == (0.0, 0.0, 1.0)
    for section, name in [("aux", "xi"), ("gauge", "Q"), ("factor", "W"), ("init", "x0")]:
        assert getattr(config, section).path == str((tmp_path / f"{name}.npy").resolve())


def test_spec_example_as_written_is_refused_for_a_path_its_kind_does_not_read(tmp_path):
    path = write(tmp_path, EXAMPLE_TOML)  # every other key is at its default: accepted
    with pytest.raises(ConfigError, match=r"`aux\.path` must be left out when `aux\.kind` = 'positions'"):
        load_config(path)


def test_python_users_can_validate_a_dict():
    config = Config.model_validate({"model": {"n": 8}, "solver": {"method": "euler"}})
    assert (config.model.n, config.solver.method) == (8, "euler")
    assert config.model.d == 3


def test_config_is_frozen():
    config = Config()
    with pytest.raises(ValidationError):
        config.model.n = 3


def test_resolved_dict_round_trips_through_json():
    config = config_from_dict({**POSITIONS, "gauge": {"kind": "rope", "frequencies": [0.5]}})
    data = json.loads(json.dumps(resolved_dict(config)))
    assert config_from_dict(data) == config


# --- overrides ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "section", "name", "expected"),
    [
        ("model.n=128", "model", "n", 128),
        ("solver.dt=1e-3", "solver", "dt", 1e-3),
        ("model.causal=true", "model", "causal", True),
        ("init.center=[1.0, 0.0, 0.0]", "init", "center", (1.0, 0.0, 0.0)),
        ('model.profile="linear"', "model", "profile", "linear"),
        ("solver.method=euler", "solver", "method", "euler"),
        (" aux.spacing = 0.5 ", "aux", "spacing", 0.5),
        ("gauge.frequencies=[0.1]", "gauge", "frequencies", (0.1,)),
    ],
)
def test_override_sets_a_typed_value(tmp_path, override, section, name, expected):
    kinds = '[aux]\nkind = "positions"\n[gauge]\nkind = "rope"\n[init]\nkind = "cap"\n'  # they read the keys
    config = load_config(write(tmp_path, "[solver]\ndt = 0.01\n" + kinds), [override])
    value = getattr(getattr(config, section), name)
    assert value == expected
    assert type(value) is type(expected)


def test_later_override_wins_and_file_values_survive(tmp_path):
    path = write(tmp_path, '[model]\nn = 16\nprofile = "linear"\n')
    config = load_config(path, ["model.n=32", "model.n=48"])
    assert (config.model.n, config.model.profile) == (48, "linear")


def test_apply_overrides_is_pure():
    data = {"model": {"n": 16}}
    result = apply_overrides(data, ["model.n=32", "solver.method=euler"])
    assert result == {"model": {"n": 32}, "solver": {"method": "euler"}}
    assert data == {"model": {"n": 16}}


def test_override_of_a_multiline_value_stays_one_string():
    # A value that would smuggle in a second TOML key is taken as a bare string.
    result = apply_overrides({}, ["solver.method=1\nother = 2"])
    assert result == {"solver": {"method": "1\nother = 2"}}


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("solver.method", r"^--set: `solver\.method` must be given as section\.key=value; got "),
        ("method=rk4", r"^--set: `method` must be a dotted key section\.key; got 'method'"),
        ("solver.method.x=1", r"`solver\.method\.x` must be a dotted key"),
        ("solvr.dt=0.1", r"`solvr` must be one of the sections; got 'solvr'\. .*'solver'\?"),
        ("solver.methd=rk4", r"`solver\.methd` must be one of the keys of \[solver\]; got 'methd'"),
    ],
)
def test_bad_override_raises(override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        apply_overrides({}, [override])


def test_unknown_override_key_lists_allowed_keys():
    with pytest.raises(ConfigError, match=r"Unknown key; did you mean 'method'\? Allowed keys: "):
        apply_overrides({}, ["solver.methd=rk4"])


def test_override_value_error_names_set_key_and_value(tmp_path):
    path = write(tmp_path, "[model]\n")
    with pytest.raises(ConfigError, match=r"^--set: `model\.n` .* got 1\.$"):  # the value came from --set
        load_config(path, ["model.n=1"])
    path = write(tmp_path, "[model]\nn = 1\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: `model\.n` .* got 1\.$"):
        load_config(path, ["model.d=3"])


# --- field errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({"model": {"n": 1}}, r"`model\.n` must be an integer >= 2; got 1\."),
        ({"model": {"d": 2.5}}, r"`model\.d` must be an integer >= 2; got 2\.5\."),
        ({"model": {"beta": 0}}, r"`model\.beta` must be a number > 0; got 0\."),
        ({"model": {"beta": math.inf}}, r"`model\.beta` must be a number > 0; got inf\. .*Infin"),
        ({"model": {"noise": -1.0}}, r"`model\.noise` must be a number >= 0; got -1\.0\."),
        ({"model": {"causal": "maybe"}}, r"`model\.causal` must be true, false or 'strict'; got 'maybe'\."),
        ({"model": {"normalization": "softmax"}}, r"`model\.normalization` must be one of "),
        ({"aux": {"spacing": -0.5}}, r"`aux\.spacing` must be 'index', 'unit', 'midpoint' or a "),
        ({"aux": {"n_prompts": 0}}, r"`aux\.n_prompts` must be an integer >= 1; got 0\."),
        ({"aux": {"path": ""}}, r"`aux\.path` must be a file path \(a non-empty string\); got ''"),
        ({"gauge": {"axes": ["z", "w"]}}, r"`gauge\.axes` must be .*'x', 'y' or 'z'; got \['z', "),
        ({"gauge": {"frequencies": []}}, r"`gauge\.frequencies` must be .* non-empty list .*\[\]"),
        ({"gauge": {"base": -1.0}}, r"`gauge\.base` must be a number > 0; got -1\.0\."),
        ({"gauge": {"seed": -1}}, r"`gauge\.seed` must be an integer in \[0, 2\*\*63 - 1\]; got -1\."),
        (
            {"gauge": {"seed": 2**64}},
            r"`gauge\.seed` must be an integer in \[0, 2\*\*63 - 1\]; got 18446744073709551616\.",
        ),
        (
            {"aux": {"seed": 2**63}},
            r"`aux\.seed` must be an integer in \[0, 2\*\*63 - 1\]; got 9223372036854775808\.",
        ),
        (
            {"init": {"seed": 2**63}},
            r"`init\.seed` must be an integer in \[0, 2\*\*63 - 1\]; got 9223372036854775808\.",
        ),
        ({"factor": {"slope": -2.0}}, r"`factor\.slope` must be a number >= 0; got -2\.0\."),
        ({"init": {"center": [0, 0, 0]}}, r"`init\.center` must be a nonzero .*; got \[0, 0, 0\]"),
        ({"init": {"sigma": 0.0}}, r"`init\.sigma` must be a number > 0; got 0\.0\."),
        ({"solver": {"dt": -0.1}}, r"`solver\.dt` must be a number > 0; got -0\.1\."),
        ({"solver": {"dtype": "float16"}}, r"`solver\.dtype` must be one of .*'float16'"),
        ({"solver": {"block_size": 0}}, r"`solver\.block_size` must be an integer >= 1; got 0\."),
        ({"solver": 3}, r"`solver` must be a table \(\[solver\] section\); got 3\."),
    ],
)
def test_field_errors_name_key_constraint_and_value(data, pattern):
    with pytest.raises(ConfigError, match=rf"^config: {pattern}"):
        config_from_dict(data)


def test_misspelt_choice_gets_a_hint():
    message = error_message({"solver": {"method": "rk5"}})
    assert message == (
        "config: `solver.method` must be one of 'euler', 'rk4', 'geodesic_rk4', 'adaptive'; "
        "got 'rk5'. Did you mean 'rk4'?"
    )


def test_hint_ignores_case_and_works_in_unions():
    assert "Did you mean 'index'?" in error_message({"aux": {"spacing": "Indx"}})


def test_unknown_key_and_section_list_what_is_allowed():
    message = error_message({"solver": {"methd": "rk4"}})
    assert message.startswith("config: `solver.methd` must be one of the keys of [solver]; ")
    assert "got 'methd'. Unknown key; did you mean 'method'? Allowed keys: method, dt," in message
    message = error_message({"solvr": {}})
    assert "`solvr` must be one of the sections; got 'solvr'" in message
    sections = "model, aux, gauge, factor, init, solver, storage, attention, density"
    assert f"Allowed sections: {sections}." in message


@pytest.mark.parametrize(
    ("generators", "pattern"),
    [
        ([[[0.0, 1.0, 0.0], [1.0, 0.0]]], r"must be a list of square matrices, all of one size"),
        ([[[0.0, 1.0], [1.0, 0.0]]], r"must be skew-symmetric .*generator 0 is off by 2\)"),
        ([[[0.0, 1.0], [-1.0, 1e-9]]], r"must be skew-symmetric .*off by 2e-09"),
    ],
)
def test_generators_must_be_square_and_skew(generators, pattern):
    with pytest.raises(ConfigError, match=rf"`gauge\.generators` {pattern}.*; got \[\[\["):
        config_from_dict({"gauge": {"generators": generators}})


def test_every_message_is_one_line_and_pickles():
    data = {"model": {"normalization": "sa"}, "factor": {"kind": "toeplitz_cos"}, **POSITIONS}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, where="sweep.toml")
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("sweep.toml: `factor.kind` must be ")
    copy = pickle.loads(pickle.dumps(info.value))
    assert (str(copy), copy.key, copy.where) == (str(info.value), "factor.kind", "sweep.toml")


# --- cross-field rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (
            {"init": {"kind": "cap", "center": [0.0, 1.0]}},
            r"`init\.center` must be a list of `model\.d` = 3 numbers .*; got \[0\.0, 1\.0\]\.",
        ),
        (
            {"solver": {"save_every": 0.015}},
            r"`solver\.save_every` must be a whole multiple of `solver\.dt` = 0\.01; "
            r"got 0\.015\. Try save_every = 0\.02",
        ),
        (
            {"solver": {"dt": 0.2}},
            r"`solver\.save_every` must be a whole multiple of `solver\.dt` = 0\.2; got 0\.1\.",
        ),
        (
            {"model": {"noise": 0.1}, "solver": {"method": "adaptive"}},
            r"`solver\.method` must be 'euler', 'rk4' or 'geodesic_rk4' when `model\.noise` > 0 \(the noise "
            r"is drawn per step\); got 'adaptive'\.$",
        ),
        (  # the hint is a save_every that t_end is a multiple of too (0.02 would not be)
            {"solver": {"save_every": 0.015, "t_end": 0.05}},
            r"`solver\.save_every` must be a whole multiple of `solver\.dt` = 0\.01; got 0\.015\. "
            r"Try save_every = 0\.01, or change solver\.dt\.$",
        ),
        (  # t_end off the step grid: no save_every alone would do
            {"solver": {"dt": 0.5, "save_every": 0.1, "t_end": 0.2}},
            r"`solver\.save_every` must be a whole multiple of `solver\.dt` = 0\.5; got 0\.1\. "
            r"Try save_every = 0\.5 and t_end = 0\.5, or change solver\.dt\.$",
        ),
        (
            {"solver": {"t_end": 20.05}},
            r"`solver\.t_end` must be a whole multiple of `solver\.save_every` = 0\.1; got 20\.05\.",
        ),
        (
            {"solver": {"method": "adaptive", "t_end": 1.05}},
            r"`solver\.t_end` must be a whole multiple .*; got 1\.05\.",
        ),
        (
            {"model": {"normalization": "sa"}, "factor": {"kind": "toeplitz_cos"}, **POSITIONS},
            r"`factor\.kind` must be a non-negative factor .*'sa'; got 'toeplitz_cos'\. "
            r"Softmax .*changes sign",
        ),
        (
            {"gauge": {"kind": "prompt"}, **POSITIONS},
            r"`aux\.kind` must be 'prompts' when `gauge\.kind` = 'prompt'; got 'positions'\.",
        ),
        (
            {"gauge": {"kind": "rope"}, "aux": {"kind": "none"}},  # written: kept (left out: positions)
            r"`aux\.kind` must be 'positions' or 'file' when `gauge\.kind` = 'rope'; got 'none'",
        ),
        (
            {"gauge": {"kind": "generalized_rope"}, "aux": {"kind": "prompts"}},
            r"`aux\.kind` must be .* `gauge\.kind` = 'generalized_rope'; got 'prompts'",
        ),
        (
            {"factor": {"kind": "distance_bias"}, "aux": {"kind": "none"}},
            r"`aux\.kind` must be .* `factor\.kind` = 'distance_bias'; got 'none'",
        ),
        (
            {"aux": {"kind": "positions", "spacing": 1e308}, "model": {"n": 8}},
            r"`aux\.spacing` must be small enough that the last position \(n - 1\)·spacing is finite "
            r"\(n = 8\); got 1e\+308\.",
        ),
        (
            {"factor": {"kind": "toeplitz_cos"}, "aux": {"kind": "none"}},
            r"`aux\.kind` must be .* `factor\.kind` = 'toeplitz_cos'; got 'none'",
        ),
        (
            {"gauge": {"kind": "generalized_rope"}, "model": {"d": 4}, **POSITIONS},
            r"`gauge\.axes` must be replaced by `gauge\.generators` .*`model\.d` = 4; "
            r"got \['z', 'x'\]",
        ),
        (
            {"gauge": {"kind": "generalized_rope", "rates": [1.0]}, **POSITIONS},
            r"`gauge\.rates` must be a list of 2 numbers, one per axis .*; got \[1\.0\]\.",
        ),
        (
            {
                "gauge": {"kind": "generalized_rope", "generators": [[[0, 1], [-1, 0]]]},
                "model": {"d": 2},
                **POSITIONS,
            },
            r"`gauge\.rates` must be a list of 1 number, one per matrix .*; got \[1\.0, 3\.0\]",
        ),
        (
            {"gauge": {"kind": "generalized_rope", "generators": [[[0, 1], [-1, 0]]]}, **POSITIONS},
            r"`gauge\.generators` must be 3 x 3 matrices to match `model\.d` = 3; "
            r"got \[\[\[0\.0, 1\.0\], \[-1\.0, 0\.0\]\]\]",
        ),
        (
            {"gauge": {"kind": "rope", "frequencies": [1.0, 2.0]}, **POSITIONS},
            r"`gauge\.frequencies` must be at most `model\.d` // 2 = 1 \(one frequency per coordinate "
            r"pair\); got \[1\.0, 2\.0\]\. Drop the extra frequencies or raise model\.d\.",
        ),
        (
            {"init": {"kind": "equiangular", "rho0": -0.5}, "model": {"n": 3, "d": 3}},
            r"`init\.rho0` must be in \(-1/\(n-1\), 1\) = \(-0\.5, 1\) .*; got -0\.5\.",
        ),
        (
            {"init": {"kind": "equiangular", "rho0": 1.0}, "model": {"n": 3, "d": 3}},
            r"`init\.rho0` must be in .*; got 1\.0\.",
        ),
        (
            {"init": {"kind": "equiangular"}},
            r"`init\.kind` must be 'uniform', 'cap' or 'file' when `model\.d` = 3 < "
            r"`model\.n` = 64; got 'equiangular'\. .*needs d >= n; use init\.kind = 'uniform'",
        ),
        *[
            (
                {section: {"kind": "file"}},
                rf"`{section}\.path` must be a file path when `{section}\.kind` = 'file'; "
                r"got no value\.",
            )
            for section in ("aux", "gauge", "factor", "init")
        ],
    ],
)
def test_cross_field_rules(data, pattern):
    with pytest.raises(ConfigError, match=rf"^config: {pattern}"):
        config_from_dict(data)


@pytest.mark.parametrize(
    "data",
    [
        {"init": {"kind": "cap", "center": [0.0, 1.0, 0.0, 0.0]}, "model": {"d": 4}},
        {"init": {"kind": "equiangular", "rho0": -0.2}, "model": {"n": 5, "d": 5}},
        {"solver": {"dt": 0.1, "save_every": 0.3, "t_end": 0.9}},
        {"solver": {"method": "adaptive", "dt": 0.7}},
        {"model": {"normalization": "sa"}, "factor": {"kind": "distance_bias"}, **POSITIONS},
        {"gauge": {"kind": "prompt"}, "aux": {"kind": "prompts"}},
        {"gauge": {"kind": "rope"}, "aux": {"kind": "file", "path": "/xi.npy"}},
        {"gauge": {"kind": "rope", "frequencies": [1.0, 0.5]}, "model": {"d": 5}, **POSITIONS},
        {"gauge": {"kind": "generalized_rope"}, **POSITIONS},
        {
            "gauge": {"kind": "generalized_rope", "generators": [[[0, 2], [-2, 0]]], "rates": [1]},
            "model": {"d": 2},
            **POSITIONS,
        },
        # Options of an unselected kind are not cross-checked (they would break sweeps over d).
        {"model": {"d": 4}, "gauge": {"frequencies": [1.0, 2.0, 3.0]}},
        {"model": {"n": 3}, "init": {"rho0": -0.9}},
    ],
)
def test_valid_combinations_pass(data):
    config_from_dict(data)


# --- files and paths ------------------------------------------------------------------------------


def test_invalid_toml_error_names_the_file(tmp_path):
    path = write(tmp_path, "[model]\nn = = 3\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: .* must be valid TOML; got"):
        load_config(path)


def test_missing_file_error_names_the_file(tmp_path):
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: .* readable TOML file"):
        load_config(path)


def test_errors_from_a_file_name_the_file(tmp_path):
    path = write(tmp_path, '[solver]\nmethod = "rk5"\n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: `solver\.method` .*'rk5'"):
        load_config(path)


def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    path = write(tmp_path / "configs", '[init]\nkind = "file"\npath = "../data/x0.npy"\n')
    monkeypatch.chdir(tmp_path / "configs")
    config = load_config(Path("run.toml"))
    assert config.init.path == str((tmp_path / "data" / "x0.npy").resolve())
    assert load_config(path, ["init.path=/abs/x0.npy"]).init.path == str(Path("/abs/x0.npy"))


def test_override_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    path = write(tmp_path / "configs", '[aux]\nkind = "file"\n')
    monkeypatch.chdir(tmp_path)
    config = load_config(path, ["aux.path=xi.npy"])
    assert config.aux.path == str((tmp_path / "xi.npy").resolve())


# --- hash -----------------------------------------------------------------------------------------


def test_hash_is_12_hex_digits_and_ignores_how_values_were_written(tmp_path):
    digest = config_hash(Config())
    assert re.fullmatch(r"[0-9a-f]{12}", digest)
    assert config_hash(config_from_dict({"model": {"n": 64, "beta": 1}})) == digest
    assert config_hash(load_config(write(tmp_path, "[solver]\ndt = 1e-2\n"))) == digest


def test_hash_changes_when_a_value_changes():
    digests = {
        config_hash(config_from_dict(data))
        for data in [{}, {"model": {"n": 65}}, {"model": {"beta": 1.5}}, {"solver": {"dt": 0.02}}]
    }
    assert len(digests) == 4


def test_hash_is_stable_across_processes():
    code = "from attnflow.io.config import Config, config_hash; print(config_hash(Config()))"
    # A fresh interpreter with a different string-hash seed must agree.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert output.stdout.strip() == config_hash(Config())


def test_config_error_also_takes_a_finished_message():
    error = ConfigError("run: `--out` must be a new or empty folder; got 'x'.")
    assert isinstance(error, ValueError)
    assert error.at("run.toml") is error
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


@pytest.mark.parametrize(
    ("section", "name", "value", "constraint"),
    [
        ("model", "n", "64", "an integer >= 2"),
        ("model", "n", 64.0, "an integer >= 2"),
        ("model", "causal", "yes", "true, false or 'strict'"),
        ("model", "causal", 1, "true, false or 'strict'"),
        ("model", "beta", True, "a number > 0"),
        ("model", "beta", "1.0", "a number > 0"),
        ("aux", "n_prompts", "4", "an integer >= 1"),
        ("init", "seed", "3", r"an integer in \[0, 2\*\*63 - 1\]"),
        ("solver", "block_size", "8", "an integer >= 1"),
        ("model", "d", 3.0, "an integer >= 2"),
        ("gauge", "omega", "1", "'full_period' or a number"),
        ("init", "path", 3, r"a file path \(a non-empty string\)"),
    ],
)
def test_types_are_strict(section, name, value, constraint):
    """No coercion from strings or between bool and numbers: one line naming key, constraint, value."""
    shown = "true" if value is True else repr(value)  # as TOML writes it
    with pytest.raises(
        ConfigError,
        match=rf"^config: `{section}\.{name}` must be {constraint}; got {re.escape(shown)}\.$",
    ):
        config_from_dict({section: {name: value}})


def test_strict_types_still_take_toml_ints_for_numbers_and_strings_for_paths(tmp_path):
    (tmp_path / "x0.npy").write_bytes(b"")
    path = tmp_path / "c.toml"
    path.write_text(
        '[model]\nd = 5\nbeta = 2\nnoise = 0\n[aux]\nkind = "positions"\n'
        '[gauge]\nkind = "rope"\nfrequencies = [1, 2.5]\n[init]\nkind = "file"\npath = "x0.npy"\n'
    )
    config = load_config(path)
    assert config.model.beta == 2.0 and isinstance(config.model.beta, float | int)
    assert config.gauge.frequencies == (1.0, 2.5)
    assert Path(config.init.path).name == "x0.npy"
    with pytest.raises(ConfigError, match=r"`model\.causal` must be true, false or 'strict'; got 'yes'\."):
        load_config(path, ["model.causal=yes"])
    with pytest.raises(ConfigError, match=r"`model\.n` must be an integer >= 2; got '64'\."):
        load_config(path, ['model.n="64"'])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"solver": {"interaction": "fast"}},
            "`solver.interaction` must be one of 'auto', 'exact', 'expansion'; got 'fast'.",
        ),
        ({"solver": {"tolerance": 2.0}}, "`solver.tolerance` must be a number > 0 and < 1; got 2.0."),
        (
            {"storage": {"snapshots": "some"}},
            "`storage.snapshots` must be one of 'all', 'final'; got 'some'.",
        ),
        ({"storage": {"token_stride": 0}}, "`storage.token_stride` must be an integer >= 1; got 0."),
    ],
)
def test_a_key_s_meaning_is_not_rendered_as_its_constraint(data, message):
    """Fields whose description says what they mean get their constraint from their type."""
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data)
    assert str(caught.value) == f"config: {message}"


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("model", "beta", float("nan")),
        ("gauge", "frequencies", [float("inf")]),
        ("init", "center", [float("nan"), 0.0, 1.0]),
    ],
)
def test_a_non_finite_value_is_named_as_such(section, key, value):
    # also under a union of choices (gauge.frequencies: 'roformer', 'full_period' or numbers)
    data = {section: {key: value}} | ({"gauge": {"kind": "rope", key: value}} if section == "gauge" else {})
    with pytest.raises(
        ConfigError, match=rf"`{section}\.{key}` must be .*\. Infinite and NaN values are not allowed\.$"
    ):
        config_from_dict(data)
