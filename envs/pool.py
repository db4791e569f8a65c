"""Where SubBatches run: in this process, or in a pool of worker processes.

Both backends take a *factory* ``factory(env_ids: list[int], device: WorkerDevice | None) ->
SubBatch`` (picklable, e.g. ``functools.partial(LiberoSubBatch, cfg)``) and host the N envs split
into contiguous groups, one group per process. The vector env
(:class:`~rlinf_embodied.envs.vector.VectorBatchedEnv`) talks to them through three calls,
``reset``, ``step`` and ``call``, each over a sorted array of global env ids.

:class:`ProcessPool` is our env pool, not an RPC system: one duplex ``multiprocessing.Pipe`` per
worker, one message per worker per call (all of that worker's envs batched), commands sent to
every worker before any answer is read, numpy arrays pickled with protocol 5.

Failure handling (never a silent hang, never a lost episode result):

* every answer is awaited with a deadline (``step_timeout_s``, ``reset_timeout_s``);
* a worker that misses it, raises, or dies is killed (SIGKILL) and a replacement is started at
  once, in the background; its envs come back in :attr:`StepResult.failed_ids` (envs of the
  call, whose episodes the vector env ends as truncated with ``info["env_error"]``) and
  :attr:`StepResult.lost_ids` (its other envs, reported on their next step);
* a failed reset is retried once on the replacement, then raises :class:`EnvError`;
* a worker whose steps fail ``max_step_failures`` times in a row (``env.max_step_failures``,
  default :data:`MAX_STEP_FAILURES`; no successful step in between, resets do not count) raises
  :class:`EnvError`: its env fails persistently, and the run would otherwise go on training on
  nothing but episodes cut short by the error;
* every failure is logged (a ``logging`` warning: the worker's traceback at its first failure,
  one line at each later one) and counted in :attr:`ProcessPool.num_errors`.

OpenMP: every worker process starts with the framework's OpenMP wait policy
(:func:`rlinf_embodied.omp.omp_wait_env`: passive, so that idle OpenMP threads do not spin on
the cores the env processes step on). libgomp reads it when torch loads it, which
for ``forkserver`` is in the fork server (it preloads this module, and with it torch): the policy
is in the parent's environment while the server and the workers are launched.

Start methods: ``forkserver`` (default on Linux) or ``spawn``. ``fork`` is refused: a forked
ManiSkill worker deadlocks at its first reset (measured here, see ENVIRONMENT.md), and forking a
process that holds CUDA or EGL contexts is undefined.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import time
import traceback
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from rlinf_embodied.omp import omp_wait_env

from .base import EnvError, EnvSpec, SubBatch, Transition

__all__ = [
    "WorkerDevice",
    "visible_cuda_devices",
    "assign_device",
    "StepResult",
    "InProcessBackend",
    "ProcessPool",
    "MAX_STEP_FAILURES",
]

log = logging.getLogger(__name__)

MAX_STEP_FAILURES = 3
"""Failed steps of one worker in a row (no successful step between them; the resets between
them do not count) after which its env counts as failing persistently and
:meth:`ProcessPool.step` raises :class:`EnvError`. A transient failure (a crash, a hang, a
simulator error in one state) is followed by good steps on the replacement worker; an env that
cannot step fails again right after its restart and fresh reset. 3 leaves room for two
unlucky failures in a row while costing at most three worker restarts."""

_STEPPING = ("step", "step_unobserved", "observe")
"""The commands whose failures count towards ``max_step_failures``."""

Factory = Callable[[List[int], Optional["WorkerDevice"]], SubBatch]


@dataclass(frozen=True)
class WorkerDevice:
    """The GPU a worker renders / simulates on.

    Attributes:
        ordinal: CUDA ordinal as the worker sees it (index into ``CUDA_VISIBLE_DEVICES``), for
            torch/SAPIEN device strings ``cuda:{ordinal}``.
        physical_id: the physical GPU index (entry of ``CUDA_VISIBLE_DEVICES``, or the ordinal
            when unset), for EGL device selection (MuJoCo / robosuite ``render_gpu_device_id``).
    """

    ordinal: int
    physical_id: int


def visible_cuda_devices() -> List[int]:
    """Physical ids of the GPUs this process may use; [] without CUDA.

    Honours a subset in ``CUDA_VISIBLE_DEVICES`` (e.g. ``"2,5"`` -> ``[2, 5]``). Numeric ids only;
    UUID entries map to their position.
    """
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver is "no GPU", not a crash
        count = 0
    if count == 0:
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or env.strip() == "":
        return list(range(count))
    entries = [e.strip() for e in env.split(",") if e.strip()][:count]
    return [int(e) if e.isdigit() else i for i, e in enumerate(entries)]


def assign_device(worker_index: int, devices: Optional[Sequence[int]] = None) -> Optional[WorkerDevice]:
    """Round-robin GPU of worker ``worker_index``; None on a machine without CUDA.

    Args:
        worker_index: 0-based worker index within the pool.
        devices: physical GPU ids to use; default :func:`visible_cuda_devices`.
    """
    devices = visible_cuda_devices() if devices is None else list(devices)
    if not devices:
        return None
    ordinal = worker_index % len(devices)
    return WorkerDevice(ordinal=ordinal, physical_id=int(devices[ordinal]))


@dataclass
class StepResult:
    """Answer of a backend to ``reset`` or ``step`` over sorted global env ids.

    Attributes:
        ids: (M,) int64 ids that answered, sorted.
        transition: their results in ``ids`` order, or None when none answered.
        failed_ids: (F,) ids of the call whose worker crashed or timed out.
        lost_ids: (L,) ids *not* in the call whose worker was restarted (state lost).
        errors: one message per failure, with the worker's traceback when there is one.
    """

    ids: np.ndarray
    transition: Optional[Transition]
    failed_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    lost_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    errors: List[str] = field(default_factory=list)


class InProcessBackend:
    """All N envs in one SubBatch in this process (GPU simulators, cheap gymnasium envs).

    No isolation: a simulator exception propagates to the caller and a hang hangs it. Use a
    :class:`ProcessPool` when that matters.
    """

    def __init__(self, factory: Factory, num_envs: int, device: Optional[WorkerDevice] = None):
        self.num_envs = num_envs
        self.num_errors = 0
        self._sub: Optional[SubBatch] = factory(list(range(num_envs)), device)
        self.spec: EnvSpec = self._sub.spec

    def reset(self, ids: np.ndarray, seeds: List[Optional[int]], options: List[Dict[str, Any]]) -> StepResult:
        return StepResult(ids, self._sub.reset(ids, seeds, options))

    def step(self, ids: np.ndarray, actions: Any, observe: bool = True) -> StepResult:
        sub = self._sub
        return StepResult(ids, sub.step(ids, actions) if observe else sub.step_unobserved(ids, actions))

    def observe(self, ids: np.ndarray) -> StepResult:
        return StepResult(ids, self._sub.observe(ids))

    def call(self, name: str, ids: np.ndarray, *args: Any) -> List[Any]:
        return self._sub.call(name, ids, *args)

    def pids(self) -> List[int]:
        return []

    def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            sub.close()


# --------------------------------------------------------------------------------------------
# Worker process
# --------------------------------------------------------------------------------------------
def _worker_main(conn, factory: Factory, env_ids: List[int], device: Optional[WorkerDevice],
                 env_vars: Dict[str, str], num_threads: int) -> None:
    """Body of a pool worker: build the SubBatch here (render contexts included), then serve."""
    os.environ.update(env_vars)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    from rlinf_embodied.config.errors import one_line_warnings
    from rlinf_embodied.envs.base import EnvWarning

    one_line_warnings((EnvWarning,))  # as the CLI prints them in the parent
    try:
        import torch

        torch.set_num_threads(num_threads)
    except ImportError:
        pass
    try:
        sub = factory(list(env_ids), device)
        conn.send(("ready", sub.spec))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    handlers = {
        "step": sub.step,
        "step_unobserved": sub.step_unobserved,
        "observe": sub.observe,
        "reset": sub.reset,
        "call": lambda local_ids, name, args: sub.call(name, local_ids, *args),
    }
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if msg[0] == "close":
                break
            try:
                out = ("ok", handlers[msg[0]](*msg[1:]))
            except Exception:
                out = ("error", traceback.format_exc())
            conn.send(out)
    finally:
        try:
            sub.close()
        finally:
            try:
                conn.send(("closed", None))
            except Exception:
                pass


@contextlib.contextmanager
def _launch_environ(values: Dict[str, str]):
    """``values`` in ``os.environ`` while a child process is launched; restored afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Worker:
    """Parent-side handle of one worker process hosting envs ``env_ids``."""

    def __init__(self, index: int, env_ids: np.ndarray):
        self.index = index
        self.env_ids = env_ids
        self.proc: Any = None
        self.conn: Any = None
        self.ready = False
        self.failures = 0
        """Failures so far (the first one's traceback is logged in full, later ones in a line)."""
        self.step_failures = 0
        """Stepping calls (:data:`_STEPPING`) failed since its last successful step."""

    @property
    def label(self) -> str:
        return f"env worker {self.index} (envs {self.env_ids[0]}..{self.env_ids[-1]})"

    def why(self, message: str) -> str:
        """The error itself in one line: the last line of ``message`` (a worker's traceback
        ends with it), without this worker's label."""
        last = next((ln.strip() for ln in reversed(message.splitlines()) if ln.strip()), "")
        return last[len(self.label):].lstrip() if last.startswith(self.label) else last

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn, self.ready = None, None, False


