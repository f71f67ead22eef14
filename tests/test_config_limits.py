"""Bounded configuration inputs (io/config_limits) and keys the chosen kind ignores (io/config_unused)."""

import os
import re
import threading
import time
from pathlib import Path

import pytest

from attnflow.io import config_limits
from attnflow.io.config import ConfigError, apply_overrides, config_from_dict, load_config
from attnflow.io.config_rules import MAX_STEPS
from attnflow.io.config_unused import IGNORED
from configs import small_config, toml_text


def write(folder: Path, text: str, name: str = "run.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def refused(path: Path, pattern: str, overrides=()) -> ConfigError:
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(path, overrides)
    assert "\n" not in str(info.value)
    return info.value


# --- the file -------------------------------------------------------------------------------------


def test_a_fifo_is_refused_at_once_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    done = []
    worker = threading.Thread(target=lambda: done.append(_error_of(fifo)), daemon=True)
    worker.start()
    worker.join(timeout=5)  # blocking on open() would hang here for ever
    assert done, "load_config blocked on a FIFO"
    assert done[0] == f"{fifo}: the configuration must be a regular TOML file; got 'a FIFO (named pipe)'."


def _error_of(path: Path) -> str:
    try:
        load_config(path)
    except ConfigError as error:
        return str(error)
    return "accepted"


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device")]
)
def test_a_device_is_refused_before_a_byte_is_read(path, kind):
    start = time.perf_counter()
    refused(
        Path(path), rf"^{re.escape(path)}: the configuration must be a regular TOML file; got '{kind}'\.$"
    )
    assert time.perf_counter() - start < 1.0  # nothing read (/dev/zero never ends)


def test_a_folder_is_refused(tmp_path):
    refused(tmp_path, r"must be a regular TOML file; got 'a folder'\.$")


def test_a_file_over_the_size_cap_is_refused_after_reading_one_byte_past_it(tmp_path, monkeypatch):
    monkeypatch.setattr(config_limits, "MAX_FILE_BYTES", 1024)  # the cap (16 MiB) scaled down
    big = write(tmp_path, "[model]\n" + "# padding\n" * 200)
    refused(big, r"must be a file of at most 0 MiB; got 'more than 1024 bytes'\.$")
    at_cap = write(tmp_path, "[model]\nn = 8\n".ljust(1024, "#"), "cap.toml")
    assert load_config(at_cap).model.n == 8


def test_the_size_cap_is_16_mib():
    assert config_limits.MAX_FILE_BYTES == 16 * 2**20


@pytest.mark.parametrize(
    ("text", "got"), [("", "an empty file"), ("  \n", "an empty file"), ("# x\n", "no settings")]
)
def test_an_empty_file_is_refused(tmp_path, text, got):
    refused(write(tmp_path, text), rf"the configuration must be at least one \[section\] .*; got '{got}'\.")


def test_a_symlink_to_a_config_file_is_read(tmp_path):
    target = write(tmp_path, "[model]\nn = 8\n")
    link = tmp_path / "link.toml"
    link.symlink_to(target)
    assert load_config(link).model.n == 8


# --- nesting --------------------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [15, 200, 5000])  # 15 + file + section = 17; 5000 overflows the parser
def test_deep_nesting_in_a_file_is_refused(tmp_path, levels):
    path = write(tmp_path, "[model]\nn = " + "[" * levels + "]" * levels + "\n")
    refused(
        path, rf"^{re.escape(str(path))}: the configuration must be nested at most 16 tables or arrays deep"
    )


def test_deep_inline_tables_are_refused(tmp_path):
    path = write(tmp_path, "[model]\nn = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n")
    refused(path, r"nested at most 16 tables or arrays deep")


def test_deep_dotted_keys_are_refused(tmp_path):
    path = write(tmp_path, "[model]\n" + ".".join(["a"] * 40) + " = 1\n")  # tables, no recursion
    refused(path, r"nested at most 16 tables or arrays deep")


