"""Images made with Pillow for the diagnostics tests: natural-looking scenes (smooth noise and
shapes) and the damaged copies a dataset ends up with (blurred, dark, blown out, flat,
re-encoded, resized, cropped). Seeded: the same calls make the same pixels."""

from __future__ import annotations

import io

import numpy as np


def scene(seed: int, size: int = 64):
    """A textured RGB image: upsampled colour noise with random rectangles and ellipses."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    base = Image.fromarray(rng.integers(30, 226, (6, 6, 3), dtype=np.uint8)).resize((size, size), Image.BICUBIC)
    draw = ImageDraw.Draw(base)
    for _ in range(6):
        x0, y0 = (int(v) for v in rng.integers(0, size - 8, 2))
        x1, y1 = x0 + int(rng.integers(6, size // 2)), y0 + int(rng.integers(6, size // 2))
        colour = tuple(int(c) for c in rng.integers(20, 236, 3))
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)([x0, y0, x1, y1], fill=colour)
    fine = rng.integers(-12, 13, (size, size, 3))  # sensor-like grain, so edges are not the only detail
    return Image.fromarray(np.clip(np.asarray(base, np.int16) + fine, 0, 255).astype(np.uint8))


def blurred(image, radius: float = 2.5):
    from PIL import ImageFilter

    return image.filter(ImageFilter.GaussianBlur(radius))


def dark(image):
    from PIL import ImageEnhance

    return ImageEnhance.Brightness(image).enhance(0.012)


def blown_out(image):
    from PIL import ImageEnhance

    return ImageEnhance.Brightness(image).enhance(5.0)


def flat(image):
    from PIL import ImageEnhance

    return ImageEnhance.Contrast(image).enhance(0.12)


def reencoded(image, quality: int = 40):
    from PIL import Image

    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def resized(image, factor: float = 0.75):
    from PIL import Image

    return image.resize((int(image.width * factor), int(image.height * factor)), Image.BILINEAR)


def cropped(image, fraction: float = 0.05):
    w, h = image.size
    dx, dy = int(w * fraction), int(h * fraction)
    return image.crop((dx, dy, w - dx, h - dy))


def write_tree(root, images: dict[str, list]) -> None:
    """``root/<class>/<nnn>.png`` for each class's images (PNG: the pixels exactly as made)."""
    for name, members in images.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for j, image in enumerate(members):
            image.save(root / name / f"{j:03d}.png")
