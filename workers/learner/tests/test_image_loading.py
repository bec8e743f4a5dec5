"""Screenshots reach the image processor as vLLM 0.33 hands them to it (`vllm/multimodal/image.py`): transparency
composited onto white and EXIF orientation applied, so the learner scores the pixels the server sampled from."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from conftest import messages
from halo_learner.models import build_tiny_processor
from halo_learner.prompts import encode_prompt, load_image


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def processor():
    return build_tiny_processor()


def test_a_transparent_screenshot_is_encoded_as_the_same_picture_on_white(processor, blobs):
    # Transparent pixels store black: dropping alpha (PIL's convert("RGB")) would make them black.
    clear = Image.new("RGBA", (64, 48), (0, 0, 0, 0))
    white = Image.new("RGB", (64, 48), (255, 255, 255))
    a = encode_prompt(processor, messages(blobs.put(_png(clear), "png"), "Goal: x"), blobs)
    b = encode_prompt(processor, messages(blobs.put(_png(white), "png"), "Goal: x"), blobs)
    assert a.input_ids.tolist() == b.input_ids.tolist()
    assert (a.pixel_values - b.pixel_values).abs().max().item() == 0.0


def test_partial_alpha_blends_onto_white_and_palette_transparency_counts():
    half = load_image(_png(Image.new("RGBA", (4, 4), (0, 0, 200, 128))))
    assert half.mode == "RGB"
    r, g, b = half.getpixel((0, 0))
    # PIL's paste with a mask: 255 + (src - 255) * 128 / 255, per channel
    assert (r, g) == (127, 127) and abs(b - 227) <= 1
    palette = Image.new("P", (4, 4), 0)
    palette.putpalette([10, 20, 30] + [0] * 765)
    buf = io.BytesIO()
    palette.save(buf, "PNG", transparency=0)  # a tRNS chunk: index 0 is fully transparent
    assert load_image(buf.getvalue()).getpixel((1, 1)) == (255, 255, 255)
    opaque = Image.new("RGB", (4, 4), (10, 20, 30))
    assert load_image(_png(opaque)).getpixel((2, 2)) == (10, 20, 30)


def test_exif_orientation_is_applied():
    wide = Image.new("RGB", (8, 4), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    buf = io.BytesIO()
    wide.save(buf, "JPEG", exif=exif.tobytes())
    assert load_image(buf.getvalue()).size == (4, 8)
