"""Image preprocessing of the VLA policies: a fast batched torch path and the upstream one.

Two modes (``policy.image_preprocessing``; the results header records which one ran):

* ``fast``: all in torch on the policy's device, batched: bilinear antialiased resize to S,
  integer-pixel centre crop of ``crop_area`` resized back (bilinear), normalise. About 2.8 grey
  levels from upstream on average on LIBERO frames (p99 37, at edges); see
  ``benchmarks/bench_preprocessing.py``.
* ``upstream``: what the openvla / openvla-oft LIBERO evaluation scripts feed the model
  (``experiments/robot/libero``: ``resize_image`` / ``resize_image_for_policy``,
  ``crop_and_resize``, then ``PrismaticImageProcessor``), reimplemented without tensorflow:

  1. JPEG encode + decode at quality 95 (PIL / libjpeg; ``tf.image.encode_jpeg`` defaults:
     quality 95, 4:2:0 chroma subsampling, integer slow DCT);
  2. resize to S x S with an antialiased Lanczos-3 kernel in float (TF ``scale_and_translate``
     with ``lanczos3``: half-pixel centres, kernel widened by in/out when shrinking, weights
     normalised per output pixel), then round half to even and clip to uint8 (``tf.round``);
  3. if ``center_crop``: uint8 * (1/255) in float32 (``tf.image.convert_image_dtype``), TF
     ``crop_and_resize`` of the central box of side ``sqrt(crop_area)`` (in [0, 1] box
     coordinates) back to S x S with bilinear sampling at ``y1 (H-1) + y (y2-y1)(H-1)/(S-1)``
     (no antialiasing), clip to [0, 1], then ``floor(x * 255.5)`` to uint8 (TF's saturating
     float-to-uint8 conversion);
  4. ``x / 255``, normalised with the means/stds of the checkpoint's ``preprocessor_config.json``
     (DINOv2's published values are bf16-rounded: 0.484375, 0.455078125, 0.40625 / 0.228515625,
     0.2236328125, 0.224609375), one copy per vision backbone stacked on channels.

  Steps 1-2 run on the CPU (JPEG per image); see ``benchmarks/bench_preprocessing.py`` for the
  cost per image (several times the fast path's).
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "PREPROCESSING_MODES",
    "ImagePreprocessor",
    "jpeg_round_trip",
    "lanczos3_weights",
    "lanczos3_resize",
    "tf_center_crop_and_resize",
    "read_preprocessor_stats",
]

PREPROCESSING_MODES = ("fast", "upstream")
"""Values of ``policy.image_preprocessing`` besides ``auto``."""

JPEG_QUALITY = 95
"""``tf.image.encode_jpeg`` default quality, used by the RLDS dataset builder and both evals."""

CROP_AREA = 0.9
"""Fraction of the image area kept by the centre crop (openvla / openvla-oft ``crop_scale``)."""


def jpeg_round_trip(images: np.ndarray, quality: int = JPEG_QUALITY) -> np.ndarray:
    """Encode each image as JPEG and decode it again (PIL; libjpeg 4:2:0, slow integer DCT).

    Args:
        images: (N, H, W, 3) uint8.
        quality: JPEG quality (95 as in the RLDS builder).

    Returns:
        (N, H, W, 3) uint8.
    """
    from PIL import Image

    out = np.empty_like(images)
    for i, img in enumerate(images):
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        buf.seek(0)
        out[i] = np.asarray(Image.open(buf).convert("RGB"))
    return out


def _lanczos3(x: torch.Tensor) -> torch.Tensor:
    """TF's Lanczos-3 kernel: ``3 sin(pi x) sin(pi x / 3) / (pi x)^2`` on |x| <= 3, 1 near 0."""
    x = x.abs()
    pi = math.pi
    safe = torch.where(x <= 1e-3, torch.ones_like(x), x)
    k = 3.0 * torch.sin(pi * safe) * torch.sin(pi * safe / 3.0) / (pi * pi * safe * safe)
    k = torch.where(x <= 1e-3, torch.ones_like(x), k)
    return torch.where(x > 3.0, torch.zeros_like(x), k)


