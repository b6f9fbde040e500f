#!/usr/bin/env bash
# How much the synthetic task needs: test accuracy of `prep train` (model small, defaults) on
# `prep synth` datasets of several sizes after several epochs, one table row per run.
#
#   scripts/synth-learnability.sh [PREP] [DIR] [DEVICE]   (DEVICE: auto, cpu, cuda; default auto)
#
# Sizes and epochs: SIZES="20000 100000 500000" EPOCHS="1 3 10" (environment).
set -euo pipefail
prep=${1:-target/release/prep}
dir=${2:-/tmp/prep-learnability}
device=${3:-auto}
sizes=${SIZES:-20000 100000 500000}
epochs=${EPOCHS:-1 3 10}
shape=${SHAPE:-3x32x32}
mkdir -p "$dir"
printf '| train samples | epochs | test accuracy | train s |\n| --- | --- | --- | --- |\n'
for n in $sizes; do
  ds="$dir/s$n"
  "$prep" synth --train "$n" --test 10000 --shape "$shape" --out "$ds" --quiet
  for e in $epochs; do
    run="$dir/r$n-$e"
    rm -rf "$run"
    "$prep" train "$ds" --epochs "$e" --device "$device" --out "$run" --quiet --json > "$run.json"
    python3 - "$run.json" "$n" "$e" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"| {int(sys.argv[2]):,} | {sys.argv[3]} | {s['test_accuracy']:.3f} | {s['seconds']:.1f} |")
PY
  done
done
