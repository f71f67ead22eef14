"""Fault injection for ``attnflow run``: kills at random moments, concurrent writers, read-only and
full disks. Prints a summary table (tried / intact / lost / tracebacks) as Markdown.

    PYTHONPATH=src python scripts/fault_injection.py [--kills 4] [--seed 0] [--out docs/faults_table.md]

Each scenario runs the real command line in subprocesses and checks what the folder says:

- SIGKILL / SIGINT at a random moment, then ``--resume`` (or ``--overwrite`` when the kill came
  before the store existed): intact when every snapshot kept before the resume is bitwise the
  uninterrupted run's, and the resumed run's final store is bitwise the uninterrupted one
  (SIGINT also: exit 130, one line on stderr, metrics.json says ``interrupted``).
- SIGINT while the command starts (importing attnflow and JAX): intact when it exits 130 with
  one line on stderr and writes nothing.
- Two runs into one ``--out`` at the same moment: intact when exactly one exits 0, the other
  exits 2 with one line, and the folder holds one finished run.
- A read-only folder and a full disk (a small tmpfs; needs root, skipped otherwise): intact
  when the read-only case exits 2 with one line and writes nothing, and the full disk's folder
  never claims ``ok`` unless the run is whole.

The cases of issue 27 (``--scenarios inputs,folders,readonly,reproduce,sweep,dashboard``; the
original ones are ``run``, and the default is all of them):

- Bad input at the edges (a FIFO, ``/dev/zero``, 5000-deep nesting, an empty file, a key the kind
  does not read, an integer past int64, an adaptive ``t_end = 1e12``, lenient option strings, a
  cache folder of another user): intact when the program exits 2 with one line within 5 s and
  200 MB (the command's own peak resident memory) and writes nothing.
- ``--overwrite`` into a folder holding a foreign file, ``--resume`` with another config, ``--out``
  through a symbolic link: intact when the refusals are one line with exit 2 and change nothing,
  and the run through the link is whole where the link points.
- A folder made read-only (chmod) mid-run, the run started without the capabilities that let
  root ignore permissions: intact when it exits 3 with one line, keeps a bitwise prefix, and,
  made writable again, ``--resume`` finishes bitwise.
- SIGKILL and SIGINT of ``reproduce`` mid-experiment, then ``--resume``; of a sweep's parent
  process, then the same sweep again; two sweeps into one folder at once: intact when the stopped
  command exited as documented (SIGINT: 130 and one line; a death by a signal is not) and every
  experiment or point is there once, with the values of an uninterrupted run.
- Another local user reaching the local cluster's HTTP port: intact when no port of the sweep's
  processes answers plain HTTP.

"Lost": a completed snapshot missing or different, a status that lies, or a second success.
Any ``Traceback`` on stderr is counted. The original cases run in about 3-5 minutes on 2 cores,
the new ones in about as long again.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from attnflow.io.run_folder import RUN
from attnflow.io.store import read_trajectory

MARKER = RUN.marker  # a run folder's marker (attnflow.io.run_folder)

CONFIG = """
[model]
n = 16
d = 3
[aux]
kind = "positions"
[gauge]
kind = "rope"
[solver]
dt = 0.005
t_end = 150.0
save_every = 0.5
"""


# what the installed `attnflow` command runs (pyproject's [project.scripts]), under its name: click
# names the program after sys.argv[0] in its messages ('attnflow reproduce: Invalid value ...', not '-c')
CONSOLE_SCRIPT = "import sys; sys.argv[0] = 'attnflow'; from attnflow_entry import main; sys.exit(main())"
STARTING_LINE = "interrupted while starting: nothing was done."


def attnflow(*args: str) -> list[str]:
    return [sys.executable, "-c", CONSOLE_SCRIPT, *args]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(attnflow(*args), capture_output=True, text=True, timeout=600)


def same_prefix(stored, reference) -> bool:
    k = stored.ts.size
    return bool(np.array_equal(stored.ts, reference.ts[:k]) and np.array_equal(stored.xs, reference.xs[:k]))


def whole(out: Path, reference) -> bool:
    stored = read_trajectory(out / "trajectory.zarr")
    metrics = json.loads((out / "metrics.json").read_text())
    return (
        stored.status == "ok"
        and metrics["run"]["status"] == "ok"
        and np.array_equal(stored.xs, reference.xs)
        and np.array_equal(stored.ts, reference.ts)
    )


def wait_for_snapshots(out: Path, count: int, process: subprocess.Popen) -> None:
    store = out / "trajectory.zarr"
    while process.poll() is None:
        with contextlib.suppress(Exception):  # the store may be half-created
            if store.exists() and read_trajectory(store).ts.size >= count:
                return
        time.sleep(0.02)


def kill_once(config: Path, out: Path, sig: int, delay: float | int, reference) -> tuple[bool, str]:
    """One kill and the recovery; returns (intact, stderr of every process). ``delay``: seconds
    after the start (a float), or the number of stored snapshots to wait for (an int)."""
    command = attnflow("run", str(config), "--out", str(out))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if isinstance(delay, int):
        wait_for_snapshots(out, delay, process)
    else:
        time.sleep(delay)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)
    intact = True
    if sig == signal.SIGINT and process.returncode == 130:
        lines = stderr.strip().splitlines()
        intact &= len(lines) == 1
        if lines[0] == STARTING_LINE or lines[0].startswith("interrupted before the run started"):
            intact &= not (out / MARKER).exists()  # nothing written
        else:
            metrics = json.loads((out / "metrics.json").read_text())
            intact &= lines[0].startswith("interrupted: kept")
            intact &= metrics["run"]["status"] == "interrupted"
    store = out / "trajectory.zarr"
    kept = read_trajectory(store).ts.size if store.exists() else 0
    if (out / MARKER).exists():  # the run had claimed its folder: continue it
        intact &= not store.exists() or same_prefix(read_trajectory(store), reference)
        recovery = run("run", str(config), "--out", str(out), "--resume")
    else:  # stopped before it claimed the folder: run it again
        recovery = run("run", str(config), "--out", str(out))
    intact &= recovery.returncode == 0 and whole(out, reference)
    moment = f"at snapshot {delay}" if isinstance(delay, int) else f"after {delay:.1f} s"
    print(f"  {sig.name} {moment}: exit {process.returncode}, {kept} snapshots kept", flush=True)
    return intact, stderr + recovery.stderr


def start_interrupted_once(config: Path, out: Path, delay: float) -> tuple[bool, str]:
    """SIGINT while the command starts (importing attnflow and JAX, reading the config): intact
    when it exits 130 with one line and, unless the run had claimed its folder, writes nothing."""
    process = subprocess.Popen(
        attnflow("run", str(config), "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    lines = stderr.strip().splitlines()
    intact = process.returncode == 130 and len(lines) == 1
    if intact and lines[0] in (STARTING_LINE, "interrupted before the run started: nothing was written."):
        intact &= not out.exists()
    print(f"  SIGINT after {delay:.2f} s: exit {process.returncode}, {lines[:1]}", flush=True)
    return intact, stderr


def concurrent_once(config: Path, out: Path, reference) -> tuple[bool, str]:
    processes = [
        subprocess.Popen(
            attnflow("run", str(config), "--out", str(out)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in processes]
    codes = sorted(code for code, _ in results)
    refused = [err for code, err in results if code == 2]
    intact = codes == [0, 2] and refused[0].count("\n") == 1 and whole(out, reference)
    return intact, "".join(err for _, err in results)


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *, read_only: bool = False):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def read_only_once(config: Path, root: Path) -> tuple[bool, str]:
    with tmpfs(root / "ro", "1m", read_only=True) as folder:
        result = run("run", str(config), "--out", str(folder / "run"))
        intact = result.returncode == 2 and result.stderr.count("\n") == 1 and not any(folder.iterdir())
    return intact, result.stderr


def full_disk_once(config: Path, root: Path, size: str) -> tuple[bool, str]:
    """The run fills a small disk (while storing or while drawing): the folder must not say ``ok``
    unless the store is whole, and every kept snapshot must be readable."""
    with tmpfs(root / f"full-{size}", size) as folder:
        out = folder / "run"
        result = run("run", str(config), "--out", str(out))
        stored = read_trajectory(out / "trajectory.zarr") if (out / "trajectory.zarr").exists() else None
        metrics_path = out / "metrics.json"
        status = json.loads(metrics_path.read_text())["run"]["status"] if metrics_path.exists() else None
        says_ok = status == "ok" or (stored is not None and stored.status == "ok")
        truthful = (result.returncode == 0) == says_ok
        if says_ok:
            truthful &= stored is not None and stored.ts.size == 301 and (out / "figures").is_dir()
        else:
            truthful &= result.returncode != 0
        kept = 0 if stored is None else stored.ts.size
        print(
            f"  disk of {size}: exit {result.returncode}, status {status}, {kept} snapshots kept", flush=True
        )
    return truthful, result.stderr


# --- issue 27: inputs at the edges ---------------------------------------------------------------

MAX_SECONDS, MAX_KIB = 5.0, 200 * 1024  # the acceptance bounds of a refusal


# a small process starts the command and reports the command's own peak (a child forked from this
# script would count this script's memory until it execs)
_PROBE = (
    "import json, resource, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
    "seconds = time.perf_counter() - start\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(json.dumps([done.returncode, seconds, peak, done.stderr]))\n"
)


def measured(args: list[str], cwd: Path, env: dict | None = None) -> tuple[int, float, int, str]:
    """Exit code, wall seconds, peak resident KiB of the command, stderr."""
    env = dict(os.environ if env is None else env)
    paths = env.get("PYTHONPATH", "").split(os.pathsep)  # absolute: the process runs in ``cwd``
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(path) for path in paths if path)
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    code, seconds, peak, stderr = json.loads(probe.stdout)
    return code, seconds, peak, stderr


def edge_inputs(folder: Path) -> list[tuple[str, list[str], dict | None]]:
    """(name, arguments, environment) of each bad input of issue 27, made in ``folder``."""
    small = "[model]\nn = 8\n[solver]\nt_end = 1.0\nsave_every = 0.5\n"
    files = {
        "deep.toml": "[model]\nn = " + "[" * 5000 + "]" * 5000 + "\n",
        "empty.toml": "",
        "ignored.toml": small + '[factor]\nkind = "none"\npath = "w.npy"\n',
        "int64.toml": small.replace("t_end", "block_size = 18446744073709551616\nt_end"),
        "adaptive.toml": '[model]\nn = 8\n[solver]\nmethod = "adaptive"\nt_end = 1e12\n',
        "small.toml": small,
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    os.mkfifo(folder / "fifo.toml")
    out = ["--out", str(folder / "out")]
    cases = [
        ("a FIFO as the config", ["run", "fifo.toml", *out], None),
        ("/dev/zero as the config", ["run", "/dev/zero", *out], None),
        ("5000-deep nesting", ["run", "deep.toml", *out], None),
        ("an empty config", ["run", "empty.toml", *out], None),
        ("factor.path with kind none", ["run", "ignored.toml", *out], None),
        ("block_size past int64", ["run", "int64.toml", *out], None),
        ("adaptive t_end = 1e12", ["run", "adaptive.toml", *out], None),
        (
            "--continue of 1e18 values",
            ["landscape", "small.toml", *out, "--continue", "model.beta=0:1e9:1e-9"],
            None,
        ),
        ("--only E1,,E2", ["reproduce", "--only", "E1,,E2", *out], None),
        ("--sizes 64,", ["reproduce", "--sizes", "64,", *out], None),
        ("--seeds 99999999999999999999", ["reproduce", "--seeds", "99999999999999999999", *out], None),
    ]
    if os.geteuid() == 0:  # a cache folder of another user
        foreign = folder / "foreign-cache"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 54321, -1)
        env = {**os.environ, "ATTNFLOW_CACHE_DIR": str(foreign)}
        for command in (["run", "small.toml"], ["reproduce", "--only", "E0"]):
            cases.append((f"a foreign ATTNFLOW_CACHE_DIR ({command[0]})", [*command, *out], env))
    return cases


def inputs_once(root: Path) -> list[tuple[str, bool, str]]:
    folder = root / "inputs"
    folder.mkdir()
    results = []
    for name, args, env in edge_inputs(folder):
        before = sorted(p.name for p in folder.iterdir())
        code, seconds, peak, stderr = measured(attnflow(*args), folder, env)
        lines = stderr.strip().splitlines()
        intact = code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
        intact &= seconds < MAX_SECONDS and peak < MAX_KIB
        intact &= sorted(p.name for p in folder.iterdir()) == before
        print(f"  {name}: exit {code}, {seconds:.2f} s, {peak / 1024:.0f} MB: {lines[:1]}", flush=True)
        results.append((name, intact, stderr))
    return results


# --- issue 27: run folders ------------------------------------------------------------------------

SHORT = CONFIG.replace("t_end = 150.0", "t_end = 10.0")  # 21 snapshots


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` by relative path, with its bytes (to show that nothing changed)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_refusal(result: subprocess.CompletedProcess) -> bool:
    lines = result.stderr.strip().splitlines()
    return result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")


def folders_once(root: Path) -> list[tuple[str, bool, str]]:
    base = root / "folders"
    base.mkdir()
    config = base / "short.toml"
    config.write_text(SHORT)
    out = base / "run"
    first = run("run", str(config), "--out", str(out))
    assert first.returncode == 0, first.stderr
    results = []

    (out / "notes.txt").write_text("the user's own file\n")
    before = snapshot(out)
    overwrite = run("run", str(config), "--out", str(out), "--overwrite")
    intact = one_line_refusal(overwrite) and snapshot(out) == before
    print(f"  --overwrite with a foreign file: exit {overwrite.returncode}: {overwrite.stderr.strip()[:160]}")
    results.append(("--overwrite into a folder holding a foreign file", intact, overwrite.stderr))
    (out / "notes.txt").unlink()

    before = snapshot(out)
    other = run("run", str(config), "--out", str(out), "--resume", "--set", "model.beta=2.0")
    intact = one_line_refusal(other) and snapshot(out) == before
    print(f"  --resume with another config: exit {other.returncode}: {other.stderr.strip()[:160]}")
    results.append(("--resume into the folder of another config", intact, other.stderr))

    reference = read_trajectory(out / "trajectory.zarr")
    target, link = base / "target", base / "link"
    target.mkdir()
    link.symlink_to(target, target_is_directory=True)
    through = run("run", str(config), "--out", str(link))
    if through.returncode == 0:
        intact = whole(target, reference) and link.is_symlink()
    else:
        intact = one_line_refusal(through) and not any(target.iterdir())
    print(f"  --out through a symbolic link: exit {through.returncode}: {through.stderr.strip()[:160]}")
    results.append(("--out through a symbolic link", intact, through.stderr))

    small = base / "small.toml"  # landscape: the same folder rules (attnflow.io.run_folder)
    small.write_text("[model]\nn = 8\n[solver]\nt_end = 1.0\nsave_every = 0.5\n")
    scape = base / "landscape"
    done = run("landscape", str(small), "--out", str(scape), "--starts", "1")
    before = snapshot(scape)
    again = run("landscape", str(small), "--out", str(scape), "--starts", "1")
    intact = done.returncode == 0 and one_line_refusal(again) and snapshot(scape) == before
    replaced = run("landscape", str(small), "--out", str(scape), "--starts", "1", "--overwrite")
    intact &= replaced.returncode == 0 and sorted(snapshot(scape)) == sorted(before)
    print(f"  landscape into its earlier folder: exit {again.returncode}: {again.stderr.strip()[:160]}; "
          f"--overwrite: exit {replaced.returncode}")  # fmt: skip
    results.append(
        ("landscape into an earlier folder, then --overwrite", intact, again.stderr + replaced.stderr)
    )
    return results


_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_CAPBSET_DROP = 24
_DAC_CAPS = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def _without_dac_override() -> None:  # preexec_fn: from exec on, root obeys file permissions
    for cap in _DAC_CAPS:
        if _LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _chmod_tree(folder: Path, mode: int) -> None:
    for path, _, _ in os.walk(folder):
        os.chmod(path, mode)


def read_only_mid_run_once(config: Path, root: Path, reference, delay: int) -> tuple[bool, str]:
    """The run folder made read-only after ``delay`` snapshots: exit 3, one line, a bitwise prefix
    kept; made writable again, ``--resume`` finishes bitwise."""
    out = root / f"ro-mid-{delay}"
    process = subprocess.Popen(
        attnflow("run", str(config), "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_without_dac_override,
    )
    wait_for_snapshots(out, delay, process)
    _chmod_tree(out, 0o555)
    _, stderr = process.communicate(timeout=300)
    _chmod_tree(out, 0o755)
    lines = stderr.strip().splitlines()
    store = out / "trajectory.zarr"
    kept = read_trajectory(store).ts.size if store.exists() else 0
    finished_first = process.returncode == 0  # the run ended before the chmod took effect
    intact = finished_first or (
        process.returncode == 3 and len(lines) == 1 and lines[0].startswith("error: ")
    )
    intact &= not store.exists() or same_prefix(read_trajectory(store), reference)
    recovery = run("run", str(config), "--out", str(out), "--resume")
    intact &= recovery.returncode == 0 and whole(out, reference)
    print(f"  read-only at snapshot {delay}: exit {process.returncode}, {kept} kept: {lines[:1]}", flush=True)
    return intact, stderr + recovery.stderr


# --- issue 27: reproduce and sweeps ---------------------------------------------------------------


# three experiments of a few seconds each at n = 8: a kill after the first lands in the second
def stopped_as_documented(sig: int, code: int, stderr: str, *, finished: int) -> bool:
    """SIGKILL: killed (-9), or done before it arrived (``finished``). SIGINT: exit 130 with one
    line, or ``finished``; a death by a signal (-2, -11) or any other code is not as documented."""
    if code == finished:
        return True
    if sig == signal.SIGKILL:
        return code == -signal.SIGKILL
    lines = stderr.strip().splitlines()
    if code != 130 or len(lines) != 1:
        print(f"    not as documented: exit {code}, stderr ends {stderr.strip()[-600:]!r}", flush=True)
        return False
    return True


REPRODUCE = ("reproduce", "--quick", "--only", "E0,E3,E7", "--sizes", "8", "--seeds", "1", "--workers", "1")


def reproduce_outcome(folder: Path) -> dict:
    """Each experiment's expectations (status, measured) and final metrics: no timings."""
    results = json.loads((folder / "results.json").read_text())
    outcome = {}
    for name, experiment in results["experiments"].items():
        expectations = [(e["text"], e["status"], e["measured"]) for e in experiment["expectations"]]
        finals = [[seed["final"] for seed in run_["per_seed"]] for run_ in experiment["runs"]]
        outcome[name] = (experiment["status"], expectations, finals)
    return outcome


