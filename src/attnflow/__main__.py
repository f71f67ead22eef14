"""``python -m attnflow``: the ``attnflow`` command (the package is imported before this runs)."""

from attnflow_entry import main

main()
