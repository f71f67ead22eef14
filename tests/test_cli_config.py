"""The command line around a config (issue 28, item 8): `config show`, `config check`, `--set`
errors that blame `--set`, positions implied by a RoPE gauge, shell completion, `solver.max_steps`."""

import tomllib

import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.cli.app import exit_unless_ok
from attnflow.io.config import ConfigError, config_from_dict, config_hash, load_config, resolved_dict

ROPE = '[model]\nn = 16\n[gauge]\nkind = "rope"\n[solver]\nt_end = 1.0\nsave_every = 0.5\n'


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture
def rope_file(tmp_path):
    path = tmp_path / "rope.toml"
    path.write_text(ROPE)
    return path


def test_a_rope_gauge_implies_positions_unless_labels_are_written():
    assert config_from_dict({"gauge": {"kind": "rope"}}).aux.kind == "positions"
    assert config_from_dict({"factor": {"kind": "distance_bias"}}).aux.kind == "positions"
    assert config_from_dict(
        {"gauge": {"kind": "rope"}, "aux": {"kind": "file", "path": "x.npy"}}
    ).aux.kind == ("file")
    with pytest.raises(
        ConfigError, match=r"`aux\.kind` must be 'positions' or 'file' when `gauge\.kind` = 'rope'"
    ):
        config_from_dict({"gauge": {"kind": "rope"}, "aux": {"kind": "none"}})
    assert config_from_dict({}).aux.kind == "none"  # no positional kernel: no labels
    explicit = {"gauge": {"kind": "rope"}, "aux": {"kind": "positions"}}
    assert config_hash(config_from_dict({"gauge": {"kind": "rope"}})) == config_hash(
        config_from_dict(explicit)
    )


def test_a_bad_set_value_blames_set_and_a_bad_file_value_the_file(rope_file, tmp_path):
    result = invoke("run", str(rope_file), "--set", "gauge.kind=ropee", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: --set: `gauge.kind` must be one of 'none', 'rope', 'generalized_rope', 'prompt', 'file'; got "
        "'ropee'. Did you mean 'rope'?"
    ]
    bad = tmp_path / "bad.toml"
    bad.write_text(ROPE.replace('"rope"', '"ropee"'))
    result = invoke("run", str(bad), "--set", "model.beta=2", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {bad}: `gauge.kind` must be one of")
    with pytest.raises(ConfigError, match=r"^--set: `model\.n` must be an integer >= 2; got 1\.$"):
        load_config(rope_file, ["model.n=1"])
    assert not (tmp_path / "o").exists()


def test_config_show_prints_every_default_and_reads_back_as_the_same_config(rope_file):
    result = invoke("config", "show", str(rope_file), "--set", "model.beta=2")
    assert result.exit_code == 0, result.output
    shown = tomllib.loads(result.stdout)
    config = load_config(rope_file, ["model.beta=2"])
    assert config_from_dict(shown) == config
    resolved = resolved_dict(config)
    assert list(shown) == list(resolved)
    for section, table in resolved.items():  # every key with a value is written (null ones as comments)
        assert {k for k, v in table.items() if v is not None} == set(shown[section])
        assert all(f"# {k} = (unset)" in result.stdout for k, v in table.items() if v is None)
    assert shown["aux"]["kind"] == "positions"


def test_config_show_reads_back_a_path_of_any_characters(tmp_path):
    folder = tmp_path / "init 😀 é\x7f"  # outside the BMP (JSON writes a surrogate pair), DEL
    folder.mkdir()
    (folder / "x0.npy").write_bytes(b"")  # a file only needs to exist to load the config
    config_file = tmp_path / "c.toml"
    config_file.write_text('[model]\nn = 4\n[init]\nkind = "file"\npath = "init 😀 é\\u007f/x0.npy"\n')
    result = invoke("config", "show", str(config_file))
    assert result.exit_code == 0, result.output
    shown = tomllib.loads(result.stdout)
    assert shown["init"]["path"] == str(folder.resolve() / "x0.npy")
    assert config_from_dict(shown) == load_config(config_file)


def test_config_show_refuses_bad_input_in_one_line(tmp_path):
    result = invoke("config", "show", str(tmp_path / "absent.toml"))
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1


def test_config_check_validates_and_estimates_without_running(rope_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("config", "check", str(rope_file))
    assert result.exit_code == 0, result.output
    for word in ("valid", "memory", "MiB", "steps", "100", "time", "about"):
        assert word in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rope.toml"]  # nothing written
    too_big = invoke("config", "check", str(rope_file), "--set", "model.n=100000000000")
    assert too_big.exit_code == 2
    (line,) = too_big.stderr.splitlines()
    assert "`model.n` must leave the run within memory" in line
    adaptive = invoke("config", "check", str(rope_file), "--set", "solver.method=adaptive")
    assert adaptive.exit_code == 0 and "not known before the run" in adaptive.stdout


def test_shell_completion_is_offered():
    result = invoke("--help")
    assert result.exit_code == 0
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout


def test_max_steps_is_an_adaptive_key_with_a_bound_and_leaves_other_hashes_alone(tmp_path):
    config = config_from_dict({"solver": {"method": "adaptive", "max_steps": 1000}})
    assert config.solver.max_steps == 1000 and resolved_dict(config)["solver"]["max_steps"] == 1000
    assert "max_steps" not in resolved_dict(config_from_dict({}))["solver"]
    assert config_hash(config_from_dict({})) == "1f6c3cfa19e7"  # as before the key existed
    for value in (0, 10**9, 1.5, "many"):
        with pytest.raises(ConfigError, match=r"`solver\.max_steps` must be"):
            config_from_dict({"solver": {"method": "adaptive", "max_steps": value}})
    path = tmp_path / "rk4.toml"
    path.write_text('[solver]\nmethod = "rk4"\nmax_steps = 10\n')
    with pytest.raises(
        ConfigError, match=r"`solver\.max_steps` must be left out when `solver\.method` = 'rk4'"
    ):
        load_config(path)


def test_a_run_stopped_by_its_step_bound_names_the_key(capsys, tmp_path):
    import typer

    with pytest.raises(typer.Exit) as stop:
        exit_unless_ok("max_steps", tmp_path)
    assert stop.value.exit_code == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "status 'max_steps' (the adaptive solver reached its step bound, `solver.max_steps`" in line


def test_config_check_runs_the_library_s_checks_under_config_keys(tmp_path):
    """A sign-changing factor file with softmax: the library's check (one place), the config key named."""
    import numpy as np

    np.save(tmp_path / "w.npy", -np.ones((16, 16)))
    path = tmp_path / "sa.toml"
    path.write_text(ROPE + '[factor]\nkind = "file"\npath = "w.npy"\n')
    result = invoke("config", "check", str(path), "--set", "model.normalization=sa")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: config: `model.normalization` 'sa' requires a non-negative factor (softmax weights); got the "
        "sign-changing factor MatrixFactor."
    ]


# --- one Ctrl-C policy for every command (attnflow.cli.interrupts) -------------------------------


@pytest.mark.parametrize(
    ("args", "target", "line"),
    [
        (["landscape", "{config}", "--out", "{out}"], "attnflow.workflows.landscape.run_landscape",
         "interrupted before landscape started: nothing was written."),
        (["run", "{config}", "--out", "{out}"], "attnflow.workflows.run.run",
         "interrupted before run started: nothing was written."),
        (["config", "check", "{config}"], "attnflow.workflows.build.build",
         "interrupted before check started: nothing was written."),
    ],
)  # fmt: skip
def test_ctrl_c_in_any_command_is_one_line_and_exit_130(rope_file, tmp_path, monkeypatch, args, target, line):
    import importlib
    import signal

    module, name = target.rsplit(".", 1)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module(module), name, interrupted)
    out = tmp_path / "out"
    try:
        result = invoke(*(a.format(config=rope_file, out=out) for a in args))
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines() == [line]
    assert "Traceback" not in result.output and not out.exists()