def reproduce_killed_once(root: Path, sig: int, delay: float, reference: dict, code: int) -> tuple[bool, str]:
    """``sig`` ``delay`` seconds after the start (the jobs run before any experiment is written)."""
    out = root / f"reproduce-{sig.name}-{delay:.1f}"
    process = subprocess.Popen(attnflow(*REPRODUCE, "--out", str(out)), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(delay)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=300)
    intact = stopped_as_documented(sig, process.returncode, stderr, finished=code)
    experiments = out / "experiments"
    kept = sorted(p.stem for p in experiments.glob("*.json")) if experiments.exists() else []
    resumed = run(*REPRODUCE, "--out", str(out), "--resume")
    if resumed.returncode == 2 and not (out / "experiments").exists():  # stopped before it started
        resumed = run(*REPRODUCE, "--out", str(out))
    intact &= resumed.returncode == code and reproduce_outcome(out) == reference
    print(f"  reproduce {sig.name} after {delay:.1f} s: exit {process.returncode}, kept {kept}; resumed: "
          f"exit {resumed.returncode}", flush=True)  # fmt: skip
    return intact, stderr + resumed.stderr


SWEEP_CONFIG = "[model]\nn = 8\n[solver]\nt_end = 1.0\nsave_every = 0.5\n"
SWEEP_GRID = ("--grid", "model.beta=0.5,1,1.5,2")
VOLATILE = {"wall_time_s"}


