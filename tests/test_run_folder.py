"""One run-folder lifecycle for every command (attnflow.io.run_folder): claim, lock, resume,
overwrite; each refusal one line that changes nothing."""

import dataclasses

import pytest

from attnflow.io import run_folder
from attnflow.io.run_folder import LANDSCAPE, REALIZE, RUN, OutFolderError, check_claim, claimed, in_use


def files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_new_folder_is_made_held_and_marked(tmp_path):
    out = tmp_path / "a" / "run"
    with claimed(out, RUN) as claim:
        assert claim.created and not claim.resumed
        assert in_use(out) and (out / RUN.marker).is_file()
    assert not in_use(out)


def test_a_second_claim_while_one_writes_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    with claimed(out, RUN):
        before = files(out)
        for options in ({}, {"resume": True}, {"overwrite": True}):
            with pytest.raises(
                OutFolderError, match="must not be in use; got a folder another run is writing"
            ):
                with claimed(out, RUN, **options):
                    pass
        assert files(out) == before


@pytest.mark.parametrize("layout", [RUN, REALIZE, LANDSCAPE])
def test_an_earlier_folder_needs_resume_or_overwrite(tmp_path, layout):
    out = tmp_path / "out"
    with claimed(out, layout):
        (out / layout.entries[0]).write_text("first")
    with pytest.raises(OutFolderError, match=f"got a {layout.command} folder. Pass "):
        check_claim(out, layout)
    with claimed(out, layout, overwrite=True) as claim:
        assert not claim.resumed and not (out / layout.entries[0]).exists()  # its own entries removed


def test_a_folder_of_other_files_is_refused_whatever_the_options(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    for options in ({}, {"resume": True}, {"overwrite": True}):
        with pytest.raises(OutFolderError, match=r"or a run folder; got other files \('notes.txt'\) and no "):
            with claimed(tmp_path, RUN, **options):
                pass
    assert files(tmp_path) == {"notes.txt": b"mine"}


def test_overwrite_or_resume_refuses_a_foreign_file_unless_the_layout_keeps_it(tmp_path):
    with claimed(tmp_path, RUN):
        (tmp_path / "config.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    before = files(tmp_path)
    for options in ({"resume": True}, {"overwrite": True}):
        with pytest.raises(
            OutFolderError, match="must hold only the run's files to be replaced or resumed; got "
        ):
            with claimed(tmp_path, RUN, **options):
                pass
    assert files(tmp_path) == before
    keeping = dataclasses.replace(RUN, keeps_foreign=True)
    with claimed(tmp_path, keeping, overwrite=True):
        pass
    assert files(tmp_path) == {RUN.marker: b"", "notes.txt": b"mine"}


def test_resume_continues_what_is_there_and_starts_afresh_without_it(tmp_path):
    out = tmp_path / "run"
    with claimed(out, RUN, resume=True) as claim:  # nothing to continue: a new run
        assert not claim.resumed
        (out / "config.json").write_text("{}")  # stopped before its store existed
    with claimed(out, RUN, resume=True) as claim:
        assert not claim.resumed and not (out / "config.json").exists()  # starts again
        (out / "trajectory.zarr").mkdir()
    with claimed(out, RUN, resume=True) as claim:
        assert claim.resumed and (out / "trajectory.zarr").is_dir()


def test_resume_and_overwrite_together_are_refused_before_anything_is_made(tmp_path):
    with pytest.raises(OutFolderError, match="`--resume` and `--overwrite` must not be given together"):
        with claimed(tmp_path / "new", RUN, resume=True, overwrite=True):
            pass
    assert not (tmp_path / "new").exists()


def test_discard_leaves_nothing_not_even_the_folder_it_made(tmp_path):
    out = tmp_path / "run"
    with claimed(out, RUN) as claim:
        (out / "config.json").write_text("{}")
        (out / ".metrics.json.0123abcd.tmp").write_text("")  # a killed write's temporary file
        claim.discard()
    assert not out.exists()
    (tmp_path / "kept").mkdir()
    with claimed(tmp_path / "kept", RUN) as claim:
        claim.discard()
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())


def test_the_command_s_own_check_runs_on_a_resumed_folder_before_anything_changes(tmp_path):
    with claimed(tmp_path, RUN):
        (tmp_path / "trajectory.zarr").mkdir()

    def refuse(folder):
        raise OutFolderError(
            f"--resume: the settings must be those of the run in {str(folder)!r}; got others."
        )

    with pytest.raises(OutFolderError, match="the settings must be those of the run"):
        with claimed(tmp_path, RUN, resume=True, check=refuse):
            pass
    assert (tmp_path / "trajectory.zarr").is_dir()


def test_an_impossible_out_is_refused_before_the_claim(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutFolderError, match=r"--out: Not a directory"):
        with claimed(tmp_path / "file" / "run", RUN):
            pass
    assert run_folder.in_use(tmp_path / "absent") is False


def test_ctrl_c_inside_the_claim_leaves_a_new_folder_as_it_was(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_folder, "check_claim", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with claimed(tmp_path / "run", RUN):
            pass
    assert not (tmp_path / "run").exists()
