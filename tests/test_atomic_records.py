"""``io.atomic.write_record``/``read_record``: a dataclass of arrays, numbers and strings through a
``.npz`` archive (the saved runs of the mean-field and context studies), nothing unpickled."""

import dataclasses

import numpy as np
import pytest

from attnflow.io.atomic import read_record, write_record


@dataclasses.dataclass(frozen=True)
class _Run:
    setting: str
    n: int
    wall_s: float
    x: np.ndarray


def test_a_record_reads_back_as_written_and_leaves_no_temporary(tmp_path):
    run = _Run("E1 (a)", 64, 1.5, np.arange(6.0).reshape(3, 2))
    path = write_record(tmp_path / "run.npz", run)
    back = read_record(_Run, path)
    assert (back.setting, back.n, back.wall_s) == ("E1 (a)", 64, 1.5)
    assert type(back.n) is int and type(back.setting) is str
    np.testing.assert_array_equal(back.x, run.x)
    assert [p.name for p in tmp_path.iterdir()] == ["run.npz"]


def test_an_archive_holding_objects_is_refused(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, setting=np.array([{"a": 1}], dtype=object), n=1, wall_s=0.0, x=np.zeros(2))
    with pytest.raises(ValueError, match="allow_pickle"):
        read_record(_Run, path)
