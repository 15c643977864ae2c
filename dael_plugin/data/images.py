"""Image decoding shared by both engines and ``--check-data``."""
from __future__ import annotations

import numpy as np
from PIL import Image

# How many same-domain replacements a loader tries for one unreadable image.
MAX_REPLACEMENTS = 32


def decode(path: str) -> Image.Image:
    """Decode to RGB (16-bit, RGBA, palette and grey images included); raises on a bad file."""
    with Image.open(path) as f:
        f.load()
        if f.mode in ("I;16", "I;16B", "I;16L", "I"):
            arr = np.asarray(f, dtype=np.float64)
            peak = 65535.0 if f.mode.startswith("I;16") else max(float(arr.max()), 1.0)
            f = Image.fromarray(np.clip(arr / peak * 255.0, 0, 255).astype(np.uint8), "L")
        elif f.mode in ("RGBA", "LA", "PA") or (f.mode == "P" and "transparency" in f.info):
            f = f.convert("RGBA")
            bg = Image.new("RGBA", f.size, (0, 0, 0, 255))
            f = Image.alpha_composite(bg, f)
        return f.convert("RGB")
