"""btgraham-300 preprocessing on a synthetic fundus whose radius, colours and one bright spot the test sets."""

from __future__ import annotations

import numpy as np
import pytest

from vlbench.datasets.retinopathy import RetinopathyError, btgraham, eye_radius

H, W, R = 700, 900, 250  # image size and the eyeball's radius in pixels
COLOUR = (150, 90, 60)


def fundus(spot: bool = False) -> np.ndarray:
    yy, xx = np.mgrid[:H, :W]
    disc = (yy - H // 2) ** 2 + (xx - W // 2) ** 2 <= R ** 2
    image = np.zeros((H, W, 3), np.uint8)
    image[disc] = COLOUR
    if spot:  # a bright 9 x 9 spot, 100 px right of the centre
        image[H // 2 - 4:H // 2 + 5, W // 2 + 96:W // 2 + 105] = (250, 250, 250)
    return image


def test_radius_is_half_the_bright_pixels_of_the_middle_row():
    assert eye_radius(fundus()) == (2 * R + 1) / 2  # the middle row crosses the disc on 2R + 1 pixels
    assert eye_radius(np.zeros((40, 60, 3), np.uint8)) == 20.0  # nothing bright: half the height


def test_btgraham_geometry_grey_border_and_flat_inside():
    out = btgraham(fundus())
    # scaled by 300 / 250.5, then cropped to the box of the circle of radius int(300 * 0.9) = 270
    assert out.shape == (540, 540, 3) and out.dtype == np.uint8
    yy, xx = np.mgrid[:540, :540]
    outside = (yy - 270) ** 2 + (xx - 270) ** 2 > 272 ** 2
    assert (out[outside] == 128).all()  # the mask paints grey outside 90% of the radius
    # inside the eye and away from its rim the colour is flat, so 4 * (image - local average) + 128 is 128
    centre = out[250:290, 250:290].astype(int)
    assert np.abs(centre - 128).max() <= 1


def test_btgraham_subtracts_the_local_average():
    out = btgraham(fundus(spot=True)).astype(int)
    spot_x = 270 + round(100 * 300 / 250.5)  # where the spot's centre lands after scaling
    assert (out[270, spot_x] > 200).all()  # brighter than its surroundings: pushed up
    assert (out[270, spot_x - 20] < 128).all()  # its blurred halo pulls the neighbourhood below grey


def test_btgraham_refuses_what_is_not_an_image():
    with pytest.raises(RetinopathyError, match="H x W x 3 uint8"):
        btgraham(np.zeros((10, 10), np.uint8))


def test_btgraham_equals_tfds_steps_with_a_float_mask():
    """TFDS masks with a float H x W x 3 mask (image * mask + (1 - mask) * 128) and lets imencode convert the
    float image; the uint8 mask here must give the same pixels, on a textured eye where the blur matters."""
    import cv2
    from scipy.ndimage import gaussian_filter

    texture = gaussian_filter(np.random.default_rng(0).normal(size=(H, W, 3)), sigma=(4, 4, 0))
    image = fundus().astype(float)
    image[image.sum(axis=2) > 0] += 40 * texture[image.sum(axis=2) > 0] / texture.std()
    image = np.clip(image, 0, 255).astype(np.uint8)
    s = 300 / eye_radius(image)
    scaled = cv2.resize(image, dsize=None, fx=s, fy=s)
    sharp = cv2.addWeighted(scaled, 4, cv2.GaussianBlur(scaled, (0, 0), 10), -4, 128)
    mask = np.zeros(sharp.shape)
    h, w = sharp.shape[:2]
    cv2.circle(mask, center=(w // 2, h // 2), radius=270, color=(1, 1, 1), thickness=-1)
    expected = (sharp * mask + (1 - mask) * 128)[h // 2 - 270:h // 2 + 270, w // 2 - 270:w // 2 + 270]
    assert np.array_equal(btgraham(image), np.rint(expected).astype(np.uint8))
