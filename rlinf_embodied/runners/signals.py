"""Stop signals of a training run: Ctrl-C (SIGINT) and SIGTERM, duplicates tolerated.

Light on purpose (no Ray, no torch): the CLI installs the handlers before anything else, so a
signal during config loading or worker startup is handled and reported too. Ray's own
processes (GCS, raylet, workers) start with SIGINT blocked, so a Ctrl-C delivered to the whole
process group stops only the driver, which then saves and shuts them down.
"""

from __future__ import annotations

import signal
import time
from typing import Optional

__all__ = ["DUPLICATE_SIGNAL_S", "StopSignals"]

DUPLICATE_SIGNAL_S = 2.0
"""A second SIGINT within this many seconds of the first is the same Ctrl-C delivered twice
(``timeout -s INT`` and some terminals signal the process and then its process group) and is
ignored; a later one aborts."""


class StopSignals:
    """SIGINT / SIGTERM handling of a training run.

    Before training starts (``phase="startup"``) the first signal raises KeyboardInterrupt:
    nothing has been trained, so there is nothing to save; so does one while a restart waits
    for capacity (``phase="waiting"``: the groups are down and the newest checkpoint is what
    there is). During training the first signal
    asks the loop to stop after the current iteration and save a checkpoint; a repeat within
    :data:`DUPLICATE_SIGNAL_S` seconds is ignored, a later one raises KeyboardInterrupt (abort
    without saving). :meth:`install` / :meth:`restore` swap the process's handlers (main thread
    only).
    """

    def __init__(self, duplicate_s: float = DUPLICATE_SIGNAL_S) -> None:
        self.duplicate_s = duplicate_s
        self.phase = "startup"
        self.first_at: Optional[float] = None
        self.aborted = False
        self._prev: dict = {}

    @property
    def requested(self) -> bool:
        """A stop was asked for."""
        return self.first_at is not None

    def check(self) -> None:
        """Raise KeyboardInterrupt when a stop was asked for before training started: the one
        the handler raised may have been swallowed (trimesh, which ``mani_skill`` imports,
        wraps its optional imports in ``except BaseException``), and start-up went on."""
        if self.requested and self.phase == "startup":
            raise KeyboardInterrupt

    def install(self) -> "StopSignals":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._prev.setdefault(sig, signal.signal(sig, self._handle))
        return self

    def restore(self) -> None:
        for sig, prev in self._prev.items():
            signal.signal(sig, prev)
        self._prev.clear()

    def _handle(self, signum, _frame) -> None:
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
            if self.phase == "startup":
                print(f"\n{name}: stopping before training started", flush=True)
                raise KeyboardInterrupt
            if self.phase == "waiting":  # a restart waiting for capacity: no iteration runs
                print(f"\n{name}: stopping the wait for capacity; the run ends at its newest "
                      f"checkpoint", flush=True)
                raise KeyboardInterrupt
            print(f"\n{name}: finishing this iteration, then saving a checkpoint (Ctrl-C again "
                  f"to abort without saving)", flush=True)
            return
        if now - self.first_at < self.duplicate_s:
            return  # the same Ctrl-C, delivered to the process and to its group
        self.aborted = True
        raise KeyboardInterrupt
