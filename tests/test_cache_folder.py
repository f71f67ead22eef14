"""The compiled-program cache folder: the user's own, private; else one line and exit code 2."""

import os
import stat

import numpy as np
import pytest
from typer.testing import CliRunner

from attnflow.cli import app
from attnflow.io.cache_folder import CACHE_ENV, CacheFolderError, cache_folder, check_cache_folder
from configs import small_toml

OTHER_UID = 54321


def test_the_folder_is_the_variable_else_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_folder() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "xdg" / "attnflow" / "jax"


def test_a_private_folder_of_the_user_passes_and_nothing_changes(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    assert check_cache_folder(folder) == folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_folder_not_yet_made_passes_and_is_not_made(tmp_path):
    assert check_cache_folder(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()


def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    tmp_path.chmod(0o700)
    with pytest.raises(CacheFolderError) as info:
        check_cache_folder(uid=OTHER_UID)  # the folder is this user's, not OTHER_UID's
    uid = os.geteuid()
    assert str(info.value) == (
        f"cache: `{CACHE_ENV}` must be a folder you own (uid {OTHER_UID}); got {str(tmp_path)!r} (owned by "
        f"uid {uid}). Set {CACHE_ENV} to a folder of your own (it is created with mode 0o700)."
    )


@pytest.mark.parametrize("mode", [0o770, 0o755, 0o707])
def test_a_folder_others_may_read_or_write_is_refused(tmp_path, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(
        CacheFolderError, match=rf"must be private \(mode 0o700.*\); got .* \(mode {mode:#o}\)"
    ):
        check_cache_folder(folder)


def test_a_file_is_refused(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(CacheFolderError, match=r"must be a folder; got .* \(not a folder\)"):
        check_cache_folder(file)
    with pytest.raises(CacheFolderError, match=r"must be a readable folder; got .* \(Not a directory\)"):
        check_cache_folder(file / "below")


def test_a_folder_that_cannot_be_made_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as for a read-only parent
    with pytest.raises(
        CacheFolderError, match=rf"must be creatable; got .* \({str(tmp_path)!r} is not writable\)"
    ):
        check_cache_folder(tmp_path / "new")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
@pytest.mark.parametrize("command", ["run", "reproduce", "realize"])
def test_a_command_refuses_a_foreign_cache_folder_in_one_line_writing_nothing(tmp_path, monkeypatch, command):
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, OTHER_UID, -1)
    monkeypatch.setenv(CACHE_ENV, str(foreign))
    config, target, out = tmp_path / "c.toml", tmp_path / "t.npy", tmp_path / "out"
    config.write_text(small_toml())
    np.save(target, np.zeros(8))
    args = {
        "run": ["run", str(config)],
        "reproduce": ["reproduce", "--only", "E0"],
        "realize": ["realize", "--target", str(target), "--kind", "orbit"],
    }[command]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cache: `{CACHE_ENV}` must be a folder you own")
    assert not out.exists() and list(foreign.iterdir()) == []
