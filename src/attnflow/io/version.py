"""The package version, written into every file attnflow produces (kept equal to pyproject.toml's)."""

__version__ = "0.1.0"