def test_the_deepest_valid_value_is_accepted(tmp_path):
    generators = [[[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]  # depth 5 with file and section
    data = {"aux": {"kind": "positions"}, "gauge": {"kind": "generalized_rope", "generators": generators}}
    data["gauge"]["rates"] = [1.0]
    assert load_config(write(tmp_path, toml_text(data))).gauge.generators is not None


@pytest.mark.parametrize("levels", [20, 5000])
def test_deep_nesting_in_an_override_is_refused(levels):
    override = "model.n=" + "[" * levels + "]" * levels
    with pytest.raises(
        ConfigError, match=r"^--set: `model\.n` must be nested at most 16 tables or arrays deep"
    ):
        apply_overrides({}, [override])


def test_deep_nesting_in_a_dict_is_refused():
    value: list = []
    for _ in range(50):
        value = [value]
    with pytest.raises(ConfigError, match=r"^config: the configuration must be nested at most 16"):
        config_from_dict({"model": {"n": value}})


def test_an_override_longer_than_the_cap_is_refused():
    with pytest.raises(
        ConfigError, match=r"^--set: the configuration must be given in at most 65536 characters"
    ):
        apply_overrides({}, ["model.n=" + "1" * 70_000])


# --- integers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "name"),
    [
        ("solver", "block_size"),
        ("storage", "token_stride"),
        ("model", "n"),
        ("model", "d"),
        ("aux", "n_prompts"),
    ],
)
@pytest.mark.parametrize("value", [2**63, 2**64, 10**30])
def test_an_integer_beyond_int64_is_refused(tmp_path, section, name, value):
    path = write(tmp_path, toml_text({section: {name: value}}))
    refused(
        path,
        rf"`{section}\.{name}` must be an integer at most 2\*\*63 - 1 \(a signed 64-bit integer, what the "
        rf"arrays hold\); got {value}\.$",
    )


def test_the_largest_int64_passes_the_integer_check():
    config = config_from_dict({"solver": {"block_size": 2**63 - 1}, "storage": {"token_stride": 2**63 - 1}})
    assert (config.solver.block_size, config.storage.token_stride) == (2**63 - 1, 2**63 - 1)


def test_a_seed_keeps_its_own_bound_in_the_message():
    with pytest.raises(ConfigError, match=r"`init\.seed` must be an integer in \[0, 2\*\*63 - 1\]; got"):
        config_from_dict({"init": {"seed": 2**64}})


def test_a_large_integer_for_a_number_key_is_a_number():
    assert config_from_dict({"model": {"beta": 2**64}}).model.beta == float(2**64)  # a float, not an index


# --- adaptive runs --------------------------------------------------------------------------------


def test_an_adaptive_run_of_too_many_snapshots_is_refused_naming_save_every():
    data = small_config({"solver": {"method": "adaptive", "t_end": 1e12, "save_every": 0.5}})
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert str(info.value) == (
        "config: `solver.save_every` must be at least `solver.t_end` / 1e+08 = 1e+04 for method 'adaptive' "
        "(at most 1e+08 snapshots, each at least one step); got 0.5. That is 2e+12 snapshots "
        "(`solver.t_end` = 1000000000000.0); raise solver.save_every or lower solver.t_end."
    )


def test_an_adaptive_run_at_the_snapshot_bound_is_accepted():
    t_end = MAX_STEPS * 0.5
    data = small_config({"solver": {"method": "adaptive", "t_end": t_end, "save_every": 0.5}})
    assert config_from_dict(data).solver.t_end == t_end


# --- keys the chosen kind ignores -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (
            {"factor": {"kind": "none", "path": "w.npy"}},
            "`factor.path` must be left out when `factor.kind` = 'none' (which does not read it); got "
            "'{folder}/w.npy'. Remove it; it is read when `factor.kind` is 'file'.",
        ),
        (
            {"aux": {"kind": "positions"}, "gauge": {"kind": "rope", "omega": 1.0}},
            "`gauge.omega` must be left out when `gauge.kind` = 'rope' (which does not read it); got 1.0. "
            "Remove it; it is read when `gauge.kind` is 'generalized_rope'.",
        ),
        (
            {"solver": {"method": "rk4", "atol": 1e-6}},
            "`solver.atol` must be left out when `solver.method` = 'rk4' (which does not read it); got "
            "1e-06. Remove it; it is read when `solver.method` is 'adaptive'.",
        ),
        (
            {"aux": {"kind": "positions"}, "gauge": {"kind": "rope", "base": 500.0}},
            "`gauge.base` must be left out when `gauge.frequencies` = 'full_period' (which does not read "
            "it); got 500.0. Remove it; it is read when `gauge.frequencies` is 'roformer'.",
        ),
        (
            {"solver": {"tolerance": 1e-6}},
            "`solver.tolerance` must be left out when `solver.interaction` = 'exact' (which does not read "
            "it); got 1e-06. Remove it; it is read when `solver.interaction` is 'expansion' or 'auto'.",
        ),
        (
            {"model": {"beta_scaling": "log_n", "beta": 5.0}},
            "`model.beta` must be left out when `model.beta_scaling` = 'log_n' (which does not read it); "
            "got 5.0. Remove it; it is read when `model.beta_scaling` is 'none'.",
        ),
        (
            {"model": {"gamma": 3.0}},
            "`model.gamma` must be left out when `model.beta_scaling` = 'none' (which does not read it); "
            "got 3.0. Remove it; it is read when `model.beta_scaling` is 'log_n'.",
        ),
        (
            {"attention": {"heads": 2, "scale": 2.0}},
            "`attention.scale` must be left out when `attention.weights` = 'identity' (which does not read "
            "it); got 2.0. Remove it; it is read when `attention.weights` is 'gaussian', 'orthogonal', "
            "'shared' or 'random_qk'.",
        ),
        (
            {"attention": {"weights": "maps.npz", "seed": 5}},
            "`attention.seed` must be left out when `attention.weights` = a file (which does not read it); "
            "got 5. Remove it; it is read when `attention.weights` is 'gaussian', 'orthogonal', 'shared' "
            "or 'random_qk'.",
        ),
        (
            {"init": {"kind": "uniform", "sigma": 0.5}},
            "`init.sigma` must be left out when `init.kind` = 'uniform' (which does not read it); got 0.5. "
            "Remove it; it is read when `init.kind` is 'cap'.",
        ),
    ],
)
def test_a_key_the_chosen_kind_ignores_is_refused(tmp_path, data, line):
    path = write(tmp_path, toml_text(data))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: " + line.format(folder=tmp_path.resolve())


