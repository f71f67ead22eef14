"""The output-folder check: one line naming the option, the reason and the path; nothing created."""

import os

import pytest

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
