#!/bin/sh
# Run one decoder target for SECONDS from a copy of its binary (so that a rebuild meanwhile does
# not change what runs), under nice, with its own log folder. From fuzz/:
#   scripts/run_decoder_target.sh TARGET SECONDS MAX_LEN [extra libFuzzer flags]
set -eu
t=$1; secs=$2; maxlen=$3; shift 3
fuzz=$(pwd)
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- ../src . || echo "-dirty")
stamp=$(date -u +%Y%m%dT%H%M%S)
run=$fuzz/runs/$t-$commit-$stamp
mkdir -p "$run" corpus/$t artifacts/$t
cp target/x86_64-unknown-linux-gnu/release/$t "$run/$t"
echo "target=$t commit=$commit start=$(date -u +%H:%M:%S) secs=$secs max_len=$maxlen extra=$*" > "$run/info"
cd "$run"
nice -n 19 ./$t "$fuzz/corpus/$t" "$fuzz/seeds/$t" -max_total_time=$secs -jobs=1 \
  -print_final_stats=1 -max_len=$maxlen -rss_limit_mb=2048 -timeout=60 \
  -artifact_prefix="$fuzz/artifacts/$t/" "$@" > run.out 2>&1 || true
echo "end=$(date -u +%H:%M:%S)" >> info
