"""One-line reports of errors that reach a command: a (remote) worker's error without its
traceback, and what to do about a start that failed through no fault of the job."""

from __future__ import annotations

import os

__all__ = ["short_error", "start_hint"]


def short_error(e: BaseException) -> str:
    """The message of a (remote) error without the traceback: its first and last lines."""
    text = str(e).strip().splitlines()
    last = next((ln for ln in reversed(text) if ln.strip()), "")
    head = text[0] if text else type(e).__name__
    return head if last in head else f"{head}\n  {last}"


def start_hint(e: BaseException) -> str:
    """What to do about a failed start that is not the job's fault: Ray's embedded cluster
    timing out on a busy machine (its raylet or GCS did not come up in time); "" otherwise."""
    if "timed out during startup" not in str(e):
        return ""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"\n  Ray could not start its local cluster in time (1-minute load average {load:.1f} "
            f"on {os.cpu_count()} cores); run the same command again when the machine is less "
            f"busy.")
