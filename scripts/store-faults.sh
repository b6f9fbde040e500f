#!/usr/bin/env bash
# The fault table of issue 30 (BENCHMARKS.md "Faults in a store"): each case run with the prep
# binary against an S3 server on 127.0.0.1 (benches/s3-server: s3s-fs, signatures checked), one
# line per case with the exit status and the first line of what prep said. CPU only, small data.
#
#   PREP=target/release/prep S3SERVER=.dev/prep-s3-bench-server scripts/store-faults.sh [WORK]
set -uo pipefail
PREP=${PREP:-target/release/prep}
S3SERVER=${S3SERVER:-.dev/prep-s3-bench-server}
WORK=${1:-/tmp/prep-store-faults}
rm -rf "$WORK"; mkdir -p "$WORK/root/bench"
P=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
serve() { "$S3SERVER" --port "$P" --access-key bench --secret-key benchsecret${1:-} "$WORK/root" >>"$WORK/server.log" 2>&1 & SPID=$!; sleep 0.5; }
serve
trap 'kill $SPID 2>/dev/null' EXIT
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=benchsecret AWS_DEFAULT_REGION=us-east-1
export AWS_ENDPOINT_URL=http://127.0.0.1:$P PREP_STORE_RETRY_SECONDS=3 PREP_STAGING=$WORK/staging
SMALL=(--train 3000 --test 500 --shape 1x16x16 --block-samples 64 --shard-blocks 4)
row() { # case | expected | command...: runs it, prints exit status and prep's first error line
  local case=$1 expected=$2; shift 2
  "$@" >"$WORK/out" 2>"$WORK/err"; local rc=$?
  local said; said=$( (grep -m1 -E "^(error|warning|DAMAGED)" "$WORK/err" "$WORK/out" || head -1 "$WORK/out") | sed 's/^[^:]*out://; s/^[^:]*err://' | tr '\n' ' ' | cut -c1-240)
  echo "| $case | $expected | exit $rc: $said |"
}
echo "| case | expected | observed |"
echo "| --- | --- | --- |"
"$PREP" synth "${SMALL[@]}" --out "$WORK/local" --quiet
row "synth to s3://" "exit 0, uploaded, manifest last" "$PREP" synth "${SMALL[@]}" --out s3://bench/ds
row "a URL with a slash missing" "exit 2, says how a URL is written" "$PREP" synth "${SMALL[@]}" --out s3:/bench/x
row "writing over HTTP" "exit 2, HTTP is read-only" "$PREP" synth "${SMALL[@]}" --out http://127.0.0.1:$P/x
row "a signed URL (query) or a user in the URL" "exit 2, refused, nothing shown" "$PREP" verify "s3://bench/ds?X-Amz-Signature=abc123secret"
# (s3s-fs makes a bucket's folder on a first write where S3 answers NoSuchBucket: read instead.)
row "a bucket that does not exist" "exit 2, no dataset there" "$PREP" verify s3://nobucket/ds
row "wrong secret key" "exit 1, access refused, no secret shown" env AWS_SECRET_ACCESS_KEY=wrongsecret123 "$PREP" verify s3://bench/ds
row "the same synth again" "exit 0, nothing to do" "$PREP" synth "${SMALL[@]}" --out s3://bench/ds
row "another dataset into the same URL" "exit 2, says what differs" "$PREP" synth "${SMALL[@]}" --seed 5 --out s3://bench/ds
# An upload that stopped before its manifest: the shards without it.
mkdir -p "$WORK/root/bench/partial"; cp -r "$WORK/root/bench/ds/train" "$WORK/root/bench/partial/"
row "an upload that stopped before its manifest" "exit 2, no dataset there" "$PREP" verify s3://bench/partial
cp -r "$WORK/root/bench/ds" "$WORK/root/bench/missing"; rm "$WORK/root/bench/missing/train/train-00001.shard"
row "a missing shard" "exit 1, names the shard" "$PREP" inspect s3://bench/missing
cp -r "$WORK/root/bench/ds" "$WORK/root/bench/damaged"
python3 - "$WORK/root/bench/damaged/train/train-00000.shard" <<'PY'
import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[300] ^= 0x40; open(p, "wb").write(b)
PY
row "a flipped byte in a stored shard" "exit 1, DAMAGED line naming object and block" "$PREP" verify s3://bench/damaged
row "training on the damaged copy" "exit 1, stops at the block" "$PREP" train s3://bench/damaged --device cpu --epochs 1 --out "$WORK/r-dmg" --quiet
# Two writers: a lease held by a live process of another host.
mkdir -p "$WORK/root/bench/busy"
printf '{"host": "other-host", "pid": 1, "since_unix": %s, "command": "prep synth"}' "$(date +%s)" >"$WORK/root/bench/busy/.prep-lease.json"
row "a second writer while one holds the lease" "exit 1, names the holder and the lease object" "$PREP" synth "${SMALL[@]}" --out s3://bench/busy
# A damaged entry in the local cache is dropped and read again.
"$PREP" train s3://bench/ds --device cpu --epochs 1 --memory stream --cache "$WORK/cache" --out "$WORK/r-c1" --quiet >/dev/null 2>&1
f=$(find "$WORK/cache" -type f -size +1k | head -1); [ -n "$f" ] && printf 'X' | dd of="$f" bs=1 seek=100 conv=notrunc 2>/dev/null
row "a damaged entry in the local cache" "exit 0, entry read from the store again" "$PREP" train s3://bench/ds --device cpu --epochs 1 --memory stream --cache "$WORK/cache" --out "$WORK/r-c2" --quiet
# The server stops during an epoch.
"$PREP" train s3://bench/ds --device cpu --epochs 40 --memory stream --out "$WORK/r-stop" --quiet >"$WORK/out" 2>"$WORK/err" &
TPID=$!
for _ in $(seq 200); do [ -s "$WORK/r-stop/metrics.jsonl" ] && break; sleep 0.1; done
kill $SPID; t0=$(date +%s.%N); wait $TPID; rc=$?; t1=$(date +%s.%N)
echo "| the server stopped during training | exit 1 after the retries, names an object | exit $rc after $(python3 -c "print(f'{$t1-$t0:.1f}')") s: $(grep -m1 error "$WORK/err" | cut -c1-220) |"
serve
row "the server back: --resume" "exit 0" "$PREP" train --resume "$WORK/r-stop" --quiet
# A killed upload resumes, keeping what the store holds: written through a server answering
# after 30 ms, so that the kill comes mid-upload.
kill $SPID; wait $SPID 2>/dev/null; serve " --latency-ms 30"
BIG=(--train 40k --test 1k --shape 1x16x16 --block-samples 64 --shard-blocks 4 --out s3://bench/big)
"$PREP" synth "${BIG[@]}" --quiet >/dev/null 2>"$WORK/err-kill" &
UPID=$!; sleep 2; kill -INT $UPID; wait $UPID; rc=$?
echo "| synth interrupted (SIGINT) during the upload | exit 130, no manifest in the store | exit $rc: $(head -1 "$WORK/err-kill" | cut -c1-220); manifest there: $(test -e "$WORK/root/bench/big/manifest.json" && echo yes || echo no) |"
row "the same synth again" "exit 0, keeps the shards in the store" "$PREP" synth "${BIG[@]}"
sed -i 's/$/ |/' "$WORK/out"; echo "|  |  | then: $(tail -1 "$WORK/out")"
echo
echo "secret shown anywhere: $(grep -rl -e benchsecret -e wrongsecret123 -e abc123secret "$WORK"/out "$WORK"/err "$WORK"/r-* 2>/dev/null | wc -l) files"
