#!/usr/bin/env bash
# Peak RSS of `prep convert` reading the column-major layout (issue 11; figures in BENCHMARKS.md):
# 200,000 + 1,000 synthetic 3x32x32 samples (2.4 GB of float32) converted to colmajor and back,
# with and without prep's manifest, and with --dtype f32; 50,000 samples for scale; then the
# colmajor -> shards -> colmajor round trip compared byte for byte. Needs about 6 GB in WORKDIR;
# removes what it made.
# Usage: scripts/bench-colmajor.sh [target/release/prep] [workdir]
set -euo pipefail
P=${1:-target/release/prep}
T=${2:-$(mktemp -d)}
mkdir -p "$T"
cleanup() { rm -rf "$T"/cm-src "$T"/cm "$T"/cm-bare "$T"/cm-back "$T"/cm-back-bare "$T"/cm-f32 \
  "$T"/cm50 "$T"/cm50-back "$T"/cm-again "$T"/time.txt; }
cleanup
trap cleanup EXIT
# LABEL CMD...: /usr/bin/time's peak RSS and wall time, and the largest RssAnon (the process's own
# memory) and RssFile (mapped page cache) seen in /proc every 20 ms.
m() {
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o "$T/time.txt" "$@" &
  local tp=$!
  sleep 0.05
  local pid ma=0 mf=0 a f
  pid=$(pgrep -P $tp | head -1)
  while kill -0 $tp 2>/dev/null; do
    read -r a f < <(awk '/RssAnon/{a=$2}/RssFile/{f=$2}END{print a+0, f+0}' /proc/"$pid"/status 2>/dev/null || echo "0 0")
    [ "${a:-0}" -gt $ma ] && ma=$a
    [ "${f:-0}" -gt $mf ] && mf=$f
    sleep 0.02
  done
  wait $tp
  local wall kb
  read -r wall kb < "$T/time.txt"
  printf "| %s | %s s | %s KB (%s MiB) | %d MiB | %d MiB |\n" "$label" "$wall" "$kb" $((kb / 1024)) $((ma / 1024)) $((mf / 1024))
}
echo "| step | wall | peak RSS (time) | max RssAnon | max RssFile |"
echo "| --- | --- | --- | --- | --- |"
m "synth 200k shards" "$P" synth --train 200000 --test 1000 --shape 3x32x32 --out "$T/cm-src" --quiet
m "shards -> colmajor (2.4 GB)" "$P" convert "$T/cm-src" --format colmajor --out "$T/cm" --quiet
m "colmajor -> shards" "$P" convert "$T/cm" --out "$T/cm-back" --quiet
mkdir "$T/cm-bare" && ln "$T"/cm/*.bin "$T/cm-bare/"
m "bare colmajor --shape -> shards (u8 found)" "$P" convert "$T/cm-bare" --shape 3x32x32 --out "$T/cm-back-bare" --quiet
m "bare colmajor --shape --dtype f32 -> shards" "$P" convert "$T/cm-bare" --shape 3x32x32 --dtype f32 --out "$T/cm-f32" --quiet
"$P" synth --train 50000 --test 1000 --shape 3x32x32 --format colmajor --out "$T/cm50" --quiet
m "50k colmajor -> shards (for scale)" "$P" convert "$T/cm50" --out "$T/cm50-back" --quiet
m "shards -> colmajor again" "$P" convert "$T/cm-back" --format colmajor --out "$T/cm-again" --quiet
du -sh "$T/cm" "$T/cm-back" "$T/cm-f32"
for f in images_train.bin labels_train.bin images_test.bin labels_test.bin; do
  cmp "$T/cm/$f" "$T/cm-again/$f" && echo "colmajor -> shards -> colmajor: $f byte-identical"
done
