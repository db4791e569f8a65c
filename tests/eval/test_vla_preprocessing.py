"""The upstream image preprocessing mode against an independent PIL / numpy computation."""

import numpy as np
import pytest
import torch
import vla_reference as ref
from rlinf_embodied.policies.preprocessing import (
    ImagePreprocessor,
    lanczos3_weights,
    read_preprocessor_stats,
)

MEANS = [ref.BF16_DINO_MEAN, [0.5, 0.5, 0.5]]
STDS = [ref.BF16_DINO_STD, [0.5, 0.5, 0.5]]


def test_upstream_mode_pins_a_fixed_image_to_the_reference():
    img = ref.fixed_image(256)
    pre = ImagePreprocessor(224, MEANS, STDS, center_crop=True, mode="upstream")
    got = pre(torch.from_numpy(img)[None])[0].numpy()
    want = ref.ref_pixels(img, 224, MEANS, STDS)
    assert got.shape == want.shape == (6, 224, 224)
    # JPEG and Lanczos stages agree exactly; the crop's sample coordinates may differ by one
    # float32 ulp (order of operations), which moves a handful of pixels across a floor()
    # boundary by one grey level.
    off = np.abs(got - want) > 1e-5
    assert off.mean() < 5e-4 and np.abs(got - want).max() < 1.01 / 255 / min(STDS[0])
    x = torch.from_numpy(img)[None]
    no_crop = ImagePreprocessor(224, MEANS, STDS, center_crop=False, mode="upstream")
    assert np.array_equal(no_crop.upstream_uint8(x)[0].numpy(), ref.ref_lanczos(ref.ref_jpeg(img), 224))
    # Each stage matters: without the JPEG round trip the uint8 image differs.
    u8 = pre.upstream_uint8(x)[0].numpy()
    assert (u8 != ref.ref_crop_and_resize(ref.ref_lanczos(img, 224))).mean() > 0.1
    # The fast path is a few grey levels off (recorded in the report / bench).
    fast = ImagePreprocessor(224, MEANS, STDS, center_crop=True, mode="fast")
    diff = (fast(torch.from_numpy(img)[None]) - pre(torch.from_numpy(img)[None])).abs()
    grey = (diff[0, :3] * torch.tensor(STDS[0])[:, None, None] * 255)
    assert 0.5 < float(grey.mean()) < 20
    assert pre.describe()["mode"] == "upstream" and pre.describe()["means"][0] == ref.BF16_DINO_MEAN


def test_lanczos_weights_and_preprocessor_config(tmp_path):
    w = lanczos3_weights(256, 224)
    assert torch.allclose(w.sum(1), torch.ones(224, dtype=torch.float64))
    assert torch.allclose(lanczos3_weights(7, 7), torch.eye(7, dtype=torch.float64), atol=1e-15)
    assert read_preprocessor_stats(tmp_path) is None
    (tmp_path / "preprocessor_config.json").write_text('{"means": [[0.5, 0.5]]}')
    with pytest.raises(ValueError, match="means"):
        read_preprocessor_stats(tmp_path)
    with pytest.raises(ValueError, match="image_preprocessing"):
        ImagePreprocessor(224, MEANS, STDS, mode="bilinear")