def sweep_rows(folder: Path) -> list[dict]:
    with (folder / "results.csv").open() as file:
        return [{k: v for k, v in row.items() if k not in VOLATILE} for row in csv.DictReader(file)]


def sweep_once_more(config: Path, out: Path) -> subprocess.CompletedProcess:
    return run("sweep", str(config), *SWEEP_GRID, "--out", str(out), "--workers", "1")


def each_point_once(out: Path, reference: list[dict]) -> bool:
    rows = sweep_rows(out)
    hashes = [row["hash"] for row in rows]
    by_hash = {row["hash"]: row for row in reference}
    return len(hashes) == len(set(hashes)) == len(reference) and all(
        row == by_hash[row["hash"]] for row in rows
    )


def sweep_killed_once(config: Path, root: Path, sig: int, k: int, reference: list[dict]) -> tuple[bool, str]:
    out = root / f"sweep-{sig.name}-{k}"
    args = attnflow("sweep", str(config), *SWEEP_GRID, "--out", str(out), "--workers", "1")
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    runs = out / "runs"
    while process.poll() is None and not (
        runs.exists() and any(p.suffix != ".partial" for p in runs.iterdir())
    ):
        time.sleep(0.05)  # mid-sweep: after the first finished point
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=300)
    time.sleep(2)  # the workers die with their parent
    again = sweep_once_more(config, out)
    intact = stopped_as_documented(sig, process.returncode, stderr, finished=0)
    intact &= again.returncode == 0 and each_point_once(out, reference)
    print(f"  sweep {sig.name}: exit {process.returncode}; again: exit {again.returncode}", flush=True)
    return intact, stderr + again.stderr


