#!/usr/bin/env bash
# The CPU commands of BENCHMARKS.md through two prep binaries, alternated round by round so that
# both see the same machine: synth 1M, verify it (warm cache), convert Fashion-MNIST to shards and
# to colmajor, convert an image folder. Prints each run's wall time and peak RSS, then the median
# per command and binary and their ratio (new / old).
#
#   scripts/bench-ab.sh OLD NEW [ROUNDS] [WORK] [IMAGES]   (IMAGES: a folder of class folders)
set -euo pipefail
old=$1 new=$2 rounds=${3:-3} work=${4:-$(mktemp -d)} images=${5:-}
fm=${FM:-/usr/share/datasets/fashion-mnist}
mkdir -p "$work"
log=$work/times.tsv; : > "$log"
t() {  # t NAME BIN ARGS...: one timed run, appended to the log
  local name=$1 which=$2; shift 2
  /usr/bin/time -f "%e %M" -o "$work/t" "$@" >/dev/null 2>&1
  read -r secs kb < "$work/t"
  printf '%s\t%s\t%s\t%s\n' "$name" "$which" "$secs" "$kb" | tee -a "$log"
}
for r in $(seq "$rounds"); do
  for which in old new; do
    bin=${!which}
    d=$work/$which; rm -rf "$d"; mkdir -p "$d"
    t synth-1M "$which" "$bin" synth --train 1000000 --test 10000 --out "$d/synth" --quiet
    t verify-1M "$which" "$bin" verify "$d/synth" --quiet
    if [ -d "$fm" ]; then
      t convert-fm "$which" "$bin" convert "$fm" --out "$d/fm" --quiet
      t convert-fm-colmajor "$which" "$bin" convert "$fm" --out "$d/fmc" --format colmajor --quiet
    fi
    if [ -n "$images" ]; then
      t convert-images "$which" "$bin" convert "$images" --out "$d/imgs" --size 32 --quiet
    fi
    rm -rf "$d"
  done
done
python3 - "$log" <<'PY'
import sys, statistics, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, which, secs, kb = line.split()
    runs[(name, which)].append((float(secs), int(kb)))
print("| command | old median s | new median s | new/old | old peak RSS MiB | new peak RSS MiB |")
print("| --- | --- | --- | --- | --- | --- |")
for name in dict.fromkeys(n for n, _ in runs):
    o = runs[(name, "old")]; n = runs[(name, "new")]
    mo = statistics.median(s for s, _ in o); mn = statistics.median(s for s, _ in n)
    print(f"| {name} | {mo:.2f} | {mn:.2f} | {mn / mo:.3f} | {max(k for _, k in o) / 1024:.1f} | {max(k for _, k in n) / 1024:.1f} |")
PY
