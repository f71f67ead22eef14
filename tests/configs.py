"""Small valid configs shared by the tests: one base (16 tokens on S^2 with RoPE, 5 snapshots),
changed section by section, written as TOML."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

SMALL: dict[str, dict[str, Any]] = {
    "model": {"n": 16, "d": 3},
    "aux": {"kind": "positions"},
    "gauge": {"kind": "rope"},
    "solver": {"dt": 0.05, "t_end": 2.0, "save_every": 0.5},
}


def small_config(changes: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """``SMALL`` with ``changes`` (``{"solver": {"t_end": 4.0}}``) merged in, section by section."""
    merged = {section: dict(keys) for section, keys in SMALL.items()}
    for section, keys in (changes or {}).items():
        merged.setdefault(section, {}).update(keys)
    return merged


def toml_value(value: Any) -> str:
    """``value`` as a TOML value (booleans, integers, floats including inf/nan, strings, lists)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string (\uXXXX escapes are TOML too)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"toml_value: no TOML form for {value!r}")


def toml_text(config: dict[str, dict[str, Any]]) -> str:
    """``config`` (sections of keys) as TOML text."""
    lines = []
    for section, keys in config.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in keys.items())
    return "\n".join(lines) + "\n"


def small_toml(changes: dict[str, dict[str, Any]] | None = None) -> str:
    """The TOML text of :func:`small_config`."""
    return toml_text(small_config(changes))


def write_config(
    folder: Path, changes: dict[str, dict[str, Any]] | None = None, *, name: str = "small.toml"
) -> Path:
    """Write the TOML of :func:`small_config` into ``folder / name``; returns the path."""
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(small_toml(changes))
    return path
