#!/usr/bin/env bash
# Fields against images alone (issue 27, acceptance 5): the same .npy images converted with a class
# per sample and with a mask per sample ((N,H,W) u8, 4 values), then read back whole by
# `prep verify` (every block decoded and checked). Wall time, samples/s and peak RSS of each.
#
#   scripts/bench-fields.sh [PREP] [WORK] [N] [SIDE]
set -euo pipefail
prep=${1:-target/release/prep} work=${2:-$(mktemp -d)} n=${3:-60000} side=${4:-64}
mkdir -p "$work"
python3 - "$work" "$n" "$side" <<'PY'
import os, sys
import numpy as np
work, n, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
yy, xx = np.mgrid[0:s, 0:s]
x = np.empty((n, s, s), np.uint8)
m = np.empty((n, s, s), np.uint8)
for i in range(0, n, 1000):
    k = min(1000, n - i)
    cx = rng.integers(s // 4, 3 * s // 4, k)[:, None, None]
    cy = rng.integers(s // 4, 3 * s // 4, k)[:, None, None]
    r = rng.integers(s // 8, s // 3, k)[:, None, None]
    d2 = (xx - cx) ** 2 + (yy - cy) ** 2
    m[i:i + k] = (d2 < r * r) * (1 + (np.arange(k) % 3))[:, None, None]
    x[i:i + k] = (m[i:i + k] * 60 + rng.integers(0, 40, (k, s, s))).astype(np.uint8)
for name, y in [("class", (np.arange(n) % 3).astype(np.uint8)), ("mask", m)]:
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, "x_train.npy"), x)
    np.save(os.path.join(d, "y_train.npy"), y)
PY
t() { /usr/bin/time -f "%e %M" -o "$work/t" "$@" > /dev/null 2>&1; read -r s kb < "$work/t"; echo "$s $kb"; }
printf '| input | convert s | convert samples/s | convert peak RSS MiB | verify s | verify samples/s | verify MiB/s decoded | verify peak RSS MiB |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n'
for kind in class mask; do
  rm -rf "$work/out-$kind"
  read -r cs ckb <<< "$(t "$prep" convert "$work/$kind" --out "$work/out-$kind" --quiet)"
  read -r vs vkb <<< "$(t "$prep" verify "$work/out-$kind" --quiet)"
  per=$(( side * side + 4 )); [ "$kind" = mask ] && per=$(( 2 * side * side + 4 ))
  python3 -c "
n,cs,vs,ckb,vkb,per=$n,$cs,$vs,$ckb,$vkb,$per
print(f'| {\"$kind\"} | {cs:.2f} | {n/cs:,.0f} | {ckb/1024:.1f} | {vs:.2f} | {n/vs:,.0f} | {n*per/vs/2**20:,.0f} | {vkb/1024:.1f} |')"
done
# Read back through the Python reader (batches() of 512, every core), where `import prep` works:
# PY=/path/to/python of a venv with prep installed.
if ${PY:-python3} -c "import prep" 2>/dev/null; then
  printf '\n| input | batches() s | samples/s | MiB/s (pixels + fields) |\n| --- | --- | --- | --- |\n'
  for kind in class mask; do
    ${PY:-python3} - "$work/out-$kind" "$kind" <<'PY'
import sys, time
import prep
s = prep.open(sys.argv[1])["train"]
best = None
for _ in range(3):
    t = time.perf_counter(); n = 0; nbytes = 0
    for b in s.batches(512, seed=0):
        if isinstance(b, dict):
            n += len(b["class"]); nbytes += sum(v.nbytes for v in b.values())
        else:
            n += len(b[1]); nbytes += b[0].nbytes + b[1].nbytes
    dt = time.perf_counter() - t
    best = dt if best is None else min(best, dt)
print(f"| {sys.argv[2]} | {best:.2f} | {n / best:,.0f} | {nbytes / best / 2**20:,.0f} |")
PY
  done
fi
