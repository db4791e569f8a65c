"""The results of worker group calls: :class:`CallHandle` (per-rank results and timings of one
asynchronous call), :func:`wait_all`, and the errors a failed rank raises in the caller
(:class:`RemoteError`, :class:`WorkerDiedError`).

A rank's host actor (:mod:`rlinf_embodied.runtime.worker`) answers every call with an
:class:`Outcome`: the value or the error, and the seconds the call took inside the worker
(paper section 4: the scheduler's profiler reads these timings through the handle).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import traceback
from typing import Any

import ray

POLL_S = 0.2
"""Seconds between liveness checks while waiting; bounds how late a dead rank is reported."""


class RemoteError(RuntimeError):
    """A worker method raised; carries the group, rank, method and the remote traceback.

    Attributes:
        group: Worker group name.
        rank: Rank that raised.
        method: Method name (``"__init__"`` for a failed constructor).
        remote_traceback: The formatted traceback from the worker process.
    """

    def __init__(self, group: str, rank: int, method: str, error: str, remote_traceback: str):
        super().__init__(
            f"{group}[rank {rank}].{method}() raised {error}\n"
            f"--- remote traceback ({group}[rank {rank}]) ---\n{remote_traceback}"
        )
        self.group, self.rank, self.method = group, rank, method
        self.remote_traceback = remote_traceback


class WorkerDiedError(RuntimeError):
    """A worker's process died (killed, out of memory, crashed) during or before a call."""

    def __init__(self, group: str, rank: int, method: str, detail: str):
        super().__init__(
            f"{group}[rank {rank}] died while running {method}(): {detail}\n"
            f"The actor process exited (killed, out of memory or crashed); read its log under "
            f"/tmp/ray/session_latest/logs, then recreate the group."
        )
        self.group, self.rank, self.method = group, rank, method


@dataclasses.dataclass
class Outcome:
    """What a host returns for one call: the value or the error, and the call's duration."""

    value: Any = None
    seconds: float = 0.0
    error: str | None = None
    traceback: str | None = None
    method: str | None = None  # set when the failure belongs to another method (__init__)

    @classmethod
    def failure(cls, exc: BaseException, seconds: float, method: str | None = None) -> "Outcome":
        """The outcome of a call that raised ``exc`` after ``seconds``: its error and traceback
        (without the host's frame); ``method`` names the method the failure belongs to when it
        is not the called one (a failed ``__init__``).

        The error is worded as the traceback's last line is (``numpy.linalg.LinAlgError:
        Singular matrix``, the class named with its module unless builtin), so that a report
        of both (:func:`rlinf_embodied.runners.errors.short_error`) can tell they are one."""
        frames = exc.__traceback__.tb_next if exc.__traceback__ else None  # drop the host's frame
        text = "".join(traceback.format_exception(type(exc), exc, frames))
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return cls(None, seconds, error, text, method)


@dataclasses.dataclass(frozen=True)
class CallTiming:
    """Per-rank durations of one group call, in seconds (measured inside each worker)."""

    per_rank: list[float]

    @property
    def max(self) -> float:
        return max(self.per_rank)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.per_rank)


class CallHandle:
    """Asynchronous result of a group call; :meth:`wait` returns the per-rank results."""

    def __init__(self, group: str, method: str, ranks: list[int], refs: list[ray.ObjectRef]):
        self.group, self.method, self.ranks = group, method, ranks
        self._refs = dict(zip(refs, ranks))
        self._outcomes: dict[int, Outcome] = {}

    @property
    def refs(self) -> list[ray.ObjectRef]:
        """The calls' object refs, one per rank (to ``ray.wait`` on several handles at once)."""
        return list(self._refs)

    def done(self) -> bool:
        """Whether every rank has finished (successfully or not)."""
        pending = [r for r, rank in self._refs.items() if rank not in self._outcomes]
        return not pending or len(ray.wait(pending, num_returns=len(pending), timeout=0)[0]) == len(pending)

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every rank has returned.

        Args:
            timeout: Seconds to wait; None waits forever (dead ranks are still detected).

        Returns:
            The results, one per called rank, in rank order of the call.

        Raises:
            RemoteError: A rank raised (the lowest such rank is reported).
            WorkerDiedError: A rank's process died; reported within about ``POLL_S`` seconds.
            TimeoutError: ``timeout`` expired first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._step(POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())):
            if deadline is not None and time.monotonic() >= deadline:
                busy = sorted(set(self.ranks) - set(self._outcomes))
                raise TimeoutError(
                    f"{self.group}.{self.method}() did not finish within {timeout} s on ranks "
                    f"{busy}; raise the timeout or look for a stuck worker."
                )
        return [self._outcomes[rank].value for rank in self.ranks]

    def poll(self) -> bool:
        """Collect the ranks that finished, without blocking.

        Returns:
            True once every rank has finished.

        Raises:
            RemoteError, WorkerDiedError: As :meth:`wait`, as soon as a rank has failed.
        """
        return self._step(0.0)

    def _step(self, budget: float) -> bool:
        """Wait up to ``budget`` seconds, collect finished ranks, raise any failure."""
        pending = {ref: rank for ref, rank in self._refs.items() if rank not in self._outcomes}
        if pending:
            try:  # fast path: every rank answers within the budget, one round trip
                outcomes = ray.get(list(pending), timeout=max(0.0, budget))
            except ray.exceptions.RayError:  # still running (GetTimeoutError) or a rank died
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
                outcomes = [self._get_one(ref, pending[ref]) for ref in ready]
                pending = {ref: pending[ref] for ref in ready}
            self._outcomes.update(zip(pending.values(), outcomes))
        failed = sorted(rank for rank, o in self._outcomes.items() if o.error)
        if failed:
            o = self._outcomes[failed[0]]
            raise RemoteError(self.group, failed[0], o.method or self.method, o.error, o.traceback)
        return len(self._outcomes) == len(self.ranks)

    def _get_one(self, ref: ray.ObjectRef, rank: int) -> Outcome:
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as err:
            raise WorkerDiedError(self.group, rank, self.method, type(err).__name__) from err
        except ray.exceptions.RayError as err:  # e.g. an unpicklable return value
            return Outcome(error=f"{type(err).__name__}: {err}", traceback=str(err))

    @property
    def timing(self) -> CallTiming:
        """Durations of the finished call (call :meth:`wait` first).

        Raises:
            RuntimeError: If some rank has not finished yet.
        """
        if len(self._outcomes) < len(self.ranks):
            raise RuntimeError(f"{self.group}.{self.method}() is still running; wait() first.")
        return CallTiming([self._outcomes[rank].seconds for rank in self.ranks])


def wait_all(*handles: CallHandle, timeout: float | None = None) -> list[list[Any]]:
    """Wait for several calls that depend on each other (e.g. producers and consumers of a
    channel), raising the first failure at once instead of hanging on a survivor's ``wait()``.

    Returns:
        Each handle's per-rank results, in argument order.

    Raises:
        RemoteError, WorkerDiedError: from the first call that fails.
        TimeoutError: if ``timeout`` seconds pass first.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while not all([h.poll() for h in handles]):  # a list: poll every handle, raise any failure
        if deadline is not None and time.monotonic() > deadline:
            busy = [f"{h.group}.{h.method}()" for h in handles if not h.done()]
            raise TimeoutError(f"{busy} did not finish within {timeout} s.")
        time.sleep(POLL_S / 4)
    return [h.wait() for h in handles]
