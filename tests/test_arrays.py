"""The one loader of array files: each bad file is one line naming the constraint, never a hang."""

import os

import numpy as np
import pytest

from attnflow.io.arrays import ArrayFileError, load_array


def test_real_arrays_load_as_float64(tmp_path):
    for array in (np.arange(4, dtype=np.int32), np.arange(4, dtype=np.uint8), np.ones((2, 3), np.float32)):
        np.save(tmp_path / "a.npy", array)
        loaded = load_array(tmp_path / "a.npy")
        assert loaded.dtype == np.float64
        np.testing.assert_array_equal(loaded, array)


def _files(tmp_path):
    np.save(tmp_path / "complex.npy", np.ones(3) + 1j)
    np.save(tmp_path / "bool.npy", np.ones(3, dtype=bool))
    np.save(tmp_path / "strings.npy", np.array(["a"]))
    np.savez(tmp_path / "archive.npz", a=np.zeros(3))
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "text.npy").write_text("not an array")
    (tmp_path / "header.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f8\n     ")
    os.symlink(tmp_path / "loop_b", tmp_path / "loop_a")
    os.symlink(tmp_path / "loop_a", tmp_path / "loop_b")
    os.mkfifo(tmp_path / "fifo.npy")
    (tmp_path / "folder.npy").mkdir()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("complex.npy", "must be an array of integers or floats; got '.*complex.npy' with dtype complex128"),
        ("bool.npy", "must be an array of integers or floats; got '.*bool.npy' with dtype bool"),
        ("strings.npy", "must be an array of integers or floats; got .* with dtype <U1"),
        ("archive.npz", r"must be a .npy file holding one array; got '.*archive.npz' \(a .npz archive"),
        ("empty.npy", r"must be a .npy file holding one array; got '.*empty.npy' \(an empty file\)"),
        ("text.npy", r"must be a readable .npy file; got '.*text.npy' \(no .npy header\)"),
        ("header.npy", r"must be a readable .npy file; got '.*header.npy' \(.+\)"),
        ("loop_a", r"must be a readable .npy file; got '.*loop_a' \(Too many levels of symbolic links\)"),
        ("missing.npy", r"must be a readable .npy file; got '.*missing.npy' \(FileNotFoundError\)"),
        ("fifo.npy", r"must be a regular .npy file; got '.*fifo.npy' \(a FIFO\)"),
        ("folder.npy", r"must be a regular .npy file; got '.*folder.npy' \(a folder\)"),
    ],
)
def test_each_bad_file_is_one_line(tmp_path, name, message):
    _files(tmp_path)
    with pytest.raises(ArrayFileError, match=message) as caught:
        load_array(tmp_path / name)
    assert "\n" not in str(caught.value)


def test_a_bad_file_names_the_config_key(tmp_path):
    from attnflow.io.config import ConfigError, config_from_dict
    from attnflow.workflows.build import build

    np.save(tmp_path / "x0.npy", np.ones((8, 3)) + 1j)
    config = config_from_dict({"model": {"n": 8}, "init": {"kind": "file", "path": str(tmp_path / "x0.npy")}})
    with pytest.raises(
        ConfigError, match=r"`init\.path` must be an array of integers or floats; got .*complex"
    ):
        build(config)


def test_huge_finite_initial_rows_keep_their_direction(tmp_path):
    # Rows near the float64 maximum overflow a plain norm (inf) and would become zero rows.
    from attnflow.io.config import config_from_dict
    from attnflow.workflows.build import build

    rows = np.tile([3.0, 4.0, 0.0], (8, 1)) * 1e307
    rows[1] = [0.0, 0.0, -1e308]
    np.save(tmp_path / "x0.npy", rows)
    config = config_from_dict({"model": {"n": 8}, "init": {"kind": "file", "path": str(tmp_path / "x0.npy")}})
    x0 = np.asarray(build(config).x0)
    np.testing.assert_allclose(x0[0], [0.6, 0.8, 0.0], rtol=1e-15)  # round-off of one division
    np.testing.assert_array_equal(x0[1], [0.0, 0.0, -1.0])
