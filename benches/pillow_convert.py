"""The conversion `prep convert --jobs 1` is measured against (issue 31): one core, a Pillow loop
over a folder of class folders of JPEGs that decodes each, scales it so that its shorter side is
SIZE (bilinear, Pillow's default antialiasing), cuts the centre SIZE x SIZE and keeps the pixels
as a C x H x W uint8 array (as prep stores them; no file is written).

    python3 benches/pillow_convert.py PHOTOS [--size 128] [--draft]

--draft lets libjpeg decode at 1/2, 1/4 or 1/8 scale first where the photo is that much larger
(`Image.draft`), as `Image.thumbnail` does; a plain loop does not.
"""

import argparse
import pathlib
import time

import numpy as np
from PIL import Image


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("photos")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--draft", action="store_true")
    a = ap.parse_args()
    files = sorted(p for p in pathlib.Path(a.photos).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    s = a.size
    t = time.perf_counter()
    total = 0
    for p in files:
        img = Image.open(p)
        if a.draft:
            img.draft("RGB", (s, s))
        img = img.convert("RGB")
        w, h = img.size
        k = s / min(w, h)
        nw, nh = max(s, round(w * k)), max(s, round(h * k))
        img = img.resize((nw, nh), Image.BILINEAR)
        x, y = (nw - s) // 2, (nh - s) // 2
        arr = np.asarray(img.crop((x, y, x + s, y + s))).transpose(2, 0, 1)
        total += arr.size
    dt = time.perf_counter() - t
    print(f"pillow{' --draft' if a.draft else ''}: {len(files)} photos to 3x{s}x{s} in {dt:.2f} s on one core ({len(files) / dt:.0f} photos/s), Pillow {Image.__version__}")


if __name__ == "__main__":
    main()
