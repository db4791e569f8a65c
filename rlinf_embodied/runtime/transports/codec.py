"""Serialisation of channel items for the direct paths between processes.

Pickle protocol 5 with dense CPU tensors and numpy arrays out of band: the framing
(:mod:`~rlinf_embodied.runtime.transports.wire`) sends their memory as it is (through the
socket or in shared memory) and the consumer rebuilds them over the received bytes, no copy.
"""

from __future__ import annotations

import copyreg
import functools
import io
import pickle
import sys
from typing import Any

def _tensor_from_buffer(buf, code: int, shape: tuple):
    """A tensor over ``buf``'s bytes (no copy): dtype ``_dtypes()[code]``, shape ``shape``."""
    import torch

    dtype, np_dtype = _dtypes()[code]
    if np_dtype is not None:  # through numpy: fewer and cheaper calls than torch.frombuffer
        import numpy as np

        return torch.from_numpy(np.frombuffer(buf, np_dtype).reshape(shape))
    if not len(buf):
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype).view(shape)


def _reduce_tensor(obj):
    """Pickle reduction of a dense CPU tensor: its bytes out of band, dtype code and shape in
    band. Other tensors (accelerator, autograd, quantized, conjugate/negative views, sparse)
    keep torch's own reduction."""
    try:
        if not obj.is_contiguous():
            obj = obj.contiguous()
        array = obj.numpy()  # raises for everything but a dense CPU tensor of a numpy dtype
    except (RuntimeError, TypeError):
        torch = sys.modules["torch"]
        if (obj.device.type != "cpu" or obj.layout != torch.strided or obj.requires_grad
                or obj.is_quantized or obj.is_conj() or obj.is_neg()):
            return obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        array = obj.reshape(-1).view(torch.uint8).numpy()  # bfloat16 and other non-numpy dtypes
    return _tensor_from_buffer, (pickle.PickleBuffer(array), _dtype_codes()[obj.dtype], tuple(obj.shape))


@functools.cache
def _dtype_tables() -> tuple[tuple, dict]:
    """((torch dtype, numpy dtype or None) per code, code per torch dtype); called only once
    torch is imported (a tensor is being encoded or decoded)."""
    import numpy as np
    import torch

    names = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8",
             "bool", "complex64", "complex128", "bfloat16", "uint16", "uint32", "uint64",
             "float8_e4m3fn", "float8_e5m2")
    found = [getattr(torch, n) for n in names if hasattr(torch, n)]
    numpy_kind = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
                  torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
                  torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_,
                  torch.complex64: np.complex64, torch.complex128: np.complex128}
    return tuple((d, numpy_kind.get(d)) for d in found), {d: i for i, d in enumerate(found)}


def _dtypes() -> tuple:
    """(torch dtype, numpy dtype or None) per code."""
    return _dtype_tables()[0]


def _dtype_codes() -> dict:
    return _dtype_tables()[1]


_pickle_tables: list = []


def _dispatch_table() -> dict | None:
    """copyreg's reductions plus :func:`_reduce_tensor` for ``torch.Tensor`` (None until torch
    is imported: then no item can hold a tensor). Built once, on the first call after torch
    is imported (not cached before: a None result must not stick)."""
    if not _pickle_tables:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        table = copyreg.dispatch_table.copy()
        table[torch.Tensor] = _reduce_tensor
        _pickle_tables.append(table)
    return _pickle_tables[0]


def encode(item: Any) -> tuple[bytes, list[memoryview]]:
    """``item`` -> (pickle stream, out-of-band buffers). Falls back to cloudpickle in band.

    Pickle protocol 5; dense CPU tensors and numpy arrays go out of band (their memory, no
    copy): a tensor is rebuilt over the received bytes with ``torch.frombuffer``. Only exact
    ``torch.Tensor`` instances take that path (a C dispatch-table lookup, so every other object
    is pickled at C speed).
    """
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    try:
        pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
        table = _dispatch_table()
        if table is not None:
            pickler.dispatch_table = table
        pickler.dump(item)
    except (pickle.PicklingError, TypeError, AttributeError):
        from ray import cloudpickle

        return cloudpickle.dumps(item, protocol=5), []
    return out.getvalue(), [b.raw() for b in buffers]


def decode(meta: bytes, buffers: list) -> Any:
    """Inverse of :func:`encode`."""
    return pickle.loads(meta, buffers=buffers)

