"""The output-folder check: one line naming the option, the reason and the path; nothing created."""

import os

import pytest

from attnflow.io import run_folder
from attnflow.io.run_folder import OutFolderError, check_out_folder


def test_a_new_folder_under_a_writable_one_is_accepted_and_not_created(tmp_path):
    target = tmp_path / "a" / "b" / "run"
    assert check_out_folder(target) == target
    assert not (tmp_path / "a").exists()


def test_an_existing_folder_is_accepted(tmp_path):
    assert check_out_folder(tmp_path) == tmp_path


@pytest.mark.parametrize(
    ("relative", "reason"),
    [
        ("file", "Not a directory"),
        ("file/run", "Not a directory"),
        ("x" * 300, "File name too long"),
        ("sub/" + "y" * 300 + "/run", "File name too long"),
    ],
)
def test_impossible_folders_are_one_line_errors(tmp_path, relative, reason):
    (tmp_path / "file").write_text("x")
    target = tmp_path / relative
    with pytest.raises(OutFolderError, match=rf"^--out: {reason} \(.*\)$") as caught:
        check_out_folder(target)
    assert str(target) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_device_is_not_a_folder():
    with pytest.raises(OutFolderError, match=r"^--out: Not a directory \(/dev/null\)$"):
        check_out_folder("/dev/null")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a folder without write permission")
def test_a_folder_without_write_permission_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(OutFolderError, match=r"^--out: Permission denied"):
        check_out_folder(locked / "run")


def test_the_option_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutFolderError, match=r"^DIR: Not a directory"):
        check_out_folder(tmp_path / "file", option="DIR")


@pytest.mark.parametrize("relative", ["link", "link/run"])
def test_a_link_to_nothing_is_refused_in_one_line(tmp_path, relative):
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    with pytest.raises(
        OutFolderError, match=r"^--out: symbolic link to a missing target \(.*link.* -> .*missing\)$"
    ):
        check_out_folder(tmp_path / relative)
    assert not (tmp_path / "missing").exists()


def test_a_folder_no_check_foresees_is_refused_when_claimed():
    # as root, /proc passes the checks (it exists, root may write) but makes no folder
    reason = "No such file or directory" if os.geteuid() == 0 else "Permission denied"
    with pytest.raises(OutFolderError, match=rf"^--out: {reason} \(/proc/attnflow-run\)$"):
        with run_folder.claimed("/proc/attnflow-run"):
            pass
