#!/usr/bin/env bash
# Issue 31's own figures on a photo folder (default .dev/photos1k: 1,035 of the photos of
# scripts/make-photos.py), one call (figures go to BENCHMARKS.md "Block codecs"):
#  1. `prep convert --jobs 1` to 3x128x128 and 3x224x224 with each codec against a Pillow
#     decode + resize + centre-crop loop on one core (benches/pillow_convert.py, plain and with
#     libjpeg's DCT scaling, --draft): wall time, bytes on disk.
#  2. The block codecs on one core (benches/codec.rs, built as BENCH): size, encode and decode
#     GB/s, jpeg's samples/s decoded and mean absolute error.
# Usage: scripts/bench-photos.sh [PHOTOS] [PREP] [BENCH] [WORK]   (PYTHON with Pillow, default python3)
set -euo pipefail
photos=${1:-.dev/photos1k}
prep=${2:-.dev/prep}
bench=${3:-.dev/prep-bench-codec}
work=${4:-$(mktemp -d)}
py=${PYTHON:-python3}
mkdir -p "$work"
echo "== $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for size in 128 224; do
  echo "== convert --jobs 1 to 3x${size}x${size} (best of 3)"
  for codec in zstd pred jpeg; do
    best=
    for i in 1 2 3; do
      rm -rf "$work/c-$codec-$size"
      s=$( { /usr/bin/time -f "%e" "$prep" convert "$photos" --out "$work/c-$codec-$size" --size "$size" \
            --codec "$codec" --jobs 1 --quiet; } 2>&1 | tail -1)
      best=$(echo "$s $best" | tr ' ' '\n' | grep . | sort -g | head -1)
    done
    echo "prep --codec $codec: $best s, $(du -sb "$work/c-$codec-$size" | cut -f1) bytes"
  done
  for i in 1 2; do "$py" benches/pillow_convert.py "$photos" --size "$size"; done
  for i in 1 2; do "$py" benches/pillow_convert.py "$photos" --size "$size" --draft; done
  echo "== block codecs on one core, 3x${size}x${size}"
  DATA="$work/c-zstd-$size" REPS=5 taskset -c $(( $(nproc) - 1 )) "$bench"
done
