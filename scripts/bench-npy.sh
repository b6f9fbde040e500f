#!/usr/bin/env bash
# Peak memory and time of `prep convert` on a large .npy array saved in Fortran order, against its
# C-order twin (the same values), in one run. Writes both arrays (GiB each) under DIR.
#
#   scripts/bench-npy.sh [DIR] [N]     N samples of 64x64 uint8 (default 524288: 2 GiB)
#
# Needs a release build (target/release/prep) and GNU time (/usr/bin/time).
set -euo pipefail
dir=${1:-/tmp/prep-bench-npy}
n=${2:-524288}
prep=${PREP:-target/release/prep}
rm -rf "$dir"
mkdir -p "$dir/c" "$dir/f"
python3 - "$dir" "$n" <<'EOF'
import struct, sys
d, n = sys.argv[1], int(sys.argv[2])
h = w = 64

def header(descr, shape, fortran):
    text = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        descr, "True" if fortran else "False", ", ".join(map(str, shape)) + ("," if len(shape) == 1 else ""))
    text += " " * (63 - (10 + len(text)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()

# Value at (i, y, x) = (i + 3y + 5x) mod 256: a run of the first axis is a rotation of 0..255.
ramp = bytes(range(256)) * (n // 256 + 2)
with open(f"{d}/f/x_train.npy", "wb") as f:
    f.write(header("|u1", (n, h, w), True))
    for x in range(w):
        for y in range(h):
            s = (3 * y + 5 * x) % 256
            f.write(ramp[s:s + n])
with open(f"{d}/c/x_train.npy", "wb") as f:
    f.write(header("|u1", (n, h, w), False))
    # Sample i depends on i mod 256 only: 256 distinct samples, written in turn.
    distinct = [bytes((i + 3 * y + 5 * x) % 256 for y in range(h) for x in range(w)) for i in range(256)]
    for i in range(n):
        f.write(distinct[i % 256])
labels = b"".join(struct.pack("<q", i % 10) for i in range(n))
for sub in ("c", "f"):
    with open(f"{d}/{sub}/y_train.npy", "wb") as f:
        f.write(header("<i8", (n,), False))
        f.write(labels)
EOF
ls -l "$dir"/c "$dir"/f
for sub in c f; do
  echo "== $sub order"
  /usr/bin/time -v "$prep" convert "$dir/$sub" --out "$dir/$sub-out" --quiet 2> "$dir/$sub.time"
  grep -E "Elapsed|Maximum resident" "$dir/$sub.time"
done
# The shards (not the manifest, which names its input) must be the same bytes.
(cd "$dir/c-out" && find . -name '*.shard' | sort | xargs sha256sum) > "$dir/c.sums"
(cd "$dir/f-out" && find . -name '*.shard' | sort | xargs sha256sum) > "$dir/f.sums"
cmp "$dir/c.sums" "$dir/f.sums" && echo "shards identical: $(wc -l < "$dir/c.sums") files"
