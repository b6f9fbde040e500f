#!/usr/bin/env bash
# prep against MosaicML Streaming, WebDataset and litdata on real photos (benches/peers.py), on a
# machine with Python 3.12, PyTorch and numpy but no internet. Run from the repository root with
# these carried (git-ignored) paths:
#
#   .dev/prep                                  the prep binary (cargo build --release)
#   .dev/py/prep-0.1.0-cp39-abi3-*.whl         prep's Python package, built from the same source
#   .dev/peers/                                the peers' wheels and their missing dependencies
#   .dev/photo-src/                            the 45 source photographs, downscaled
#
# It installs the wheels into /tmp/peers-site (pip --no-deps --no-index), makes 20,000 photos
# into /tmp/photos (kept if there already), runs benches/peers.py --size 128 (the environment's
# SIZE, COUNT, WORKERS, BATCH, ROUNDS, ONLY, EXTRA override) and writes logs and peers.json into $OUT; the markdown
# table comes last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/peers-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=/tmp/peers-site
WHEELS=${WHEELS:-.dev/peers}   # another folder of wheels: for a test elsewhere (another Python)
PHOTOS=${PHOTOS:-/tmp/photos}
COUNT=${COUNT:-20000}
SIZE=${SIZE:-128}
JOBS=$(nproc)
start=$(date +%s)

echo "== host: $(nproc) cores, $($PY --version 2>&1), $(uname -r)"
$PY -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__)" \
  || echo "!! PyTorch is not importable: the DataLoader parts will fail"

echo "== installing wheels into $SITE"
rm -rf "$SITE"
if ! $PY -m pip --version >/dev/null 2>&1; then
  echo "!! no pip: unzipping the wheels instead"
  mkdir -p "$SITE"
  for w in "$WHEELS"/*.whl .dev/py/prep-*.whl; do
    $PY -m zipfile -e "$w" "$SITE" || echo "!! failed: $w"
  done
elif ! $PY -m pip install --no-deps --no-index --no-compile --quiet --disable-pip-version-check \
      --target "$SITE" "$WHEELS"/*.whl .dev/py/prep-*.whl >"$OUT/pip.log" 2>&1; then
  echo "!! pip install failed (see pip.log); installing the wheels one by one"
  for w in "$WHEELS"/*.whl .dev/py/prep-*.whl; do
    $PY -m pip install --no-deps --no-index --no-compile --quiet --disable-pip-version-check \
      --target "$SITE" "$w" >>"$OUT/pip.log" 2>&1 || echo "!! failed: $w"
  done
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import prep; print('prep package', prep.__file__)" || echo "!! prep's Python package does not import"

have=0
[ -d "$PHOTOS" ] && have=$(find "$PHOTOS" -name '*.jpg' | wc -l)
if [ "$have" -ne "$COUNT" ]; then
  echo "== making $COUNT photos in $PHOTOS ($JOBS jobs)"
  rm -rf "$PHOTOS"
  t0=$(date +%s%N)
  $PY scripts/make-photos.py "$PHOTOS" --sources .dev/photo-src --count "$COUNT" --jobs "$JOBS" \
    2>&1 | tee "$OUT/make-photos.log"
  echo "make-photos: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
else
  echo "== $PHOTOS has $have photos: kept"
fi

echo "== benches/peers.py --size $SIZE"
extra=()
[ -n "${ONLY:-}" ] && extra+=(--only "$ONLY")
[ -n "${ROUNDS:-}" ] && extra+=(--rounds "$ROUNDS")
[ "$COUNT" != 20000 ] && extra+=(--count "$COUNT")
# EXTRA: more arguments for peers.py (e.g. --no-torch for a test without PyTorch)
read -r -a more <<<"${EXTRA:-}"
extra+=("${more[@]}")
$PY benches/peers.py --photos "$PHOTOS" --prep .dev/prep --work /tmp/peers-work \
  --size "$SIZE" --workers "${WORKERS:-8}" --batch "${BATCH:-256}" --out "$OUT/peers.json" \
  "${extra[@]}" >"$OUT/peers.out" 2>"$OUT/peers.err"
rc=$?
echo "peers.py exit code $rc; $(( $(date +%s) - start )) s in all"
grep -v '^|' "$OUT/peers.out" | cut -c1-400
echo "-- last lines of peers.err:"
tail -n 15 "$OUT/peers.err" | cut -c1-300
echo
$PY - "$OUT/peers.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no results:", e)
    raise SystemExit(0)
print(json.dumps(d["meta"]))
print()
print(d["table"])
EOF
