"""Rules that tie the library's parameters together, each written once, as data.

A :class:`Rule` names the parameter it constrains under the library's own name (``save_every``),
decides with a predicate on plain numbers whether a value keeps it, and says the constraint in
the library's one error template::

    {where}: `{name}` must be {constraint}; got {value!r}.

This module imports nothing (no JAX, no NumPy), so that one rule serves both sides: the library
checks it where its objects are made (:mod:`attnflow.numerics.saving`,
:mod:`attnflow.core.gauges`), and a config checks the very same rule before anything is
imported, naming its keys instead of the parameters (:func:`attnflow.io.parameters.check_rule`).

- :data:`SAVE_EVERY`: snapshots fall on steps, ``save_every`` a whole multiple of ``dt``;
- :data:`T_END`: the run ends on a snapshot, ``t_end`` a whole multiple of ``save_every``;
- :data:`FREQUENCIES`: RoPE has at most one frequency per coordinate pair, ``d // 2``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FREQUENCIES", "SAVE_EVERY", "T_END", "TIME_GRID", "Rule", "whole_steps"]

WHOLE_RTOL = 1e-9  # relative slack of "a whole multiple" (decimal steps such as 0.1 are not exact)


def whole_steps(total: float, step: float) -> int | None:
    """``total / step`` when it is a whole number >= 1 (to :data:`WHOLE_RTOL`), else None."""
    ratio = total / step
    if not math.isfinite(ratio):  # a step far below the total: no float grid reaches it
        return None
    k = int(round(ratio))  # a Python int whatever the scalar type (NumPy, a concrete JAX value)
    return k if k >= 1 and abs(ratio - k) <= WHOLE_RTOL * max(1.0, ratio) else None


class _Names(dict):
    """How a message names a parameter: as given, else by the library's own name."""

    def __missing__(self, key: str) -> str:
        return key


@dataclasses.dataclass(frozen=True)
class Rule:
    """``parameter`` must keep ``holds(value, **others)``; ``says(name, **others)`` is the
    constraint in words, where ``name(p)`` is how the message names another parameter ``p``."""

    parameter: str
    holds: Callable[..., bool]
    says: Callable[..., str]

    def broken(self, value: Any, *, names: Mapping[str, str] | None = None, **others: Any) -> str | None:
        """The constraint in words if ``value`` breaks it (None if it keeps it); ``names``: how
        parameters are named in it (a config's keys), the library's names by default."""
        if self.holds(value, **others):
            return None
        return self.says(_Names(names or {}).__getitem__, **others)

    def check(self, value: Any, *, where: str, shown: Any = None, **others: Any) -> None:
        """Raise ``ValueError`` in the template unless ``value`` keeps the rule (``shown``: the
        value as the message shows it, ``value`` by default)."""
        constraint = self.broken(value, **others)
        if constraint is not None:
            shown = value if shown is None else shown
            raise ValueError(f"{where}: `{self.parameter}` must be {constraint}; got {shown!r}.")


SAVE_EVERY = Rule(
    "save_every",
    holds=lambda save_every, dt: whole_steps(save_every, dt) is not None,
    says=lambda name, dt: f"a whole multiple of `{name('dt')}` = {dt!r}",
)
T_END = Rule(
    "t_end",
    holds=lambda t_end, save_every: whole_steps(t_end, save_every) is not None,
    says=lambda name, save_every: f"a whole multiple of `{name('save_every')}` = {save_every!r}",
)
TIME_GRID = {"save_every": SAVE_EVERY, "t_end": T_END}  # by the parameter each constrains

FREQUENCIES = Rule(
    "frequencies",
    holds=lambda frequencies, d: len(frequencies) <= d // 2,
    says=lambda name, d: f"at most `{name('d')}` // 2 = {d // 2} (one frequency per coordinate pair)",
)