def lanczos3_weights(in_size: int, out_size: int) -> torch.Tensor:
    """(out_size, in_size) float64 resampling matrix of an antialiased Lanczos-3 resize.

    Output pixel ``o`` samples the input at ``(o + 0.5) in/out`` (half-pixel centres); when
    shrinking the kernel is widened by ``in/out``; taps outside the image are dropped and each
    row is normalised to sum 1 (TF ``ScaleAndTranslate``, ``antialias=True``).
    """
    scale = in_size / out_size
    kernel_scale = max(scale, 1.0)
    centres = (torch.arange(out_size, dtype=torch.float64) + 0.5) * scale
    src = torch.arange(in_size, dtype=torch.float64) + 0.5
    w = _lanczos3((src[None, :] - centres[:, None]) / kernel_scale)
    return w / w.sum(dim=1, keepdim=True)


def lanczos3_resize(images: np.ndarray, size: int) -> np.ndarray:
    """Antialiased Lanczos-3 resize to ``size`` x ``size``, rounded half to even, uint8.

    Args:
        images: (N, H, W, 3) uint8.
        size: S.

    Returns:
        (N, S, S, 3) uint8.
    """
    n, h, w, _ = images.shape
    x = torch.from_numpy(np.array(images, copy=True)).permute(0, 3, 1, 2).to(torch.float64)
    wy, wx = _weights(h, size), _weights(w, size)
    y = wy @ x @ wx.T  # (N, 3, S, S): rows, then columns
    return torch.round(y).clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


@functools.lru_cache(maxsize=16)
def _weights(in_size: int, out_size: int) -> torch.Tensor:
    return lanczos3_weights(in_size, out_size)