def test_an_ignored_key_given_by_set_names_set(tmp_path):
    path = write(tmp_path, '[factor]\nkind = "none"\n')
    with pytest.raises(
        ConfigError, match=r"^--set: `factor\.omega` must be left out when `factor\.kind` = 'none'"
    ):
        load_config(path, ["factor.omega=1.0"])


def test_an_ignored_key_at_its_default_is_accepted(tmp_path):
    # a file listing every key at its default (as the reference does) changes neither run nor hash
    path = write(tmp_path, '[factor]\nkind = "none"\nslope = 1.0\n[solver]\nmethod = "rk4"\nrtol = 1e-8\n')
    assert load_config(path).factor.kind == "none"


def test_a_key_read_by_the_chosen_kind_is_accepted(tmp_path):
    path = write(
        tmp_path, '[solver]\nmethod = "adaptive"\natol = 1e-6\n[factor]\nkind = "file"\npath = "w.npy"\n'
    )
    config = load_config(path)
    assert (config.solver.atol, config.factor.path) == (1e-6, str((tmp_path / "w.npy").resolve()))


def test_a_dict_is_not_checked_for_ignored_keys():
    # config_from_dict validates sweep points, whose grid may change a kind under a checked base
    assert config_from_dict({"solver": {"method": "rk4", "atol": 1e-6}}).solver.atol == 1e-6


def test_every_listed_choice_and_key_exists_in_the_schema():
    from attnflow.io.config_schema import SECTIONS

    for (section, selector), table in IGNORED.items():
        fields = SECTIONS[section].model_fields
        assert selector in fields, (section, selector)
        for ignored in table.values():
            assert set(ignored) <= set(fields), (section, selector, ignored)


def test_a_section_the_table_does_not_know_is_not_refused(tmp_path):
    # keys outside the table (a section being added, say) are left to the schema
    from attnflow.io.config_unused import check_unused

    check_unused({"future": {"anything": 1}}, config_from_dict({}), where="x")  # no error
    with pytest.raises(ConfigError, match=r"`factor\.slope` must be left out"):
        check_unused({"factor": {"slope": 2.0}}, config_from_dict({"factor": {"slope": 2.0}}), where="x")


def test_a_huge_value_is_cut_in_the_message():
    with pytest.raises(ConfigError) as info:
        config_from_dict({"model": {"beta": -(2**2000)}})  # a sign and 603 digits
    message = str(info.value)
    assert message.startswith("config: `model.beta` must be a number > 0; got -1148130695")
    assert message.endswith("... (604 characters).") and len(message) < 300