def sweeps_at_once(config: Path, root: Path, reference: list[dict]) -> tuple[bool, str]:
    out = root / "sweep-pair"
    args = attnflow("sweep", str(config), *SWEEP_GRID, "--out", str(out), "--workers", "1")
    processes = [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]  # fmt: skip
    results = [(p.wait(timeout=600), p.stderr.read()) for p in processes]
    codes = sorted(code for code, _ in results)
    refusals_one_line = all(err.strip().count("\n") == 0 for code, err in results if code == 2)
    intact = codes in ([0, 0], [0, 2]) and refusals_one_line and each_point_once(out, reference)
    print(f"  two sweeps into one folder: exits {codes}", flush=True)
    return intact, "".join(err for _, err in results)


def dashboard_once(config: Path, root: Path) -> tuple[bool, str]:
    """Plain HTTP to every port the sweep's processes listen on (any local user can connect to
    127.0.0.1): intact when none answers."""
    import urllib.error
    import urllib.request

    import psutil

    out = root / "sweep-dashboard"
    grid = ("--grid", "model.beta=" + ",".join(str(0.5 + k / 4) for k in range(12)))
    args = attnflow("sweep", str(config), *grid, "--out", str(out), "--workers", "1")
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ports: set[int] = set()
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None and not (out / "runs").exists():
        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
            for proc in tree:
                with contextlib.suppress(psutil.Error):
                    ports |= {
                        c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                    }
        time.sleep(0.2)
    answered = []
    for port in sorted(ports):
        for path in ("/health", "/info/main/workers.html", "/json/identity.json"):
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
                    answered.append(f"{port}{path} {response.status}")
    _, stderr = process.communicate(timeout=600)
    print(f"  listening ports {sorted(ports)}; answered plain HTTP: {answered}", flush=True)
    return not answered, stderr