def test_a_stopped_run_says_what_it_kept_and_how_to_continue(rope_file, tmp_path, monkeypatch):
    import signal

    from attnflow.workflows import run as run_module

    def stopped(config, out_dir, **kwargs):
        raise run_module.RunInterrupted(out_dir, 3, 9)

    monkeypatch.setattr(run_module, "run", stopped)
    out = tmp_path / "out"
    try:
        result = invoke("run", str(rope_file), "--out", str(out))
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert result.exit_code == 130
    assert result.stderr.splitlines() == [
        f"interrupted: kept 3 of 9 snapshots in {str(out)!r}; metrics.json records status 'interrupted'. "
        f"Continue with: attnflow run {rope_file} --out {out} --resume"
    ]


def test_an_adaptive_run_stopped_by_solver_max_steps_exits_3_naming_the_key(tmp_path):
    import json

    path = tmp_path / "adaptive.toml"
    path.write_text(
        '[model]\nn = 8\n[solver]\nmethod = "adaptive"\nt_end = 2.0\nsave_every = 0.5\nmax_steps = 3\n'
    )
    out = tmp_path / "run"
    result = invoke("run", str(path), "--out", str(out))
    assert result.exit_code == 3, result.output
    assert (
        "status 'max_steps' (the adaptive solver reached its step bound, `solver.max_steps`" in result.stderr
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["status"] == "max_steps"
    assert json.loads((out / "config.json").read_text())["solver"]["max_steps"] == 3


def test_config_check_builds_a_density_run_as_run_does(tmp_path):
    """A [density] config is checked as `attnflow run` builds it (it was refused as particles)."""
    path = tmp_path / "density.toml"
    text = "[model]\nd = 2\n[density]\ngrid = 48\n[solver]\ndt = 0.05\nt_end = 1.0\nsave_every = 0.5\n"
    path.write_text(text)
    result = invoke("config", "check", str(path))
    assert result.exit_code == 0, result.output
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in result.stdout.splitlines()
        if line.count("│") == 3
    }
    shown = (rows["domain"], rows["labels"], rows["snapshots"], rows["steps"])
    assert shown == ("S^1, grid 48", "1", "3", "20")  # 2 snapshots of 10 steps after the initial one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["density.toml"]  # nothing written
    unstable = invoke(
        "config", "check", str(path), "--set", "solver.dt=0.5", "--set", "solver.save_every=0.5"
    )
    assert unstable.exit_code == 2
    (line,) = unstable.stderr.splitlines()
    assert "`solver.dt` must be at most" in line  # the density build's own check (safe_dt)
