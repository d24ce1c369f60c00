"""Diabetic Retinopathy's `btgraham-300` preprocessing: raw Kaggle fundus photographs -> what VTAB reads.

TFDS's `diabetic_retinopathy_detection/btgraham-300` (3.0.0, `_btgraham_processing`) prepares each image as Ben
Graham, the 2015 Kaggle winner, described: scale the image so that the eyeball's radius is 300 pixels, subtract
the local average colour (4 * (image - GaussianBlur(image, sigma = radius / 30)) + 128, saturated to 0..255),
paint everything outside 90% of the radius grey (128), crop to that circle's box, and encode as JPEG quality 72.
This module does the same steps up to the encoding with the same OpenCV operations TFDS calls (bilinear `resize`, `GaussianBlur`
with a kernel size derived from sigma, `addWeighted`, a filled `circle`), so pixels agree with TFDS's for a given
OpenCV build; a NumPy/SciPy/PIL version differs (docs/datasets.md, "VTAB tasks", gives the measured difference).
Every step works per channel except the radius estimate, which sums the channels: RGB and OpenCV's BGR give the
same result.
"""

from __future__ import annotations

import numpy as np

from vlbench.errors import VlbenchError

RADIUS = 300  # btgraham-300
MASK_RATIO = 0.9
GREY = 128


class RetinopathyError(VlbenchError):
    """An image btgraham preprocessing cannot take, or OpenCV missing."""


def _cv2():
    try:
        import cv2
    except ImportError as err:  # pragma: no cover - a dependency of the project
        raise RetinopathyError("btgraham preprocessing needs OpenCV: pip install opencv-python-headless") from err
    return cv2


def eye_radius(image: np.ndarray) -> float:
    """TFDS's estimate: half the number of pixels of the middle row brighter than a tenth of that row's mean
    (summed over channels); the image's half height when that is under one pixel (corrupt images)."""
    row = image[image.shape[0] // 2, :, :].sum(axis=1)
    r = (row > row.mean() / 10.0).sum() / 2.0
    return float(r) if r >= 1.0 else image.shape[0] / 2.0


def btgraham(image: np.ndarray, radius: int = RADIUS, mask_ratio: float = MASK_RATIO, crop: bool = True) -> np.ndarray:
    """The btgraham-`radius` image (uint8, H x W x 3) of a uint8 H x W x 3 array (RGB or BGR: see above)."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise RetinopathyError(f"btgraham needs an H x W x 3 uint8 image, got shape {image.shape} {image.dtype}")
    cv2 = _cv2()
    s = radius / eye_radius(image)
    image = cv2.resize(image, dsize=None, fx=s, fy=s)
    blurred = cv2.GaussianBlur(image, (0, 0), radius / 30)
    image = cv2.addWeighted(image, 4, blurred, -4, GREY)
    inside = int(radius * mask_ratio)
    h, w = image.shape[:2]
    mask = np.zeros((h, w), np.uint8)
    cv2.circle(mask, center=(w // 2, h // 2), radius=inside, color=1, thickness=-1)
    image = np.where(mask[:, :, None] == 1, image, np.uint8(GREY))
    if crop:
        image = image[max(h // 2 - inside, 0):min(h // 2 + inside, h), max(w // 2 - inside, 0):min(w // 2 + inside, w)]
    return np.ascontiguousarray(image)