def tf_center_crop_and_resize(x: torch.Tensor, crop_area: float = CROP_AREA,
                              size: int | None = None) -> torch.Tensor:
    """TF ``crop_and_resize`` (bilinear) of the central box of area ``crop_area``.

    Args:
        x: (N, C, H, W) float32 in [0, 1].
        crop_area: kept fraction of the area; the box side is ``sqrt(crop_area)`` of the image.
        size: output side S (default H).

    Returns:
        (N, C, S, S) float32 (not clipped).
    """
    n, c, h, w = x.shape
    s = size or h
    side = torch.sqrt(torch.tensor(crop_area, dtype=torch.float32)).clamp(0, 1)
    lo = (1 - side) / 2
    hi = lo + side

    def coords(length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if s > 1:
            step = (hi - lo) * (length - 1) / (s - 1)
            pos = lo * (length - 1) + torch.arange(s, dtype=torch.float32) * step
        else:
            pos = (0.5 * (lo + hi) * (length - 1)).reshape(1)
        top = torch.floor(pos)
        bottom = torch.ceil(pos)
        return top.long(), bottom.long(), (pos - top)

    ty, by, ly = coords(h)
    tx, bx, lx = coords(w)
    dev = x.device
    ty, by, ly, tx, bx, lx = (t.to(dev) for t in (ty, by, ly, tx, bx, lx))
    rows_t, rows_b = x[:, :, ty], x[:, :, by]
    tl, tr = rows_t[..., tx], rows_t[..., bx]
    bl, br = rows_b[..., tx], rows_b[..., bx]
    top = tl + (tr - tl) * lx
    bottom = bl + (br - bl) * lx
    return top + (bottom - top) * ly[:, None]


def read_preprocessor_stats(path: str | os.PathLike) -> tuple[list, list] | None:
    """``(means, stds)`` per backbone from ``preprocessor_config.json``, or None if absent.

    Raises:
        ValueError: the file exists but lacks ``means`` / ``stds`` lists of 3 floats each.
    """
    p = Path(path) / "preprocessor_config.json"
    if not p.is_file():
        return None
    d = json.loads(p.read_text())
    means, stds = d.get("means"), d.get("stds")
    ok = (isinstance(means, list) and isinstance(stds, list) and means and len(means) == len(stds)
          and all(len(m) == 3 for m in means) and all(len(s) == 3 for s in stds))
    if not ok:
        raise ValueError(
            f"{p} has no per-backbone 'means' and 'stds' (lists of 3 floats each); restore the "
            "published file or delete it to use the backbones' timm statistics."
        )
    return [list(map(float, m)) for m in means], [list(map(float, s)) for s in stds]


class ImagePreprocessor:
    """(N, H, W, 3) uint8 images -> (N, 3 * copies, S, S) normalised pixel values.

    Args:
        image_size: S.
        means: per backbone, 3 floats.
        stds: per backbone, 3 floats.
        center_crop: crop the central ``crop_area`` of the area and resize back to S.
        mode: ``fast`` or ``upstream`` (see the module docstring).
        crop_area: 0.9 in OpenVLA / OFT.
        stats_source: where ``means`` / ``stds`` came from (recorded in results headers).

    Raises:
        ValueError: unknown ``mode``.
    """

    def __init__(
        self,
        image_size: int,
        means: Sequence[Sequence[float]],
        stds: Sequence[Sequence[float]],
        center_crop: bool = False,
        mode: str = "fast",
        crop_area: float = CROP_AREA,
        stats_source: str = "given",
    ):
        if mode not in PREPROCESSING_MODES:
            raise ValueError(
                f"policy.image_preprocessing must be auto, fast or upstream (got {mode!r})."
            )
        self.image_size = int(image_size)
        self.mean = torch.tensor([list(m) for m in means], dtype=torch.float32).reshape(-1, 1, 1)
        self.std = torch.tensor([list(s) for s in stds], dtype=torch.float32).reshape(-1, 1, 1)
        self.copies = len(means)
        self.center_crop = center_crop
        self.crop_area = crop_area
        self.mode = mode
        self.stats_source = stats_source

    def describe(self) -> dict[str, Any]:
        """What the results header records about the preprocessing."""
        return {"mode": self.mode, "image_size": self.image_size, "center_crop": self.center_crop,
                "crop_area": self.crop_area, "mean_std_from": self.stats_source,
                "means": self.mean.reshape(self.copies, 3).tolist(),
                "stds": self.std.reshape(self.copies, 3).tolist()}

    def _fast(self, images: torch.Tensor) -> torch.Tensor:
        s = self.image_size
        x = images.permute(0, 3, 1, 2).float() / 255.0
        if tuple(x.shape[-2:]) != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        if self.center_crop:
            side = max(1, round(s * math.sqrt(self.crop_area)))
            top = (s - side) // 2
            x = x[:, :, top : top + side, top : top + side]
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        return x.clamp(0.0, 1.0)

    def upstream_uint8(self, images: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Steps 1-3 of the upstream path: (N, H, W, 3) uint8 -> (N, S, S, 3) uint8 (CPU)."""
        arr = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
        arr = lanczos3_resize(jpeg_round_trip(arr.astype(np.uint8)), self.image_size)
        out = torch.from_numpy(arr)
        if self.center_crop:
            x = out.permute(0, 3, 1, 2).float() * torch.tensor(1.0 / 255.0, dtype=torch.float32)
            x = tf_center_crop_and_resize(x, self.crop_area, self.image_size).clamp(0.0, 1.0)
            out = torch.floor(x * 255.5).clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        return out.contiguous()

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """(N, H, W, 3) uint8 -> (N, 3 * copies, S, S) float32 on the images' device.

        Raises:
            ValueError: if the images are not (N, H, W, 3).
        """
        if images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(f"images must be (N, H, W, 3) uint8 (got {tuple(images.shape)}).")
        if self.mode == "upstream":
            x = self.upstream_uint8(images).to(images.device).permute(0, 3, 1, 2).float() / 255.0
        else:
            x = self._fast(images)
        x = x.repeat(1, self.copies, 1, 1)
        return (x - self.mean.to(x.device)) / self.std.to(x.device)
