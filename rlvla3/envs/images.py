"""How a rendered frame becomes the policy's image, as a released checkpoint's own LIBERO
evaluation prepares it (`env.image_pipeline`). numpy and PIL only: it runs in the env's own
interpreter (LIBERO's), on frames already turned the way the checkpoint saw them.

- direct: the frame as rendered at env.image_size (the project's own policies).
- openvla: OpenVLA's and OpenVLA-OFT's evaluation (openvla/openvla and moojink/openvla-oft,
  experiments/robot/libero/libero_utils.py and openvla_utils.py): rendered at 256, a JPEG round
  trip at quality 95, an antialiased Lanczos-3 resize, then the centre crop both projects call
  important (their fine-tunes trained on random crops of 0.9 of the area): the centre box of
  sqrt(0.9) of each side, resized back by a bilinear crop-and-resize (TensorFlow's
  `crop_and_resize` sampling) and converted to uint8 as TensorFlow's `convert_image_dtype` does.
- openpi: openpi's LIBERO client (examples/libero/main.py, openpi_client/image_tools.py):
  rendered at 256, a bilinear resize (PIL) to the policy's size.
- gr00t: GR00T N1.5's LIBERO evaluation (NVIDIA/Isaac-GR00T, examples/Libero: its video
  transforms at evaluation): rendered at 256, the centre square of 0.95 of the side (243 px,
  torchvision's CenterCrop rounding), an antialiased bilinear resize to the policy's size.
"""
from __future__ import annotations

import io

import numpy as np

# name -> the size the env renders at (None: env.image_size itself)
PIPELINES: dict[str, int | None] = {"direct": None, "openvla": 256, "openpi": 256, "gr00t": 256}
CROP_AREA = 0.9   # OpenVLA's and OFT's centre crop: the fraction of the area it keeps
GR00T_CROP = 0.95  # GR00T's LIBERO evaluation: the fraction of the side its centre crop keeps


def render_size(pipeline: str, image_size: int) -> int:
    """The square size the env renders at for `pipeline`."""
    return PIPELINES[pipeline] or image_size


def prepare(frame: np.ndarray, pipeline: str, size: int) -> np.ndarray:
    """One camera's uint8 frame [R, R, 3] as `pipeline` hands it to the policy: [size, size, 3] uint8."""
    if pipeline == "direct":
        return frame
    if pipeline == "openvla":
        return crop_and_resize_centre(lanczos(jpeg_round_trip(frame), size), CROP_AREA)
    if pipeline == "openpi":
        return pil_resize(frame, size, "BILINEAR")
    if pipeline == "gr00t":
        return pil_resize(centre_square(frame, GR00T_CROP), size, "BILINEAR")
    raise ValueError(f"env.image_pipeline={pipeline!r}: use one of {', '.join(PIPELINES)}")


def jpeg_round_trip(frame: np.ndarray, quality: int = 95) -> np.ndarray:
    """Encode as JPEG and decode (TensorFlow's encode_jpeg defaults: quality 95, 4:2:0 chroma)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, "JPEG", quality=quality, subsampling="4:2:0")
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def lanczos(frame: np.ndarray, size: int) -> np.ndarray:
    """An antialiased Lanczos-3 resize to [size, size] (the kernel widened by the shrink factor)."""
    return pil_resize(frame, size, "LANCZOS")


def pil_resize(frame: np.ndarray, size: int, method: str) -> np.ndarray:
    from PIL import Image

    if frame.shape[:2] == (size, size):
        return frame
    return np.asarray(Image.fromarray(frame).resize((size, size), resample=getattr(Image.Resampling, method)))


def crop_and_resize_centre(frame: np.ndarray, area: float) -> np.ndarray:
    """The centre box keeping `area` of the frame, bilinearly resampled back to the frame's size
    as TensorFlow's crop_and_resize samples a box [y1, x1, y2, x2] (output row i reads input row
    y1 (H - 1) + i (y2 - y1) (H - 1) / (h - 1)); then float [0, 1] -> uint8 as
    convert_image_dtype(saturate=True) does (x * 255.5, clipped, truncated)."""
    f32 = np.float32
    side = area ** 0.5
    lo, hi = f32((1 - side) / 2), f32((1 + side) / 2)
    h, w = frame.shape[:2]
    x = frame.astype(f32) * f32(1 / 255)   # float32 throughout, in TensorFlow's order of operations
    ys = lo * f32(h - 1) + np.arange(h, dtype=f32) * ((hi - lo) * f32(h - 1) / f32(h - 1))
    xs = lo * f32(w - 1) + np.arange(w, dtype=f32) * ((hi - lo) * f32(w - 1) / f32(w - 1))
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.ceil(ys).astype(int), np.ceil(xs).astype(int)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    top = x[y0][:, x0] + (x[y0][:, x1] - x[y0][:, x0]) * fx
    bottom = x[y1][:, x0] + (x[y1][:, x1] - x[y1][:, x0]) * fx
    out = np.clip(top + (bottom - top) * fy, f32(0), f32(1))
    return np.clip(out * f32(255.5), 0, 255).astype(np.uint8)


def centre_square(frame: np.ndarray, side: float) -> np.ndarray:
    """The centre square keeping `side` of the frame's side (int of it), its corner rounded as
    torchvision's CenterCrop rounds it."""
    h, w = frame.shape[:2]
    c = int(side * min(h, w))
    top, left = int(round((h - c) / 2.0)), int(round((w - c) / 2.0))
    return frame[top:top + c, left:left + c]
