"""Option strings checked at the command line: bounded in length and count, strict (no empty items).

Each check raises ``ValueError`` with one line in the template
``{command}: `{option}` must be {constraint}; got {value!r}.`` (exit code 2, before anything is
read or written) and returns what the library's own parser then reads:

- ``--only E1,E3``: experiment ids, no empty item, none twice (:func:`only_text`);
- ``--sizes 64,128``: token counts in ``[2, MAX_TOKENS]``, no empty item (:func:`sizes_text`);
- ``--continue KEY=START:STOP:STEP``: at most :data:`MAX_CONTINUATION_POINTS` values
  (:func:`continuation_text`);
- ``--grid KEY=V1,V2,...``: at most :data:`MAX_GRID_OPTIONS` options; with ``--yes``, a grid of at
  most :data:`MAX_CONFIRMED_POINTS` points (:func:`check_grid_size`);
- every string at most :data:`MAX_CHARS` characters; counts (``--seeds``, ``--workers``,
  ``--starts``, ``animate``'s ``--fps``, ``--max-tokens``, ``--max-frames``) have an upper bound
  too (:func:`count_between`, a typer callback).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import typer

__all__ = [
    "at_most",
    "MAX_CHARS",
    "MAX_CONFIRMED_POINTS",
    "MAX_CONTINUATION_POINTS",
    "MAX_FPS",
    "MAX_FRAMES",
    "MAX_GRID_OPTIONS",
    "MAX_REALIZE_T_END",
    "MAX_SEEDS",
    "MAX_SHOWN_TOKENS",
    "MAX_STARTS",
    "MAX_TOKENS",
    "MAX_WORKERS",
    "check_grid_size",
    "continuation_text",
    "count_between",
    "grid_texts",
    "only_text",
    "positive_at_most",
    "sizes_text",
]

MAX_CHARS = 2**16  # one option's text (a --grid of a few generator matrices fits)
MAX_TOKENS = 2**24  # --sizes: 16 M tokens, beyond any run that fits a machine
MAX_SEEDS = 10_000  # --seeds: the experiments use at most tens
MAX_WORKERS = 1024  # --workers: processes on one machine
MAX_STARTS = 10_000  # landscape --starts: each a Newton solve
MAX_CONTINUATION_POINTS = 10_000  # landscape --continue: each point a Newton solve per state
MAX_GRID_OPTIONS = 32  # --grid options (axes) of one sweep
MAX_REALIZE_T_END = 1e6  # realize --t-end: at most 1e8 steps of its dt = 0.01, a run's step bound
MAX_FPS = 1000  # animate --fps
MAX_SHOWN_TOKENS = 10**6  # animate --max-tokens: points a browser or a GIF frame can draw
MAX_FRAMES = 10**5  # animate --max-frames
MAX_CONFIRMED_POINTS = 10**6  # a --yes grid: planning validates every point (~ms each)


def _fail(command: str, option: str, constraint: str, value: Any) -> ValueError:
    shown = value if not isinstance(value, str) or len(value) <= 200 else f"{len(value)} characters"
    return ValueError(f"{command}: `{option}` must be {constraint}; got {shown!r}.")


def _bounded(command: str, option: str, text: str) -> str:
    if len(text) > MAX_CHARS:
        raise _fail(command, option, f"at most {MAX_CHARS} characters", text)
    return text


def _items(command: str, option: str, text: str, what: str) -> list[str]:
    items = [item.strip() for item in _bounded(command, option, text).split(",")]
    if any(not item for item in items):
        raise _fail(command, option, f"a comma-separated list of {what} with no empty item", text)
    return items


def only_text(text: str | None) -> str | None:
    """``--only``: comma-separated ids, no empty item, none repeated (the ids are checked by the
    experiments' parser)."""
    if text is None:
        return None
    items = _items("reproduce", "--only", text, "experiment ids")
    repeated = next((item for i, item in enumerate(items) if item in items[:i]), None)
    if repeated is not None:
        raise _fail("reproduce", "--only", "a list of distinct experiment ids", text)
    return text


def sizes_text(text: str | None) -> str | None:
    """``--sizes``: comma-separated token counts, each an integer in ``[2, MAX_TOKENS]``."""
    if text is None:
        return None
    constraint = f"comma-separated token counts, integers in [2, {MAX_TOKENS}]"
    for item in _items("reproduce", "--sizes", text, "token counts"):
        if not re.fullmatch(r"[0-9]{1,9}", item) or not 2 <= int(item) <= MAX_TOKENS:
            raise _fail("reproduce", "--sizes", constraint, text)
    return text


_CONTINUATION = re.compile(r"\s*([\w.]+)\s*=\s*([^:]+):([^:]+):([^:]+)\s*")


def continuation_text(text: str | None) -> str | None:
    """``--continue KEY=START:STOP:STEP`` of at most ``MAX_CONTINUATION_POINTS`` values (the form
    itself is checked by the landscape's parser)."""
    if text is None:
        return None
    match = _CONTINUATION.fullmatch(_bounded("landscape", "--continue", text))
    if match is None:
        return text
    try:
        start, stop, step = (float(value) for value in match.groups()[1:])
    except ValueError:
        return text
    count = (stop - start) / step if step else math.nan
    if math.isfinite(count) and count + 1 > MAX_CONTINUATION_POINTS:
        raise _fail(
            "landscape",
            "--continue",
            f"at most {MAX_CONTINUATION_POINTS} values ((STOP - START) / STEP + 1; here {count + 1:.3g})",
            text,
        )
    return text


def grid_texts(texts: Sequence[str]) -> list[str]:
    """``--grid`` options: at most ``MAX_GRID_OPTIONS`` of them, each at most ``MAX_CHARS``."""
    if len(texts) > MAX_GRID_OPTIONS:
        raise _fail("sweep", "--grid", f"given at most {MAX_GRID_OPTIONS} times", f"{len(texts)} times")
    return [_bounded("sweep", "--grid", text) for text in texts]


def check_grid_size(sizes: Sequence[int]) -> None:
    """A confirmed (``--yes``) grid of at most ``MAX_CONFIRMED_POINTS`` points (``sizes``: the
    number of values of each axis)."""
    points = math.prod(sizes)
    if points > MAX_CONFIRMED_POINTS:
        shape = " x ".join(map(str, sizes))
        constraint = f"a grid of at most {MAX_CONFIRMED_POINTS} points"
        raise _fail("sweep", "--grid", constraint, f"{points} points ({shape})")


def count_between(low: int, high: int) -> Callable[[int | None], int | None]:
    """A typer callback: ``None`` or an integer in ``[low, high]``."""

    def check(value: int | None) -> int | None:
        if value is not None and not low <= value <= high:
            raise typer.BadParameter(f"must be an integer in [{low}, {high}]; got {value!r}.")
        return value

    return check


def at_most(high: int) -> Callable[[int | None], int | None]:
    """A typer callback: ``None`` or an integer of at most ``high`` (the lower bound is the library's)."""

    def check(value: int | None) -> int | None:
        if value is not None and value > high:
            raise typer.BadParameter(f"must be an integer <= {high}; got {value!r}.")
        return value

    return check


def positive_at_most(high: float, why: str) -> Callable[[float], float]:
    """A typer callback: a number in ``(0, high]`` (``why``: what the bound stands for)."""

    def check(value: float) -> float:
        if not 0 < value <= high:
            raise typer.BadParameter(f"must be > 0 and <= {high:g} ({why}); got {value!r}.")
        return value

    return check
