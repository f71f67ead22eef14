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

"Lost": a completed snapshot missing or different, a status that lies, or a second success.
Any ``Traceback`` on stderr is counted. Runs in about 3-5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
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

from attnflow.io.store import read_trajectory
from attnflow.workflows.run import MARKER

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


# what the installed `attnflow` command runs (pyproject's [project.scripts])
CONSOLE_SCRIPT = "import sys; from attnflow_entry import main; sys.exit(main())"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kills", type=int, default=4, help="SIGKILLs (and as many SIGINTs) at random moments"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args()
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
        for sig, name in ((signal.SIGKILL, "SIGKILL at a random moment, then --resume"),
                          (signal.SIGINT, "SIGINT at a random moment, then --resume")):  # fmt: skip
            for k in range(args.kills):
                # a random moment in time (imports, build, compilation included), or in the snapshots
                delay = rng.uniform(0.5, 0.8 * wall) if k % 2 == 0 else rng.randint(1, 300)
                record(name, *kill_once(config, root / f"{sig.name}-{k}", sig, delay, reference))
        for k in range(args.kills):
            delay = rng.uniform(0.05, 2.0)
            record(
                "SIGINT while the command starts", *start_interrupted_once(config, root / f"start-{k}", delay)
            )
        for k in range(2):
            record("two runs into one --out at once", *concurrent_once(config, root / f"pair-{k}", reference))
        if os.geteuid() == 0 and shutil.which("mount"):
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


if __name__ == "__main__":
    main()
