"""The ``attnflow`` command line. Each command body is a few lines over the library.

Exit codes (``EXIT_CODES``): 0 done as asked; 1 ``reproduce`` ran but an expectation failed;
2 bad input (one line on stderr, nothing written); 3 a run started but did not finish as asked
(a non-finite state, a step limit, a failed sweep point: the run folder records why).
Bad input is a ``ValueError`` (``ConfigError`` included); any other exception keeps its traceback.
"""

from __future__ import annotations

import warnings

from attnflow.cli import configs, experiments, explore, simulate  # noqa: F401 - each adds its commands to `app`
from attnflow.cli.app import (
    EXIT_BAD_INPUT,
    EXIT_CODES,
    EXIT_EXPECTATION_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNFINISHED,
    app,
    one_line_warning,
    user_errors,
)

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CODES",
    "EXIT_EXPECTATION_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNFINISHED",
    "app",
    "main",
    "user_errors",
]


def main() -> None:
    """The program ``attnflow``: warnings are one line each (``warning: ...``) on stderr."""
    warnings.showwarning = one_line_warning
    app()
