#!/usr/bin/env bash
# Training from an S3 store with latency against the same data on local disk (issue 30,
# BENCHMARKS.md "Datasets in a store"). Needs prep and benches/s3-server (s3s-fs with one
# positioned read per GET and a per-response delay; s3s-fs itself tops near 550 MB/s, see
# scripts/store-ceiling.sh):
#
#   (cd benches/s3-server && cargo build --release) && cp benches/s3-server/target/release/prep-s3-bench-server .dev/
#   S3SERVER=.dev/prep-s3-bench-server PREP=.dev/prep scripts/bench-store.sh [WORK]
#
# For each dataset (1M 3x32x32; 60k 3x128x128): `prep train --memory stream` from the local copy,
# then from s3:// with no delay and with LATENCY_MS (20) before every response, without and with
# --cache; samples/s of the first epoch and the median of the later ones, and each epoch's requests
# and bytes (metrics.jsonl's `store`). PY=python3 (prep importable) adds the Python reader
# (benches/py_store.py) from local disk and from s3:// with the delay.
set -uo pipefail
PREP=${PREP:-.dev/prep}
S3SERVER=${S3SERVER:-.dev/prep-s3-bench-server}
WORK=${1:-/tmp/prep-bench-store}
LATENCY_MS=${LATENCY_MS:-20}
EPOCHS=${EPOCHS:-4}
DEVICE=${DEVICE:-cuda}
rm -rf "$WORK"; mkdir -p "$WORK/s3root/bench"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P=$(port); Q=$(port)
# Two servers over one folder: P answers at once, Q after LATENCY_MS.
"$S3SERVER" --port "$P" --access-key bench --secret-key benchsecret "$WORK/s3root" >"$WORK/s3-direct.log" 2>&1 &
S3PID=$!
"$S3SERVER" --port "$Q" --latency-ms "$LATENCY_MS" --access-key bench --secret-key benchsecret "$WORK/s3root" >"$WORK/s3-slow.log" 2>&1 &
SLOWPID=$!
trap 'kill $S3PID $SLOWPID 2>/dev/null' EXIT
sleep 1
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=benchsecret AWS_DEFAULT_REGION=us-east-1
direct="AWS_ENDPOINT_URL=http://127.0.0.1:$P"
slow="AWS_ENDPOINT_URL=http://127.0.0.1:$Q"
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(nproc) cores; latency added: $LATENCY_MS ms"

summary() { # run folder -> "first-epoch samples/s | median later | requests/bytes per epoch"
  python3 - "$1" <<'PY'
import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
sps = [e["samples_per_sec"] for e in m]
st = [e.get("store") or {} for e in m]
traffic = "; ".join(f"{s.get('requests', 0)} req {s.get('bytes', 0) / 2**20:.0f} MiB {s.get('cache_hits', 0)} hits" for s in st)
print(f"{sps[0]:.0f} | {statistics.median(sps[1:]) if len(sps) > 1 else float('nan'):.0f} | {traffic}")
PY
}

bench() { # name, synth args...
  local name=$1; shift
  "$PREP" synth "$@" --out "$WORK/$name" --quiet || return
  env $direct "$PREP" synth "$@" --out "s3://bench/$name" --quiet || return
  echo "-- $name: $(du -sh "$WORK/$name" | cut -f1) stored"
  local args=(--device "$DEVICE" --memory stream --epochs "$EPOCHS" --quiet)
  "$PREP" train "$WORK/$name" "${args[@]}" --out "$WORK/run-$name-local" && \
    echo "row: $name local | $(summary "$WORK/run-$name-local")"
  env $direct "$PREP" train "s3://bench/$name" "${args[@]}" --out "$WORK/run-$name-s3d" && \
    echo "row: $name s3 direct | $(summary "$WORK/run-$name-s3d")"
  env $slow "$PREP" train "s3://bench/$name" "${args[@]}" --out "$WORK/run-$name-s3" && \
    echo "row: $name s3 +${LATENCY_MS}ms | $(summary "$WORK/run-$name-s3")"
  env $slow "$PREP" train "s3://bench/$name" "${args[@]}" --out "$WORK/run-$name-s3c" \
    --cache "$WORK/cache-$name" --cache-bytes 100G && \
    echo "row: $name s3 +${LATENCY_MS}ms, cache | $(summary "$WORK/run-$name-s3c")"
  rm -rf "$WORK/cache-$name"
  if [ -n "${PY:-}" ]; then
    env $slow "$PY" "$(dirname "$0")/../benches/py_store.py" "$WORK/$name" "s3://bench/$name" --epochs 2 | sed "s/^/py: $name /"
  fi
}

bench s1m --train 1M --test 10k
bench s128 --train 60k --test 2k --shape 3x128x128
