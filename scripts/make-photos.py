"""A set of real-photo JPEGs of varied sizes from Debian's wallpaper packages (issue 31's photo set).

    apt-get install gnome-backgrounds mate-backgrounds ukui-wallpapers plasma-workspace-wallpapers
    python3 scripts/make-photos.py OUT --count 20000

The sources are the packages' photographs (JPEG files; their PNG files and the KDE renders are
drawings, left out, as are previews). Each output is a random crop of one source (a side of 12% to
60% of the source's shorter side, aspect 3:4 to 4:3), scaled to a random size of 160 to 640 pixels
on its longer side, saved at JPEG quality 90 into OUT/<source>/NNNNN.jpg (one class per source).
Deterministic for a given --seed and the same packages.
"""

import argparse
import pathlib
import random

from PIL import Image

ROOTS = ["/usr/share/backgrounds", "/usr/share/wallpapers"]
# Drawings and renders among the JPEG files.
NOT_PHOTOS = ("analogpattern", "Painting-Colors", "GreenTraditional", "rhythm", "string.jpg",
              "2004default", "/Flow/", "/Honeywave/", "/SafeLanding/", "/Shell/", "/Volna/",
              "screenshot", "Elephants_")


def sources():
    """One file per photograph: the largest of a wallpaper's several resolutions."""
    best = {}
    for root in ROOTS:
        for p in sorted(pathlib.Path(root).rglob("*")):
            s = str(p)
            if p.suffix.lower() in (".jpg", ".jpeg") and not any(n in s for n in NOT_PHOTOS):
                key = str(p.parent.parent.parent) if p.parent.name.startswith("images") else s
                if key not in best or p.stat().st_size > best[key].stat().st_size:
                    best[key] = p
    return sorted(best.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    src = sources()
    if not src:
        raise SystemExit("no photos found: install gnome-backgrounds mate-backgrounds ukui-wallpapers plasma-workspace-wallpapers")
    rng = random.Random(a.seed)
    out = pathlib.Path(a.out)
    per = -(-a.count // len(src))
    n = 0
    for si, path in enumerate(src):
        img = Image.open(path).convert("RGB")
        w, h = img.size
        name = f"{si:02d}-{path.stem[:24]}"
        (out / name).mkdir(parents=True, exist_ok=True)
        for k in range(per):
            if n == a.count:
                break
            side = rng.uniform(0.12, 0.6) * min(w, h)
            aspect = rng.uniform(0.75, 4 / 3)
            cw, ch = int(side * aspect ** 0.5), int(side / aspect ** 0.5)
            cw, ch = min(cw, w), min(ch, h)
            x, y = rng.randrange(w - cw + 1), rng.randrange(h - ch + 1)
            longer = rng.randint(160, 640)
            scale = longer / max(cw, ch)
            size = (max(1, round(cw * scale)), max(1, round(ch * scale)))
            crop = img.crop((x, y, x + cw, y + ch)).resize(size, Image.LANCZOS)
            crop.save(out / name / f"{k:05d}.jpg", quality=90)
            n += 1
    print(f"{n} photos from {len(src)} sources in {out}")


if __name__ == "__main__":
    main()
