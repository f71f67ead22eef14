"""The layers of the package: imports go down only, no import circle, ``import attnflow`` stays light.

The layers, lowest first: core < numerics < analysis < io < viz < workflows < cli; the package's
``__init__`` and ``__main__`` are above them all. A module may import its own layer or a lower
one. Every import statement counts, at module level or inside a function (an import hidden in a
function is still a dependency), as does ``importlib.import_module("attnflow...")`` with a literal
name. The checker is a short AST walk (no dependency); ``check_layers`` returns one message per
violation, so a test can show it catches a forbidden import and a circle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import attnflow

LAYERS = ("core", "numerics", "analysis", "io", "viz", "workflows", "cli")
TOP = len(LAYERS)  # the package __init__ and __main__
HEAVY = ("matplotlib", "dask", "distributed", "zarr")


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package in ``root`` by dotted name (a package is its ``__init__``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def layer(module: str) -> int:
    """The rank of a module's layer (``TOP`` for the package itself and ``__main__``)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] not in LAYERS:
        return TOP
    return LAYERS.index(parts[1])


def _imports(path: Path, module: str, known: dict[str, Path]) -> list[tuple[int, str]]:
    """``(line, imported module)`` for every import of the package in ``path``, anywhere in it."""
    package = module.split(".")[0]
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            # "from a.b import c" imports the module a.b.c when there is one, else a.b
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        for name in names:
            if name == package or name.startswith(package + "."):
                while name not in known and "." in name:  # "import a.b.c" of a name inside a module
                    name = name.rsplit(".", 1)[0]
                found.append((node.lineno, name))
    return list(dict.fromkeys(found))  # "from a import b, c" of one module: once


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component with more than one module (or a self-import),
    as the path from its first module (alphabetical) back to it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            components.append(set(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for component in components:
        start = min(component)
        if len(component) == 1 and start not in graph[start]:
            continue
        path, seen = [start], {start}  # walk inside the component until back at the start
        while True:
            nexts = sorted(graph[path[-1]] & component)
            if start in nexts and (len(path) == len(component) or not set(nexts) - seen - {start}):
                break
            path.append(next(w for w in nexts if w not in seen))
            seen.add(path[-1])
        circles.append([*path, start])
    return sorted(circles)


def check_layers(root: Path, package: str = "attnflow") -> list[str]:
    """Every violation in the package at ``root``: an import of a higher layer (core is the lowest,
    so a core module importing anything outside core is one), and every import circle."""
    known = _modules(root, package)
    messages = []
    graph: dict[str, set[str]] = {module: set() for module in known}
    for module, path in known.items():
        for line, target in _imports(path, module, known):
            if target != module:
                graph[module].add(target)
            mine, theirs = layer(module), layer(target)
            if theirs > mine:
                messages.append(
                    f"{module}:{line}: imports {target}, a higher layer "
                    f"({_layer_name(theirs)} above {_layer_name(mine)})"
                )
    messages += ["import circle: " + " -> ".join(circle) for circle in _circles(graph)]
    return messages


def _layer_name(rank: int) -> str:
    return "the package" if rank == TOP else LAYERS[rank]


# --------------------------------------------------------------------------- the package


def test_attnflow_imports_go_down_only_and_have_no_circle():
    assert check_layers(Path(attnflow.__file__).parent) == []


def test_core_imports_nothing_else_of_attnflow():
    root = Path(attnflow.__file__).parent
    known = _modules(root, "attnflow")
    outside = [
        (module, target)
        for module, path in known.items()
        if layer(module) == 0
        for _, target in _imports(path, module, known)
        if layer(target) != 0
    ]
    assert outside == []
    assert any(layer(m) == 0 for m in known)  # the check saw the core modules


def test_import_attnflow_loads_no_plotting_dask_or_zarr():
    code = f"import sys, attnflow; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- the checker fails when it should


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_checker_reports_a_forbidden_import_and_a_circle(tmp_path):
    root = tmp_path / "pkg"
    _write(
        root,
        {
            "__init__.py": "from pkg.workflows import job\n",
            "core/__init__.py": "",
            "core/sphere.py": "import numpy\n\n\ndef f():\n    from pkg.viz import draw  # hidden\n",
            "numerics/__init__.py": "",
            "numerics/solve.py": "from pkg.numerics import step\n",
            "numerics/step.py": "def g():\n    from . import solve\n",
            "viz/__init__.py": "",
            "viz/draw.py": "from pkg.core import sphere\n",
            "io/__init__.py": "",
            "io/store.py": "import pkg\n",
            "workflows/__init__.py": "",
            "workflows/job.py": "import importlib\n\nimportlib.import_module('pkg.cli')\n",
            "cli.py": "from pkg.workflows import job\n",
        },
    )
    assert check_layers(root, "pkg") == [
        "pkg.core.sphere:5: imports pkg.viz.draw, a higher layer (viz above core)",
        "pkg.io.store:1: imports pkg, a higher layer (the package above io)",
        "pkg.workflows.job:3: imports pkg.cli, a higher layer (cli above workflows)",
        "import circle: pkg.cli -> pkg.workflows.job -> pkg.cli",
        "import circle: pkg.core.sphere -> pkg.viz.draw -> pkg.core.sphere",
        "import circle: pkg.numerics.solve -> pkg.numerics.step -> pkg.numerics.solve",
    ]
