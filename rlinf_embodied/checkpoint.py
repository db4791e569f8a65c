"""Atomic checkpoints and run directories.

A checkpoint is a directory ``{run_dir}/checkpoints/iter_{k:06d}/`` holding whatever files the
caller writes into it (policy weights, optimizer state, RNG states, counters). It is first built
under a temporary name and then renamed in one ``os.replace``; the ``latest`` pointer file is
rewritten the same way. An interrupted save therefore never leaves a checkpoint that loads
half-written: either the new directory exists complete, or the previous one is still ``latest``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional

__all__ = [
    "atomic_dir",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "checkpoint_dir",
    "checkpoint_problem",
    "latest_checkpoint",
    "latest_loadable_checkpoint",
    "list_checkpoints",
]

_COMPLETE = "COMPLETE"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Create ``path`` through ``write(tmp_path)`` on a temporary file in the same directory,
    fsync, then one rename: readers see the old file or the whole new one, never a part.

    ``write`` streams to the temporary path itself (e.g. safetensors' ``save_file``), so large
    checkpoints need not be built in memory first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        # mkstemp creates 0600 (and a writer may replace the file, e.g. safetensors' save_file);
        # results and checkpoints are meant to be shared
        os.chmod(tmp, 0o644)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def unwritable(folder: str | os.PathLike) -> Optional[str]:
    """Why files cannot be written atomically into ``folder`` (made if missing), or None.

    Checks by creating (and removing) a temporary file there, as :func:`atomic_write` will;
    the reason is the OS's (e.g. "Permission denied", "Read-only file system").
    """
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check."):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """:func:`atomic_write` of a bytes object."""
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    """JSON version of :func:`atomic_write_bytes` (indented, keys sorted)."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def list_checkpoints(run_dir: str | os.PathLike) -> List[Path]:
    """Complete checkpoint directories of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if p.is_dir() and p.name.startswith("iter_") and (p / _COMPLETE).exists()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(run_dir: str | os.PathLike) -> Optional[Path]:
    """The checkpoint named by ``checkpoints/latest``, else the newest complete one, else None."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.exists():
        cand = root / pointer.read_text().strip()
        if (cand / _COMPLETE).exists():
            return cand
    done = list_checkpoints(run_dir)
    return done[-1] if done else None


@contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Context manager yielding a temporary sibling directory that replaces ``final`` on exit.

    On an exception inside the block the temporary directory is removed and ``final`` (if it
    existed) stays as it was; a reader never sees a half-written ``final``.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    tmp.chmod(0o755)
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def checkpoint_dir(
    run_dir: str | os.PathLike, name: str, keep: int = 3, update_latest: bool = True
) -> Iterator[Path]:
    """Context manager yielding a temporary directory that becomes checkpoint ``name`` on exit.

    Example::

        with checkpoint_dir(run_dir, "iter_000010") as d:
            save_policy(policy, d / "policy")
            torch.save(optimizer.state_dict(), d / "optimizer.pt")

    On an exception inside the block the temporary directory is removed and the previous
    ``latest`` stays. Only the newest ``keep`` ``iter_*`` checkpoints are kept (0 keeps all);
    other names (``best``) are never rotated, and with ``update_latest=False`` the ``latest``
    pointer is left alone.
    """
    root = Path(run_dir) / "checkpoints"
    with atomic_dir(root / name) as tmp:
        yield tmp
        (tmp / _COMPLETE).write_text("ok\n")
    if update_latest:
        atomic_write_text(root / "latest", name + "\n")
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def checkpoint_problem(ckpt: str | os.PathLike) -> Optional[str]:
    """Why checkpoint directory ``ckpt`` would not load, or None when it looks complete.

    Checks without building a model: the ``COMPLETE`` marker, that ``runner_state.json`` (when
    present) parses, that every ``*.safetensors`` file's header covers the file (a truncated
    or overwritten file fails here), and that every ``*.pt`` zip archive passes its CRC check.
    Cost: reads the ``.pt`` files once (seconds for a VLA's optimizer state).
    """
    import zipfile

    ckpt = Path(ckpt)
    if not (ckpt / _COMPLETE).exists():
        return f"{ckpt} has no {_COMPLETE} marker (its save did not finish)"
    state = ckpt / "runner_state.json"
    if state.exists():
        try:
            json.loads(state.read_text())
        except (OSError, ValueError) as e:
            return f"{state} is unreadable ({e})"
    for f in sorted(ckpt.rglob("*.safetensors")):
        try:
            from safetensors import safe_open

            with safe_open(str(f), "pt") as h:
                h.keys()
        except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: say which file
            return f"{f} is damaged ({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})"
    for f in sorted(ckpt.rglob("*.pt")):
        try:
            with zipfile.ZipFile(f) as z:
                bad = z.testzip()
        except (OSError, zipfile.BadZipFile) as e:
            return f"{f} is damaged ({e})"
        if bad is not None:
            return f"{f} is damaged (member {bad} fails its CRC check)"
    return None


def latest_loadable_checkpoint(
    run_dir: str | os.PathLike, warn: Callable[[str], None] = print
) -> Optional[Path]:
    """The newest checkpoint of ``run_dir`` that passes :func:`checkpoint_problem` (``latest``
    first, then older ones, newest first), or None; ``warn`` is called once for each damaged
    checkpoint skipped."""
    first = latest_checkpoint(run_dir)
    order = [first] if first is not None else []
    order += [c for c in reversed(list_checkpoints(run_dir)) if c != first]
    for c in order:
        problem = checkpoint_problem(c)
        if problem is None:
            return c
        warn(f"warning: skipping checkpoint {c.name}: {problem}")
    return None
