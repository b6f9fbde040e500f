#!/usr/bin/env bash
# Build what scripts/gpu-check.sh runs, on a machine with Rust (the GPU machine has none):
# stripped prep, library-test and input-benchmark executables in .dev/, Fashion-MNIST's IDX
# files beside them, and in .dev/py the Python package's abi3 wheel with pytest's wheels (the GPU
# machine has Python and torch but no internet).
set -euo pipefail
cargo build --release
t=$(cargo test --release --lib --no-run --message-format=json 2>/dev/null |
    python3 -c "import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get('reason')=='compiler-artifact' and m['target']['kind']==['lib'] and m['profile']['test']:
        print(m['executable'])")
b=$(cargo bench --bench input --no-run --message-format=json 2>/dev/null |
    python3 -c "import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get('reason')=='compiler-artifact' and m['target']['name']=='input' and m.get('executable'):
        print(m['executable'])")
mkdir -p .dev/fm
strip -o .dev/prep target/release/prep
strip -o .dev/prep-lib-tests "$t"
strip -o .dev/prep-bench-input "$b"
cp -u /usr/share/datasets/fashion-mnist/*.gz .dev/fm/ 2>/dev/null || echo "note: Fashion-MNIST not installed here (apt-get install dataset-fashion-mnist)"
# The nnU-Net-style scans of stage `tasks` (nibabel writes them; the GPU machine may lack it).
if python3 -c "import nibabel" 2>/dev/null; then
    rm -rf .dev/msd48 /tmp/prep-msd48
    python3 scripts/make-msd.py /tmp/prep-msd48 --cases 48 --nnunet >/dev/null
    ./target/release/prep convert /tmp/prep-msd48 --out .dev/msd48 --quiet
else
    echo "note: no nibabel here: stage tasks of scripts/gpu-check.sh skips the scan dataset"
fi
rm -rf .dev/py && mkdir -p .dev/py
if python3 -m maturin --version >/dev/null 2>&1 || python3 -m pip install --quiet maturin; then
    (cd python && CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/../target} python3 -m maturin build --release --quiet --out ../.dev/py 2>&1 | tail -2)
    python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 -d .dev/py pytest
else
    echo "note: no maturin here: stage python of scripts/gpu-check.sh will fail"
fi
du -sh .dev
