#!/usr/bin/env bash
# Masks beside images against images alone: N JPEG images (SIDE x SIDE, ffmpeg's testsrc2) converted
# as a flat folder, then as images/ beside masks/ (8-bit grey PNG masks of 4 values), each REPS
# times; wall time (median), samples/s and peak RSS of each, and the ratio masked / plain.
#
#   scripts/bench-masks.sh [PREP] [WORK] [N] [SIDE] [REPS]
set -euo pipefail
prep=${1:-target/release/prep} work=${2:-$(mktemp -d)} n=${3:-2000} side=${4:-256} reps=${5:-3}
mkdir -p "$work/plain" "$work/masked/images" "$work/masked/masks"
if [ ! -e "$work/plain/$(printf %05d "$n").jpg" ]; then
  ffmpeg -v error -y -f lavfi -i "testsrc2=size=${side}x${side}:rate=25" -frames:v "$n" \
    -q:v 3 "$work/plain/%05d.jpg"
  ffmpeg -v error -y -f lavfi -i "color=black:size=${side}x${side}:rate=25" -frames:v "$n" \
    -vf "format=gray,geq=lum='mod(floor(X/32)+floor(Y/48)+N,4)'" -pix_fmt gray \
    "$work/masked/masks/%05d.png"
  for f in "$work"/plain/*.jpg; do ln -f "$f" "$work/masked/images/"; done
fi
t() { /usr/bin/time -f "%e %M" -o "$work/t" "$@" > /dev/null 2>&1; cat "$work/t"; }
printf '| input | convert s (median of %s) | samples/s | peak RSS MiB |\n| --- | --- | --- | --- |\n' "$reps"
declare -A rate
for kind in plain masked; do
  runs=()
  for _ in $(seq "$reps"); do
    rm -rf "$work/out-$kind"
    runs+=("$(t "$prep" convert "$work/$kind" --out "$work/out-$kind" --test-fraction 0 --quiet)")
  done
  read -r s kb <<< "$(printf '%s\n' "${runs[@]}" | sort -n | sed -n "$(( (reps + 1) / 2 ))p")"
  rate[$kind]=$(python3 -c "print($n / $s)")
  python3 -c "print(f'| $kind | {$s:.2f} | {$n / $s:,.0f} | {$kb / 1024:.1f} |')"
done
python3 -c "print(f'masked / plain: {${rate[masked]} / ${rate[plain]}:.2f}x')"