def _kill_all(workers: List[_Worker]) -> None:
    for w in workers:
        try:
            w.kill()
        except Exception:
            pass


class ProcessPool:
    """N envs split over ``num_processes`` worker processes, each stepping its envs as a batch.

    Args:
        factory: picklable ``factory(env_ids, device) -> SubBatch``, called in the worker.
        num_envs: N.
        num_processes: worker count P (<= N); worker p hosts a contiguous block of about N/P
            envs.
        start_method: ``forkserver`` or ``spawn``.
        step_timeout_s: deadline of a step answer, seconds.
        reset_timeout_s: deadline of a reset answer, seconds.
        startup_timeout_s: deadline for a worker to build its envs, seconds (LIBERO: 3-12 s per
            env on a CPU core).
        num_threads: torch intra-op threads per worker (1: one core per env process).
        max_step_failures: failed steps of one worker in a row after which :meth:`step`
            raises (:data:`MAX_STEP_FAILURES`).

    Raises:
        ValueError: bad counts or start method (the message names the fix).
        EnvError: a worker failed to build its envs (with the worker's traceback).
    """

    def __init__(
        self,
        factory: Factory,
        num_envs: int,
        num_processes: int,
        start_method: str = "forkserver",
        step_timeout_s: float = 60.0,
        reset_timeout_s: float = 120.0,
        startup_timeout_s: float = 300.0,
        num_threads: int = 1,
        max_step_failures: int = MAX_STEP_FAILURES,
    ):
        if num_processes < 1 or num_processes > num_envs:
            raise ValueError(
                f"num_processes must be in [1, num_envs] (got {num_processes} for num_envs="
                f"{num_envs}); set env.num_processes accordingly."
            )
        if start_method == "fork":
            raise ValueError(
                "start_method 'fork' deadlocks ManiSkill workers and breaks CUDA/EGL contexts; "
                "use 'forkserver' or 'spawn'."
            )
        if start_method not in mp.get_all_start_methods():
            raise ValueError(
                f"start_method {start_method!r} is not available here; choose one of "
                f"{[m for m in mp.get_all_start_methods() if m != 'fork']}."
            )
        self.num_envs = num_envs
        self.step_timeout_s = float(step_timeout_s)
        self.reset_timeout_s = float(reset_timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.num_errors = 0
        self.max_step_failures = int(max_step_failures)
        self._factory = factory
        self._num_threads = num_threads
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["rlinf_embodied.envs.pool"])
        bounds = np.linspace(0, num_envs, num_processes + 1).round().astype(np.int64)
        self._starts = bounds
        self._workers = [
            _Worker(i, np.arange(bounds[i], bounds[i + 1], dtype=np.int64))
            for i in range(num_processes)
        ]
        self._devices = visible_cuda_devices()
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)
        try:
            for w in self._workers:  # build all workers' envs in parallel
                self._start(w)
            for w in self._workers:
                self._wait_ready(w)
        except BaseException:
            self.close()
            raise
        self.spec: EnvSpec = self._spec

    # -- process management ------------------------------------------------------------------
    def _start(self, w: _Worker) -> None:
        device = assign_device(w.index, self._devices)
        env_vars = {}
        if device is not None:
            env_vars["MUJOCO_EGL_DEVICE_ID"] = str(device.physical_id)
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self._factory, w.env_ids.tolist(), device, env_vars, self._num_threads),
            name=f"rlinf-env-worker-{w.index}",
            daemon=True,
        )
        with _launch_environ(omp_wait_env()):  # the fork server, if this starts it, or the child
            proc.start()
        child.close()
        w.proc, w.conn, w.ready = proc, parent, False

    def _wait_ready(self, w: _Worker) -> None:
        if w.ready:
            return
        status, payload = self._recv(w, time.monotonic() + self.startup_timeout_s, "start")
        if status != "ready":
            w.kill()
            hint = ""
            if "died during start" in str(payload):
                hint = (" If the script that builds the env has no `if __name__ == '__main__':` "
                        "guard, add one: spawn/forkserver workers re-import the main module.")
            last = next((ln.strip() for ln in reversed(str(payload).splitlines()) if ln.strip()), "")
            raise EnvError(f"{w.label} failed to build its envs: {payload}{hint}",
                           summary=f"{w.label} failed to build its envs: {last}{hint}")
        self._spec = payload
        w.ready = True

    def _recv(self, w: _Worker, deadline: float, what: str):
        """One answer of ``w`` by ``deadline``: ("ok"|"ready", payload) or ("error", message)."""
        try:
            if not w.conn.poll(max(0.0, deadline - time.monotonic())):
                limit = {"start": "startup", "reset": "reset", "step": "step"}.get(what, "step")
                return "error", (
                    f"{w.label} did not answer {what} in time; raise env.{limit}_timeout_s if "
                    f"the env is legitimately this slow"
                )
            return w.conn.recv()
        except (EOFError, OSError, ConnectionError) as e:
            code = w.proc.exitcode if w.proc is not None else None
            return "error", f"{w.label} died during {what} (exit code {code}): {e!r}"

    def _restart(self, w: _Worker, message: str) -> None:
        self.num_errors += 1
        w.failures += 1
        if w.failures == 1:
            log.warning("Env pool: %s\nKilling and restarting %s.", message, w.label)
        else:  # the same traceback at every step of a broken env would bury everything else
            log.warning("Env pool: %s failed again (failure %d: %s); killing and restarting it "
                        "(its first failure's traceback is logged above).", w.label, w.failures,
                        w.why(message))
        w.kill()
        self._start(w)

    def _split(self, ids: np.ndarray):
        """[(worker, local ids, positions in ids)] for sorted global ``ids``."""
        widx = np.searchsorted(self._starts, ids, side="right") - 1
        out = []
        for wi in np.unique(widx):
            pos = np.flatnonzero(widx == wi)
            w = self._workers[int(wi)]
            out.append((w, ids[pos] - self._starts[wi], pos))
        return out

    # -- the three calls ---------------------------------------------------------------------
    def _exchange(self, cmd: str, ids: np.ndarray, per_env: Sequence[Any], timeout: float,
                  extra: tuple = ()):
        """Send ``cmd`` to every involved worker, then gather answers by one deadline.

        ``per_env`` are arrays/lists indexed like ``ids`` that are sliced per worker; ``extra``
        arguments go to every worker unchanged.
        Returns [(worker, positions, status, payload)].
        """
        groups = self._split(ids)
        sent = []
        for w, local, pos in groups:
            self._wait_ready(w)
            args = [a[pos] if isinstance(a, np.ndarray) else [a[i] for i in pos] for a in per_env]
            try:
                w.conn.send((cmd, local, *args, *extra))
                sent.append((w, pos, None))
            except (OSError, ValueError) as e:
                sent.append((w, pos, ("error", f"{w.label} pipe broken on {cmd}: {e!r}")))
        deadline = time.monotonic() + timeout
        out = []
        for w, pos, early in sent:
            status, payload = early or self._recv(w, deadline, cmd)
            out.append((w, pos, status, payload))
        return out

    def _collect(self, ids: np.ndarray, answers, cmd: str) -> StepResult:
        """The answers of ``cmd``: failed workers restarted, their envs failed or lost.

        Raises:
            EnvError: a worker's steps failed ``max_step_failures`` times in a row.
        """
        ok_parts, ok_pos, failed, lost, errors, broken = [], [], [], [], [], []
        for w, pos, status, payload in answers:
            if status == "ok":
                ok_parts.append(payload)
                ok_pos.append(pos)
                if cmd in ("step", "step_unobserved"):
                    w.step_failures = 0
                continue
            errors.append(str(payload))
            self._restart(w, str(payload))
            failed.append(ids[pos])
            lost.append(np.setdiff1d(w.env_ids, ids[pos]))
            if cmd in _STEPPING:
                w.step_failures += 1
                if w.step_failures >= self.max_step_failures:
                    broken.append((w, str(payload)))
        if broken:
            w, message = broken[0]
            raise EnvError(
                f"{w.label} failed {w.step_failures} steps in a row (env.max_step_failures), restarted after each "
                f"(last: {w.why(message)} in its {cmd}): the env fails persistently, and training "
                f"on episodes cut short by it learns nothing; fix the env (the first failure's "
                f"traceback is logged above), then resume or start the run again"
            )
        cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
        ok_ids = ids[cat(ok_pos)] if ok_pos else np.zeros(0, np.int64)
        return StepResult(
            ids=ok_ids,
            transition=Transition.concat(ok_parts) if ok_parts else None,
            failed_ids=cat(failed),
            lost_ids=cat(lost),
            errors=errors,
        )

    def step(self, ids: np.ndarray, actions: np.ndarray, observe: bool = True) -> StepResult:
        """Step envs ``ids`` (M,) with ``actions`` (M, A); answers within ``step_timeout_s``.
        ``observe=False``: the SubBatch's ``step_unobserved`` (observations may be left out)."""
        cmd = "step" if observe else "step_unobserved"
        return self._collect(ids, self._exchange(cmd, ids, [np.asarray(actions)], self.step_timeout_s), cmd)

    def observe(self, ids: np.ndarray) -> StepResult:
        """Current observations of envs ``ids`` (M,) (SubBatch ``observe``), within
        ``step_timeout_s``; a failed worker is restarted and its ids are in ``failed_ids``."""
        return self._collect(ids, self._exchange("observe", ids, [], self.step_timeout_s), "observe")

    def reset(self, ids: np.ndarray, seeds: List[Optional[int]], options: List[Dict[str, Any]]) -> StepResult:
        """Reset envs ``ids``; a failed worker is restarted and its resets retried once.

        Raises:
            EnvError: the retry failed too (the messages of both attempts are included).
        """
        first = self._collect(ids, self._exchange("reset", ids, [seeds, options], self.reset_timeout_s),
                              "reset")
        if first.failed_ids.size == 0:
            return first
        pos = np.flatnonzero(np.isin(ids, first.failed_ids))
        retry = self._collect(
            first.failed_ids,
            self._exchange("reset", first.failed_ids, [[seeds[i] for i in pos], [options[i] for i in pos]],
                           self.reset_timeout_s),
            "reset",
        )
        if retry.failed_ids.size:
            raise EnvError(
                f"Reset of envs {retry.failed_ids.tolist()} failed twice (worker restarted in "
                f"between):\n" + "\n".join(first.errors + retry.errors)
            )
        order = np.argsort(np.concatenate([first.ids, retry.ids]), kind="stable")
        both = Transition.concat([t for t in (first.transition, retry.transition) if t is not None])
        merged = _take(both, order)
        lost = np.setdiff1d(np.concatenate([first.lost_ids, retry.lost_ids]), ids)
        return StepResult(np.sort(ids), merged, lost_ids=lost, errors=first.errors)

    def call(self, name: str, ids: np.ndarray, *args: Any) -> List[Any]:
        """Run SubBatch method ``name(local_ids, *args)`` on the workers of ``ids``.

        Raises:
            EnvError: a worker failed (it is restarted; the call is not retried).
        """
        answers = self._exchange("call", ids, [], self.step_timeout_s, extra=(name, args))
        out: List[Any] = []
        for w, pos, status, payload in answers:
            if status != "ok":
                self._restart(w, str(payload))
                raise EnvError(f"call {name!r} failed: {payload}")
            out.extend(payload)
        return out

    def pids(self) -> List[int]:
        """Process ids of the live workers (for tests and monitoring)."""
        return [w.proc.pid for w in self._workers if w.proc is not None and w.proc.is_alive()]

    def close(self) -> None:
        """Stop every worker: ask politely, then SIGKILL whatever is still alive. Idempotent."""
        for w in self._workers:
            if w.conn is not None:
                try:
                    w.conn.send(("close",))
                except Exception:
                    pass
        deadline = time.monotonic() + 10.0
        for w in self._workers:
            if w.proc is not None:
                w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            w.kill()
        self._finalizer.detach()


def _take(tr: Transition, order: np.ndarray) -> Transition:
    """Rows ``order`` of a numpy Transition."""
    tasks = [tr.task_descriptions[i] for i in order] if tr.task_descriptions is not None else None
    return Transition(
        obs={k: v[order] for k, v in tr.obs.items()},
        reward=tr.reward[order],
        terminated=tr.terminated[order],
        truncated=tr.truncated[order],
        success=tr.success[order],
        task_descriptions=tasks,
    )
