#!/usr/bin/env bash
# Where reading from a store stops (issue 30): one dataset streamed by `prep train --memory
# stream` from local disk, from an S3 server (s3s-fs) and from nginx over HTTP (sendfile, Range),
# no latency added, and nginx again with LATENCY_MS (20) added by scripts/latency-proxy.py. If nginx feeds prep far faster than s3s-fs does, the S3
# figures of scripts/bench-store.sh are the server's ceiling, not prep's client's.
#
#   PREP=.dev/prep S3S=.dev/s3s-fs NGINX=.dev/nginx/nginx scripts/store-ceiling.sh [WORK]
#
# NGINX may sit beside a lib/ folder of its shared libraries (carried to a host without nginx).
# PY=python3 adds the Python reader's rows (benches/py_store.py); TRAIN=0 leaves training out.
set -uo pipefail
PREP=${PREP:-.dev/prep}
S3S=${S3S:-.dev/s3s-fs}
NGINX=${NGINX:-.dev/nginx/nginx}
WORK=${1:-/tmp/prep-store-ceiling}
N=${N:-500k}
EPOCHS=${EPOCHS:-3}
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-3x32x32}
rm -rf "$WORK"; mkdir -p "$WORK/s3root/bench" "$WORK/www" "$WORK/nginx/nginx-tmp"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P=$(port); H=$(port)
"$S3S" --host 127.0.0.1 --port "$P" --access-key bench --secret-key benchsecret "$WORK/s3root" >"$WORK/s3s.log" 2>&1 &
S3PID=$!
sed -e "s|{DIR}|$WORK/nginx|g" -e "s|{ROOT}|$WORK/www|g" -e "s|{PORT}|$H|g" \
    -e "s|worker_processes 1;|worker_processes 8;|" "$(dirname "$0")/../fixtures/servers/nginx.conf" >"$WORK/nginx/nginx.conf"
LD_LIBRARY_PATH="$(dirname "$NGINX")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$NGINX" -p "$WORK/nginx/" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" &
NGPID=$!
# nginx again behind scripts/latency-proxy.py adding LATENCY_MS to every request.
L=$(port)
python3 "$(dirname "$0")/latency-proxy.py" "$L" "$H" "${LATENCY_MS:-20}" >"$WORK/proxy.log" 2>&1 &
PXPID=$!
trap 'kill $S3PID $NGPID $PXPID 2>/dev/null' EXIT
sleep 1
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=benchsecret AWS_DEFAULT_REGION=us-east-1
export AWS_ENDPOINT_URL=http://127.0.0.1:$P
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(nproc) cores; $N x $SHAPE"
"$PREP" synth --train "$N" --test 10k --shape "$SHAPE" --out "$WORK/www/ds" --quiet || exit 1
"$PREP" synth --train "$N" --test 10k --shape "$SHAPE" --out s3://bench/ds --quiet || exit 1
echo "stored: $(du -sh "$WORK/www/ds" | cut -f1)"
summary() { # run folder -> samples/s of each epoch, and MB/s read from the store
  python3 - "$1" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
print(" ".join(f"{e['samples_per_sec']:.0f}" for e in m), "samples/s |",
      " ".join(f"{(e.get('store') or {}).get('bytes', 0) / e['seconds'] / 1e6:.0f}" for e in m), "MB/s from the store")
PY
}
SOURCES=("local $WORK/www/ds" "s3 s3://bench/ds" "http http://127.0.0.1:$H/ds" "http+${LATENCY_MS:-20}ms http://127.0.0.1:$L/ds")
# PY=python3 (with the prep package importable) reads the same sources through the Python
# reader (benches/py_store.py); TRAIN=0 leaves prep train out.
if [ -n "${PY:-}" ]; then
    urls=(); for src in "${SOURCES[@]}"; do set -- $src; urls+=("$2"); done
    "$PY" "$(dirname "$0")/../benches/py_store.py" "${urls[@]}" --epochs "$EPOCHS" | sed 's/^/py: /'
fi
[ "${TRAIN:-1}" = 0 ] && exit 0
for src in "${SOURCES[@]}"; do
    set -- $src
    "$PREP" train "$2" --device "$DEVICE" --memory stream --epochs "$EPOCHS" --quiet --out "$WORK/run-$1" \
        >"$WORK/train-$1.log" 2>&1 && echo "row: $1 | $(summary "$WORK/run-$1")" || { echo "row: $1 | failed"; tail -3 "$WORK/train-$1.log"; }
done
