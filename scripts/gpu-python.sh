#!/usr/bin/env bash
# Issue 13 on the GPU machine (Python 3.12 + PyTorch there, no internet, no Rust): the prep.torch
# tests and benches/torch_loader.py on a 1M-sample 3x32x32 dataset, in one call.
#
# Build the inputs here (a machine with Rust), into an ignored folder that the call carries:
#   (cd python && maturin build --release --out ../.dev/py13)          # the abi3 wheel
#   pip download --only-binary=:all: --python-version 3.12 -d .dev/py13 pytest
#   strip -o .dev/py13/prep target/release/prep                        # under the carry limit
# then run `WHEELS=.dev/py13 bash scripts/gpu-python.sh` there with carry [".dev/py13"].
set -uo pipefail
WHEELS=${WHEELS:-.dev/py13}
OUT=${OUT:-/tmp/gpu-python}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/prep-python}; mkdir -p "$WORK"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, torch, numpy; print(sys.version.split()[0], torch.__version__, numpy.__version__, torch.cuda.is_available())"
# Wheels are zip files: unpacked onto PYTHONPATH, no pip or venv needed; this checkout's Python
# sources go over the wheel's.
rm -rf "$WORK/pylib" && mkdir -p "$WORK/pylib"
for w in "$WHEELS"/*.whl; do python3 -m zipfile -e "$w" "$WORK/pylib"; done
cp python/python/prep/*.py "$WORK/pylib/prep/"
export PYTHONPATH=$WORK/pylib PREP_BIN=${PREP_BIN:-$PWD/$WHEELS/prep}
chmod +x "$PREP_BIN"
python3 -c "import prep, prep.torch; print('prep', prep.__version__, prep.__file__)"
echo "== pytest python/tests (test_torch.py included)"
timeout 300 python3 -m pytest python/tests -q -rs -p no:cacheprovider 2>&1 | tail -25
echo "== benches/torch_loader.py, 1M 3x32x32"
[ -f "$WORK/ds1m/manifest.json" ] || "$PREP_BIN" synth --train 1000000 --test 10000 --out "$WORK/ds1m" --quiet
timeout 400 python3 benches/torch_loader.py "$WORK/ds1m" --workers "${WORKERS:-8}" --batch 512 \
    --memmap-steps 300 2>&1 | tee "$OUT/torch_loader.log"
