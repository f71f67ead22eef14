"""Where and when a study ran: what its ``results.json`` records beside its rows (the date, the
machine, the load average, and the CPU and wall seconds since the study started), so that its
numbers are read against the machine that made them."""

from __future__ import annotations

import datetime
import os
import platform
import time

__all__ = ["StudyClock"]


class StudyClock:
    """Started when made; :meth:`record` is the study's provenance at the moment it is called."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def record(self) -> dict:
        """``date`` (UTC, ISO), ``machine`` (platform, processor, cores), ``cpu_s`` (this process),
        ``wall_s`` and ``load`` (1, 5 and 15 minute load averages)."""
        return {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": {
                "platform": platform.platform(),
                "processor": platform.machine(),
                "cpus": os.cpu_count(),
            },
            "cpu_s": time.process_time() - self.cpu,
            "wall_s": time.perf_counter() - self.wall,
            "load": os.getloadavg(),
        }
