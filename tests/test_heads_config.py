"""The `[attention]` section, `model.causal = "strict"` and `model.sources` from a config file:
a run of heads end to end, and every bad input one line with exit code 2 and nothing written."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.core import heads as H
from attnflow.io.config import ConfigError, load_config
from attnflow.numerics.heads_field import HeadsField
from attnflow.workflows.build import build

BASE = """
[model]
n = 16
d = 6
{model}
[aux]
kind = "positions"
[gauge]
kind = "rope"
frequencies = "roformer"
[factor]
{factor}
[attention]
heads = 2
head_dim = 4
{attention}
[solver]
t_end = 0.2
save_every = 0.1
"""


def write(tmp_path, *, model="", factor='kind = "none"', attention="", name="c.toml"):
    path = tmp_path / name
    path.write_text(BASE.format(model=model, factor=factor, attention=attention))
    return path


def weights(tmp_path, *, heads=2, head_dim=4, d=6, bad=None, name="w.npz"):
    arrays = H.gaussian_maps(0, 3 if bad == "heads" else heads, head_dim, d)
    if bad == "nan":
        arrays["value"][1, 0, 0] = np.nan
    if bad == "shape":
        arrays["output"] = arrays["output"][:, :, :-1]
    if bad == "missing":
        arrays.pop("key")
    np.savez(tmp_path / name, **arrays)
    return name


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_a_config_builds_the_heads_it_names(tmp_path):
    name = weights(tmp_path)
    sim = build(load_config(write(tmp_path, attention=f'weights = "{name}"\nvalues = "plain"')))
    assert isinstance(sim.field, HeadsField)
    assert [h.head_dim for h in sim.field.heads] == [4, 4]
    stored = np.load(tmp_path / name)
    for h, head in enumerate(sim.field.heads):
        assert np.array_equal(np.asarray(head.query), stored["query"][h])
        assert np.array_equal(np.asarray(head.output), stored["output"][h])
        assert head.values == "plain"
        assert head.gauge.d == 4  # RoPE built in the head dimension


def test_alibi_gives_each_head_its_slope(tmp_path):
    config = load_config(
        write(
            tmp_path,
            factor='kind = "distance_bias"\nslope = 1.0',
            attention='alibi = true\nweights = "shared"',
        )
    )
    slopes = [float(h.factor.slope) for h in build(config).field.heads]
    assert slopes == pytest.approx([2.0**-4, 2.0**-8])
    assert build(config).field.gradient_flow  # shared maps, rotated values, usa, no mask


def test_identity_heads_with_head_dim_d_are_the_paper_model(tmp_path):
    """H = 1, maps I, rotated values, d_h = d: the field of the config without [attention]."""
    text = BASE.format(model="", factor='kind = "none"', attention="").replace("heads = 2\nhead_dim = 4", "")
    (tmp_path / "a.toml").write_text(text)
    (tmp_path / "p.toml").write_text(text.split("[attention]")[0] + text.split("[attention]")[1])
    heads, paper = build(load_config(tmp_path / "a.toml")), build(load_config(tmp_path / "p.toml"))
    assert isinstance(heads.field, HeadsField) and not isinstance(paper.field, HeadsField)
    x = paper.x0
    assert np.max(np.abs(np.asarray(heads.field(x) - paper.field(x)))) <= 1e-13


def test_a_run_of_heads_records_what_it_ran(tmp_path):
    config = write(tmp_path, model='causal = "strict"\nsources = 2', attention='weights = "gaussian"')
    result = invoke("run", str(config), "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["gradient_flow"] is False
    assert metrics["energy_gap"] is None and "not a gradient flow" in metrics["methods"]["energy_gap"]
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert resolved["attention"]["heads"] == 2 and resolved["model"]["sources"] == 2
    from attnflow.io.store import read_trajectory

    xs = np.asarray(read_trajectory(tmp_path / "run" / "trajectory.zarr").xs)
    # the held sources never moved: their velocity is zero, and only renormalising a unit row after
    # each step may change its last bit (measured: 1 ulp)
    np.testing.assert_allclose(xs[-1, :2], xs[0, :2], rtol=0, atol=1e-15)
    assert np.max(np.abs(xs[-1, 2:] - xs[0, 2:])) > 1e-4


def test_the_paper_config_has_no_attention_key(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[model]\nn = 8\n")
    from attnflow.io.config import resolved_dict

    assert "attention" not in resolved_dict(load_config(path))


W = 'weights = "{w}"'
NPZ = r"`attention.weights` must be a .npz file "
BAD = [
    (dict(attention=W), "shape", NPZ + r"whose `output` has shape"),
    (dict(attention=W), "nan", NPZ + r"whose `value` is finite"),
    (dict(attention=W), "missing", NPZ + r"holding the arrays"),
    (dict(attention=W), "heads", r"`query` has shape \(2, 4, 6\); got .*\(3, 4, 6\)"),
    (dict(attention='weights = "gausian"'), None, r"`attention.weights` must be one of \('identity'"),
    (dict(model="sources = 16"), None, r"`model.sources` must be below `model.n` = 16"),
    (dict(model='normalization = "sa"', factor='kind = "toeplitz_cos"'), None, r"`factor.kind` must be"),
    (dict(model='value = "logits_only"'), None, r"`model.value` must be 'gradient' \(the default\) with an"),
    (dict(attention="alibi = true"), None, r"`attention.alibi` must be false unless `factor.kind`"),
    (dict(attention="scale = 0"), None, r"`attention.scale` must be a number > 0"),
    (dict(model='causal = "yes"'), None, r"`model.causal` must be true, false or 'strict'"),
]


@pytest.mark.parametrize(("parts", "bad", "message"), BAD, ids=[b[2][:40] for b in BAD])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, parts, bad, message):
    name = weights(tmp_path, bad=bad) if "{w}" in parts.get("attention", "") else ""
    parts = {key: value.format(w=name) for key, value in parts.items()}
    config = write(tmp_path, **parts)
    with pytest.raises(ConfigError, match=message):
        build(load_config(config))
    out = tmp_path / "out"
    result = invoke("run", str(config), "--out", str(out))
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and re.search(message, line)  # the same one clear line
    assert not out.exists()


def test_row_blocks_hold_no_n_by_n_array():
    """Above the block size a head's sum holds ``n × block`` arrays: no ``n × n`` array appears in
    the compiled program (its optimised HLO), while the dense evaluation has one (the check sees it)."""
    from attnflow.core import factors, gauges
    from attnflow.core.kernel import make_profile

    n, d = 2048, 8
    maps = H.gaussian_maps(0, 2, 4, d)
    heads = tuple(
        H.make_head(*(maps[k][h] for k in H.MAP_NAMES), gauge=gauges.IdentityGauge(n=n, d=4),
                    factor=factors.NoFactor(n=n))
        for h in range(2)
    )  # fmt: skip
    x = jnp.ones((n, d)) / np.sqrt(d)
    square = f"[{n},{n}]"
    for block, holds_square in ((128, False), (None, True)):
        program = jax.jit(HeadsField(heads, make_profile(), block_size=block)).lower(x).compile().as_text()
        assert (square in program) == holds_square
        assert block is None or f"[{block},{n}]" in program


@pytest.mark.parametrize(
    ("setting", "key"),
    [("[model]\nn = 8\ncausal = true\n", "model.causal"), ("[model]\nn = 8\nsources = 1\n", "model.sources"),
     ("[model]\nn = 8\n[attention]\nheads = 1\n", "attention")],
)  # fmt: skip
def test_landscape_refuses_what_is_not_a_gradient_flow(tmp_path, setting, key):
    path = tmp_path / "c.toml"
    path.write_text(setting)
    result = invoke("landscape", str(path), "--out", str(tmp_path / "ls"))
    assert result.exit_code == 2
    assert f"`{key}` must be" in result.stderr and "for `attnflow landscape`" in result.stderr
    assert not (tmp_path / "ls").exists()
