"""The released evaluations' image pipelines (envs/images.py) on a fixed frame, against values
computed here by the reference methods: PIL's JPEG and resampling filters, and TensorFlow's
crop_and_resize sampling written out independently (scipy's bilinear map_coordinates at the
box's sample points, and the exact values of a linear ramp)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from scipy.ndimage import map_coordinates

from rlvla3.envs.images import CROP_AREA, crop_and_resize_centre, prepare, render_size


def fixed_frame(size: int = 256) -> np.ndarray:
    """Smooth gradients, a checkerboard and seeded noise: every filter changes it."""
    y, x = np.mgrid[:size, :size]
    rng = np.random.default_rng(0)
    frame = np.stack([x * 255 // size, y * 255 // size, ((x // 16 + y // 16) % 2) * 200 + 20], -1)
    return np.clip(frame + rng.integers(-20, 21, frame.shape), 0, 255).astype(np.uint8)


def tf_crop_reference(frame: np.ndarray, area: float) -> np.ndarray:
    """crop_and_resize of the centre box [(1-s)/2, (1+s)/2]^2, s = sqrt(area), to the frame's
    size: output pixel i samples input (1-s)/2 (H-1) + i s (H-1) / (H-1), bilinear; then uint8 as
    convert_image_dtype(saturate=True): x * 255.5 clipped and truncated."""
    s = area ** 0.5
    h, w = frame.shape[:2]
    ys = np.linspace((1 - s) / 2 * (h - 1), (1 + s) / 2 * (h - 1), h)
    xs = np.linspace((1 - s) / 2 * (w - 1), (1 + s) / 2 * (w - 1), w)
    yy, xx = np.meshgrid(ys, xs, indexing="ij")
    chans = [map_coordinates(frame[..., c].astype(np.float64) / 255, [yy, xx], order=1, mode="nearest") for c in range(3)]
    return np.clip(np.stack(chans, -1) * 255.5, 0, 255).astype(np.uint8)


def test_the_centre_crop_samples_the_box_as_tensorflow_does():
    ramp = np.broadcast_to(np.arange(224, dtype=np.uint8)[None, :, None], (224, 224, 3)).copy()
    s = CROP_AREA ** 0.5
    xs = (1 - s) / 2 * 223 + np.arange(224) * s    # linear interpolation of a linear ramp is exact
    want = np.floor(xs / 255 * 255.5).astype(np.uint8)
    got = crop_and_resize_centre(ramp, CROP_AREA)
    assert (np.abs(got[0, :, 0].astype(int) - want) <= 1).all() and (got[0, :, 0] == want).mean() > 0.98
    assert got[0, 0, 0] == 5 and got[0, -1, 0] == 217   # the box starts 2.6% in from each side
    frame = fixed_frame(224)
    diff = np.abs(crop_and_resize_centre(frame, CROP_AREA).astype(int) - tf_crop_reference(frame, CROP_AREA))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.999, (diff.max(), (diff == 0).mean())


def test_openvla_and_openpi_prepare_a_256_frame_as_their_evaluations_do():
    frame = fixed_frame(256)
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, "JPEG", quality=95, subsampling="4:2:0")
    jpeg = np.asarray(Image.open(buf).convert("RGB"))
    assert np.abs(jpeg.astype(int) - frame).mean() > 0.5   # the round trip changes the frame
    small = np.asarray(Image.fromarray(jpeg).resize((224, 224), Image.Resampling.LANCZOS))
    want = tf_crop_reference(small, 0.9)
    got = prepare(frame, "openvla", 224)
    assert got.shape == (224, 224, 3) and got.dtype == np.uint8
    diff = np.abs(got.astype(int) - want)
    assert diff.max() <= 1 and (diff == 0).mean() > 0.999
    assert np.abs(got.astype(int) - small).mean() > 2   # the crop moved the content
    np.testing.assert_array_equal(prepare(frame, "openpi", 224),
                                  np.asarray(Image.fromarray(frame).resize((224, 224), Image.Resampling.BILINEAR)))
    assert prepare(frame, "direct", 256) is frame
    assert (render_size("openvla", 224), render_size("openpi", 224), render_size("direct", 128)) == (256, 256, 128)
    with pytest.raises(ValueError, match="env.image_pipeline='lanczos'"):
        prepare(frame, "lanczos", 224)


def test_gr00t_crops_the_centre_and_resizes_as_its_libero_evaluation_does():
    """GR00T's evaluation runs torchvision on tensors: CenterCrop(243) of the 256 frame, then an
    antialiased bilinear resize to 224; the reference here is torch's own antialiased bilinear
    interpolation of the same crop."""
    import torch

    frame = fixed_frame(256)
    crop = frame[6:249, 6:249]          # 243 = int(0.95 * 256), corner round(6.5) = 6
    x = torch.from_numpy(crop).permute(2, 0, 1)[None].float()
    want = torch.nn.functional.interpolate(x, size=(224, 224), mode="bilinear", align_corners=False, antialias=True)
    want = want.round().clamp(0, 255)[0].permute(1, 2, 0).numpy().astype(int)
    got = prepare(frame, "gr00t", 224)
    assert got.shape == (224, 224, 3) and render_size("gr00t", 224) == 256
    diff = np.abs(got.astype(int) - want)
    assert diff.max() <= 2 and diff.mean() < 0.5, (diff.max(), diff.mean())
    assert np.abs(got.astype(int) - prepare(frame, "openpi", 224)).mean() > 1   # the crop moved the content