SCENARIOS = ("run", "inputs", "folders", "readonly", "reproduce", "sweep", "dashboard")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kills", type=int, default=4, help="SIGKILLs (and as many SIGINTs) at random moments"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma-separated groups of {', '.join(SCENARIOS)}"
    )
    args = parser.parse_args()
    chosen = set(args.scenarios.split(","))
    if not chosen <= set(SCENARIOS):
        parser.error(f"--scenarios: unknown {sorted(chosen - set(SCENARIOS))}; choose from {SCENARIOS}")
    rng = random.Random(args.seed)
    rows: dict[str, list[int]] = {}  # scenario -> [tried, intact, lost, tracebacks]

    def record(name: str, intact: bool, stderr: str) -> None:
        row = rows.setdefault(name, [0, 0, 0, 0])
        row[0] += 1
        row[1] += int(intact)
        row[2] += int(not intact)
        row[3] += int("Traceback" in stderr)
        print(f"{name}: {'intact' if intact else 'LOST'}", flush=True)

    root = Path(tempfile.mkdtemp(prefix="attnflow-faults-"))
    try:
        config = root / "run.toml"
        config.write_text(CONFIG)
        start = time.perf_counter()
        done = run("run", str(config), "--out", str(root / "reference"))
        wall = time.perf_counter() - start
        assert done.returncode == 0, done.stderr
        reference = read_trajectory(root / "reference" / "trajectory.zarr")
        issue_27(chosen, config, root, reference, record, rng)
        kills = args.kills if "run" in chosen else 0
        for sig, name in ((signal.SIGKILL, "SIGKILL at a random moment, then --resume"),
                          (signal.SIGINT, "SIGINT at a random moment, then --resume")):  # fmt: skip
            for k in range(kills):
                # a random moment in time (imports, build, compilation included), or in the snapshots
                delay = rng.uniform(0.5, 0.8 * wall) if k % 2 == 0 else rng.randint(1, 300)
                record(name, *kill_once(config, root / f"{sig.name}-{k}", sig, delay, reference))
        for k in range(kills):
            delay = rng.uniform(0.05, 2.0)
            record(
                "SIGINT while the command starts", *start_interrupted_once(config, root / f"start-{k}", delay)
            )
        for k in range(2 if kills else 0):
            record("two runs into one --out at once", *concurrent_once(config, root / f"pair-{k}", reference))
        if not kills:
            pass  # the original cases not chosen
        elif os.geteuid() == 0 and shutil.which("mount"):
            record("read-only folder (tmpfs, ro)", *read_only_once(config, root))
            for size in ("120k", "400k"):  # full while storing; full while drawing the figures
                record("full disk (small tmpfs)", *full_disk_once(config, root, size))
        else:
            print("read-only and full disks skipped: mounting a tmpfs needs root", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [
        "| scenario | tried | intact | lost | tracebacks |",
        "|---|---:|---:|---:|---:|",
        *(f"| {name} | {t} | {i} | {lost} | {tb} |" for name, (t, i, lost, tb) in rows.items()),
    ]
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    sys.exit(0 if all(row[2] == 0 and row[3] == 0 for row in rows.values()) else 1)


def issue_27(chosen: set[str], config: Path, root: Path, reference, record, rng: random.Random) -> None:
    """The fault cases of issue 27, by group (see the module docstring)."""
    if "inputs" in chosen:
        for _name, intact, stderr in inputs_once(root):
            record("bad input at the edges (FIFO, /dev/zero, nesting, empty, ignored key, int64, options)",
                   intact, stderr)  # fmt: skip
    if "folders" in chosen:
        for name, intact, stderr in folders_once(root):
            record(name, intact, stderr)
    if "readonly" in chosen:
        if os.geteuid() == 0:
            for delay in (rng.randint(5, 150), rng.randint(150, 290)):
                record("folder made read-only mid-run, then --resume",
                       *read_only_mid_run_once(config, root, reference, delay))  # fmt: skip
        else:
            print("read-only mid-run skipped: dropping root's permission override needs root", flush=True)
    if "reproduce" in chosen:
        out = root / "reproduce-reference"
        start = time.perf_counter()
        done = run(*REPRODUCE, "--out", str(out))
        wall = time.perf_counter() - start
        assert done.returncode in (0, 1), done.stderr
        outcome = reproduce_outcome(out)
        for sig in (signal.SIGKILL, signal.SIGINT):
            for fraction in (rng.uniform(0.3, 0.55), rng.uniform(0.55, 0.8)):  # in the jobs
                trial = reproduce_killed_once(root, sig, fraction * wall, outcome, done.returncode)
                record(f"{sig.name} of reproduce mid-experiment, then --resume", *trial)
    if "sweep" in chosen or "dashboard" in chosen:
        sweep_config = root / "sweep.toml"
        sweep_config.write_text(SWEEP_CONFIG)
    if "sweep" in chosen:
        done = sweep_once_more(sweep_config, root / "sweep-reference")
        assert done.returncode == 0, done.stderr
        rows = sweep_rows(root / "sweep-reference")
        for sig in (signal.SIGKILL, signal.SIGINT):
            record(f"{sig.name} of a sweep's parent, then the sweep again",
                   *sweep_killed_once(sweep_config, root, sig, 0, rows))  # fmt: skip
        record("two sweeps into one folder at once", *sweeps_at_once(sweep_config, root, rows))
    if "dashboard" in chosen:
        record(
            "another local user reaching the local cluster's HTTP port", *dashboard_once(sweep_config, root)
        )


if __name__ == "__main__":
    main()
