"""The compilation cache folder: a compiled program read from disk runs as code, so the folder must
be one that no other user can write or swap (numerics.private_folder.check_private_folder)."""

import os
import stat
from pathlib import Path

import pytest

from attnflow.numerics.private_folder import CacheFolderError, check_private_folder
from attnflow.workflows.sweep import compilation_cache_environ

SRC = Path(__file__).resolve().parents[1] / "src" / "attnflow"


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def private_base(tmp_path: Path) -> Path:
    base = tmp_path / "home"
    base.mkdir(mode=0o700)
    return base


def test_a_new_folder_is_made_private(tmp_path):
    folder = check_private_folder(private_base(tmp_path) / "a" / "cache")
    assert folder.is_dir() and mode(folder) == 0o700


def test_an_own_open_folder_is_refused_and_left_as_it_is(tmp_path):
    """attnflow makes its folder 0o700 whatever the umask: an open one is somebody's choice, so it
    is refused with the fix, never chmod-ed."""
    folder = private_base(tmp_path) / "cache"
    folder.mkdir()
    folder.chmod(0o775)
    with pytest.raises(CacheFolderError, match=r"must be private \(mode 700\); got mode 775: `chmod 700 "):
        check_private_folder(folder)
    assert mode(folder) == 0o775


def test_a_group_writable_entry_inside_is_refused(tmp_path):
    folder = check_private_folder(private_base(tmp_path) / "cache")
    (folder / "jit_program-cache").write_bytes(b"x")
    check_private_folder(folder)  # our own private entries are fine
    (folder / "jit_program-cache").chmod(0o664)
    message = r"every entry of .* got `.*jit_program-cache` \(uid \d+, mode 664\)"
    with pytest.raises(CacheFolderError, match=message):
        check_private_folder(folder)


@pytest.mark.skipif(os.getuid() != 0, reason="planting a file of another user needs root")
def test_a_planted_entry_of_another_owner_is_refused_and_jax_never_reads_it(tmp_path, monkeypatch):
    """A file another user put in the cache folder (it could be a compiled program JAX would load
    and run) makes the cache refused: the CLI answers one line with exit 2 before any compile."""
    from typer.testing import CliRunner

    from attnflow.cli.app import app

    folder = check_private_folder(private_base(tmp_path) / "cache")
    planted = folder / "jit__program-0123456789abcdef-cache"
    planted.write_bytes(b"not a program")
    os.chown(planted, 65534, 65534)
    with pytest.raises(CacheFolderError, match=r"got `.*jit__program-0123456789abcdef-cache` \(uid 65534"):
        check_private_folder(folder)
    monkeypatch.setenv("ATTNFLOW_CACHE_DIR", str(folder))
    config = tmp_path / "c.toml"
    config.write_text("[model]\nn = 8\n[solver]\nt_end = 0.1\nsave_every = 0.1\n")
    result = CliRunner().invoke(app, ["run", str(config), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "uid 65534" in result.output
    assert not (tmp_path / "run").exists()


def test_a_folder_above_that_others_can_write_is_refused(tmp_path):
    shared = private_base(tmp_path) / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(
        CacheFolderError, match=rf"`{shared}` \(above the cache folder\) must be .* got uid \d+, mode 777"
    ):
        check_private_folder(shared / "cache")
    assert not (shared / "cache").exists()  # refused before anything is made
    assert compilation_cache_environ(shared / "cache") == {}  # a sweep then shares no programs


def test_a_sticky_shared_folder_above_is_accepted(tmp_path):
    sticky = private_base(tmp_path) / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert mode(check_private_folder(sticky / "mine")) == 0o700
    assert "JAX_COMPILATION_CACHE_DIR" in compilation_cache_environ(sticky / "mine")


def test_a_sweep_shares_the_user_s_private_cache_not_a_folder_in_the_sweep(tmp_path, monkeypatch):
    mine = private_base(tmp_path) / "cache"
    monkeypatch.setenv("ATTNFLOW_CACHE_DIR", str(mine))
    environ = compilation_cache_environ()
    assert environ["JAX_COMPILATION_CACHE_DIR"] == str(mine) and mode(mine) == 0o700


def test_off_turns_the_cache_off_everywhere(tmp_path, monkeypatch):
    import jax

    from attnflow.io.cache_folder import check_cache_folder
    from attnflow.numerics.program_cache import enable_persistent_cache

    monkeypatch.setenv("ATTNFLOW_CACHE_DIR", " OFF ")
    before = jax.config.jax_compilation_cache_dir
    assert enable_persistent_cache() is None and jax.config.jax_compilation_cache_dir == before
    assert check_cache_folder() is None and compilation_cache_environ() == {}
    assert not Path("OFF").exists() and not Path("off").exists()  # not a folder named off
    # a folder given by name is still a folder: the tests of the cache turn it on there
    assert "JAX_COMPILATION_CACHE_DIR" in compilation_cache_environ(private_base(tmp_path) / "c")


def test_a_link_is_refused(tmp_path):
    base = private_base(tmp_path)
    (base / "real").mkdir(mode=0o700)
    (base / "link").symlink_to(base / "real")
    with pytest.raises(CacheFolderError, match=r"must be a real folder \(no link or file\); got a link\."):
        check_private_folder(base / "link")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_is_refused(tmp_path):
    folder = private_base(tmp_path) / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(CacheFolderError, match=r"must be owned by this user \(uid 0\); got uid 65534"):
        check_private_folder(folder)


def test_nothing_in_the_library_unpickles():
    """No file is unpickled anywhere in attnflow (the removed program store did)."""
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if any(word in path.read_text() for word in ("pickle.load", "pickle.loads", "Unpickler"))
    ]
    assert offenders == []
