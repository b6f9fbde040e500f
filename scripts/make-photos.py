"""A set of real-photo JPEGs of varied sizes from Debian's wallpaper packages (issue 31's photo set).

    apt-get install gnome-backgrounds mate-backgrounds ukui-wallpapers plasma-workspace-wallpapers
    python3 scripts/make-photos.py OUT --count 20000 [--jobs N]
    python3 scripts/make-photos.py OUT --sources DIR --count 20000 --jobs 16   # no packages needed

The sources are the packages' photographs (JPEG files; their PNG files and the KDE renders are
drawings, left out, as are previews). Each output is a random crop of one source (a side of 12% to
60% of the source's shorter side, aspect 3:4 to 4:3), scaled to a random size of 160 to 640 pixels
on its longer side, saved at JPEG quality 90 into OUT/<source>/NNNNN.jpg (one class per source).

Deterministic for a given --seed and the same sources: each source has a random generator of its
own, seeded from --seed and the source's index (random.Random(seed * 1_000_003 + index)), so the
output does not depend on --jobs (sources are generated in parallel by --jobs processes, default
1). Source i makes ceil(count / sources) photos, the last ones fewer, up to --count in all. (Before
per-source generators, one generator ran through all sources in turn: sets made then differ.)

--sources DIR takes the sources from a folder instead of the packages: its JPEG files in sorted
order; a leading "NN-" of a file's name is dropped, so that a folder of "NN-<stem>.jpg" files in
the packages' order (e.g. downscaled copies of the packages' photographs, to carry to a machine
without them) gives the same class folder names as the packages.
"""

import argparse
import multiprocessing
import pathlib
import random
import re

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


def from_folder(folder):
    """The JPEG files of a folder, sorted, with their names without a leading "NN-"."""
    files = sorted(p for p in pathlib.Path(folder).iterdir()
                   if p.is_file() and p.suffix.lower() in (".jpg", ".jpeg"))
    return [(p, re.sub(r"^\d+-", "", p.stem)) for p in files]


def make(job):
    """The photos of one source: (source index, path, stem, how many, seed, out)."""
    si, path, stem, count, seed, out = job
    if count <= 0:
        return 0
    rng = random.Random(seed * 1_000_003 + si)
    img = Image.open(path).convert("RGB")
    w, h = img.size
    name = f"{si:02d}-{stem[:24]}"
    (out / name).mkdir(parents=True, exist_ok=True)
    for k in range(count):
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
    return count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sources", metavar="DIR",
                    help="take the source photos from this folder (sorted) instead of the packages")
    ap.add_argument("--jobs", type=int, default=1, help="processes (the output is the same)")
    a = ap.parse_args()
    if a.sources:
        src = from_folder(a.sources)
        if not src:
            raise SystemExit(f"no JPEG files in {a.sources}")
    else:
        src = [(p, p.stem) for p in sources()]
        if not src:
            raise SystemExit("no photos found: install gnome-backgrounds mate-backgrounds ukui-wallpapers plasma-workspace-wallpapers")
    out = pathlib.Path(a.out)
    per = -(-a.count // len(src))
    jobs = [(si, path, stem, max(0, min(per, a.count - si * per)), a.seed, out)
            for si, (path, stem) in enumerate(src)]
    if a.jobs > 1:
        with multiprocessing.Pool(a.jobs) as pool:
            n = sum(pool.imap_unordered(make, jobs))
    else:
        n = sum(make(j) for j in jobs)
    print(f"{n} photos from {len(src)} sources in {out}")


if __name__ == "__main__":
    main()
