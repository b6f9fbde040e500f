#!/usr/bin/env bash
# Bad input with fields (issue 27, acceptance 4): each case built from scratch, converted with
# --on-error fail, and the first line prep prints, its exit code and whether an output was left.
#   scripts/bad-fields.sh [PREP] [WORK]
set -uo pipefail
prep=$(realpath "${1:-target/release/prep}") work=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work" && cd "$work"
python3 - <<'PY'
import json, os, struct, zlib
import numpy as np

def png(path, a, palette=None):
    a = np.asarray(a)
    h, w = a.shape[:2]
    ch = 1 if a.ndim == 2 else a.shape[2]
    ctype = 3 if palette is not None else {1: 0, 3: 2}[ch]
    raw = b"".join(b"\0" + a[y].astype(np.uint8).tobytes() for y in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, ctype, 0, 0, 0))
    if palette is not None:
        out += chunk(b"PLTE", bytes(palette))
    out += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(out)

img = (np.arange(24 * 32) % 200).reshape(24, 32)
mask = (np.arange(24 * 32) % 3).reshape(24, 32)
def tree(d, masks=True):
    for n in "abc":
        png(f"{d}/images/{n}.png", img)
        if masks:
            png(f"{d}/masks/{n}.png", mask)

tree("size"); png("size/masks/b.png", mask[:20])
tree("nomask"); os.remove("nomask/masks/c.png")
tree("orphan"); png("orphan/masks/zz.png", mask)
tree("names")
tree("colour"); png("colour/masks/a.png", np.stack([mask * 80, mask, mask], -1))
tree("csv", masks=False)
open("csv/ok.csv", "w").write("path,label,cat,dog,age\nimages/a.png,x,1,0,3.5\nimages/b.png,y,0,1,NaN\nimages/c.png,x,1,1,2\n")
open("csv/twos.csv", "w").write("path,label,cat,dog,age\nimages/a.png,x,1,0,3.5\nimages/b.png,y,2,1,1\nimages/c.png,x,1,1,2\n")
open("csv/short.csv", "w").write("path,label,cat\nimages/a.png,x,1\nimages/b.png,y\nimages/c.png,x,0\n")
os.makedirs("npy", exist_ok=True)
np.save("npy/x_train.npy", np.zeros((4, 8, 8), np.uint8))
np.save("npy/y_train.npy", np.zeros((4, 8, 6), np.uint8))
os.makedirs("npyinf", exist_ok=True)
np.save("npyinf/x_train.npy", np.zeros((4, 8, 8), np.uint8))
np.save("npyinf/y_train.npy", np.array([[1.0, 2.0], [np.inf, 0], [0, 0], [1, 1]], np.float32))
os.makedirs("npymeta", exist_ok=True)
np.save("npymeta/x_train.npy", np.zeros((4, 8, 8), np.uint8))
np.save("npymeta/y_train.npy", np.arange(4, dtype=np.uint8))
open("npymeta/meta_train.jsonl", "w").write('{"id": 1}\n{"id": 2}\n{"id": [3]}\n{"id": 4}\n')
PY
python3 "$here/scripts/make-msd.py" msd-missing --cases 3 >/dev/null; rm msd-missing/imagesTr/brain_001.nii.gz
python3 "$here/scripts/make-msd.py" msd-labels --cases 3 >/dev/null
python3 - <<'PY'
import json
d = json.load(open("msd-labels/dataset.json")); d["labels"] = {"0": "background", "1": "core"}
json.dump(d, open("msd-labels/dataset.json", "w"))
PY
python3 "$here/scripts/make-msd.py" msd-channels --cases 3 >/dev/null
python3 - <<'PY'
import json
d = json.load(open("msd-channels/dataset.json")); d["modality"] = {"0": "FLAIR", "1": "T1", "2": "T2"}
json.dump(d, open("msd-channels/dataset.json", "w"))
PY
python3 "$here/scripts/make-msd.py" msd-regions --nnunet --cases 3 >/dev/null
python3 - <<'PY'
import json
d = json.load(open("msd-regions/dataset.json")); d["labels"]["whole"] = [1, 2]
json.dump(d, open("msd-regions/dataset.json", "w"))
PY
echo '| case | command | exit | first line of stderr | output left |'
echo '| --- | --- | --- | --- | --- |'
case_() {
  local name=$1; shift
  rm -rf "out-$name"
  err=$("$prep" convert "$@" --out "out-$name" --on-error fail --quiet 2>&1 >/dev/null); rc=$?
  left=$([ -e "out-$name" ] && echo yes || echo no)
  echo "| $name | \`prep convert $* --on-error fail\` | $rc | $(echo "$err" | head -1 | sed 's/|/\\|/g' | cut -c1-260) | $left |"
}
case_ mask-size size
case_ image-without-mask nomask
case_ mask-without-image orphan
case_ value-beyond-names names --mask-names background,one
case_ colour-mask colour
case_ nan-in-values csv --labels csv/ok.csv --values age
case_ csv-missing-column csv --labels csv/ok.csv --values weight
case_ csv-short-row csv --labels csv/short.csv
case_ csv-not-0-1 csv --labels csv/twos.csv --values age
case_ npy-mask-size npy
case_ npy-inf-value npyinf
case_ npy-meta-nested npymeta
case_ npy-meta-flag npymeta --meta
case_ msd-image-missing msd-missing
case_ msd-label-beyond-names msd-labels
case_ msd-channels-differ msd-channels
case_ msd-region-labels msd-regions
