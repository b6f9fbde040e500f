#!/usr/bin/env bash
# Benchmarks for `prep convert` (figures go to BENCHMARKS.md):
#  1. Fashion-MNIST (Debian's dataset-fashion-mnist) to shards and to colmajor: wall time.
#  2. 512x512 JPEGs to 32x32: images/s, with 1 worker and with all cores.
#  3. An image folder of at least 2 GB (1000 1024x768 RGB PNGs of noise, 2.4 GB): peak RSS.
# Usage: scripts/bench-convert.sh [target/release/prep] [workdir]
set -euo pipefail
prep=${1:-target/release/prep}
work=${2:-$(mktemp -d)}
mkdir -p "$work"
t() { /usr/bin/time -f "%e s wall, %M KB peak RSS" "$@"; }

fm=/usr/share/datasets/fashion-mnist
if [ -d "$fm" ]; then
  echo "== Fashion-MNIST -> shards (3 runs)"
  for i in 1 2 3; do rm -rf "$work/fm"; t "$prep" convert "$fm" --out "$work/fm"; done
  echo "== Fashion-MNIST -> colmajor"
  rm -rf "$work/fmc"; t "$prep" convert "$fm" --out "$work/fmc" --format colmajor
fi

echo "== 512x512 JPEGs -> 32x32"
python3 - "$work/jpg" <<'PY'
import os, sys
# 1000 distinct 512x512 JPEGs (Mandelbrot views, quality 90), 4 classes, made with Pillow.
root = sys.argv[1]
try:
    from PIL import Image
except ImportError:
    os.system(f"{sys.executable} -m pip install --quiet pillow")
    from PIL import Image
import random
random.seed(0)
for k in range(4):
    d = os.path.join(root, f"class{k}")
    os.makedirs(d, exist_ok=True)
    for i in range(250):
        p = os.path.join(d, f"{i:04}.jpg")
        if os.path.exists(p):
            continue
        img = Image.effect_mandelbrot((512, 512), (-2 + i * 0.001, -1.2, 1 - k * 0.1, 1.2), 60 + i % 40).convert("RGB")
        img.save(p, quality=90)
PY
du -sh "$work/jpg"
for j in 1 2; do
  rm -rf "$work/jpgout"; t "$prep" --jobs $j convert "$work/jpg" --out "$work/jpgout" --size 32x32
done

echo "== image folder of at least 2 GB: peak RSS"
python3 - "$work/big" <<'PY'
import os, sys
from PIL import Image
root = sys.argv[1]
for k in range(4):
    d = os.path.join(root, f"c{k}")
    os.makedirs(d, exist_ok=True)
    for i in range(250):
        p = os.path.join(d, f"{i:04}.png")
        if not os.path.exists(p):
            Image.frombytes("RGB", (1024, 768), os.urandom(1024 * 768 * 3)).save(p, compress_level=0)
PY
du -sh "$work/big"
rm -rf "$work/bigout"; t "$prep" convert "$work/big" --out "$work/bigout" --size 64x64
