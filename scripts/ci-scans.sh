#!/usr/bin/env bash
# CI tier: real DICOM and NIfTI files through `prep convert`.
#
#   bash scripts/ci-scans.sh target/release/prep
#
# The files are the test data that ship inside pydicom (CT_small.dcm, MR_small.dcm) and nibabel
# (example4d.nii.gz, anatomical.nii), installed here from PyPI. Expected shapes, counts and pixel
# means are computed from those files by pydicom/nibabel/numpy, not hard-coded: the means check
# prep's rescale and windowing against an independent implementation of the same rules (DICOM:
# Rescale Slope/Intercept, then the file's first Window Center/Width, else the frame's min..max,
# MONOCHROME1 inverted; NIfTI: scl_slope/scl_inter, then the 0.5-99.5 percentile window of each
# 3-D volume). Then truncated copies must be rejects (listed in rejects.jsonl with a reason) under
# the default --on-error skip, and stop the run with exit 1 under --on-error fail.
#
# Ends with "scans: N passed, M failed"; exits non-zero on any failure.
set -uo pipefail

prep=${1:?usage: bash scripts/ci-scans.sh PATH/TO/prep}
prep=$(cd "$(dirname "$prep")" && pwd)/$(basename "$prep")
[ -x "$prep" ] || { echo "ci-scans: $prep is not an executable"; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
expect() { # NAME ACTUAL EXPECTED
  if [ "$2" == "$3" ]; then ok "$1 ($2)"; else bad "$1: got '$2', expected '$3'"; fi
}

# --- Python with pydicom, nibabel (and numpy) --------------------------------------------------
py=python3
if ! $py -c 'import pydicom, nibabel, numpy' 2>/dev/null; then
  echo "== installing pydicom and nibabel from PyPI"
  $py -m pip install --quiet pydicom nibabel \
    || $py -m pip install --quiet --user --break-system-packages pydicom nibabel \
    || { python3 -m venv "$tmp/venv" && py="$tmp/venv/bin/python" && $py -m pip install --quiet pydicom nibabel; } \
    || { echo "ci-scans: cannot install pydicom and nibabel"; echo "scans: 0 passed, 1 failed"; exit 1; }
fi

cat > "$tmp/h.py" <<'EOF'
import json, os, shutil, sys
import numpy as np

def window_u16(v, low, high):
    if not high > low:
        return np.where(v >= high, 65535.0, 0.0)
    t = np.clip((v - low) / (high - low), 0.0, 1.0)
    return np.round(t * 65535.0)

def first(x):
    try:
        return float(x[0])
    except TypeError:
        return float(x)

def dicom(path):
    """rows cols frames mean: prep's rule for a grey DICOM with --dtype u16 (every modality
    value kept, no window, stored + 32768), computed with pydicom and numpy."""
    import pydicom
    ds = pydicom.dcmread(path)
    a = ds.pixel_array.astype(np.float64)
    frames = int(getattr(ds, "NumberOfFrames", 1) or 1)
    a = a.reshape(frames, int(ds.Rows), int(ds.Columns))
    v = a * float(getattr(ds, "RescaleSlope", 1) or 1) + float(getattr(ds, "RescaleIntercept", 0) or 0)
    u = np.clip(np.round(v) + 32768.0, 0.0, 65535.0)
    print(ds.Rows, ds.Columns, frames, float(np.mean(u)) / 65535.0)

def nifti(path, axis):
    """slices height width mean: prep's rule for a NIfTI file with --dtype u16 (values + 32768),
    its slices counted in the closest canonical orientation (nibabel's), computed with nibabel
    and numpy. A 4-D file whose header gives a time step is a time series."""
    import nibabel as nib
    img = nib.as_closest_canonical(nib.load(path))
    shape = img.shape + (1,) * (3 - len(img.shape)) if len(img.shape) < 3 else img.shape
    x, y, z = shape[:3]
    vols = int(np.prod(shape[3:])) if len(shape) > 3 else 1
    data = np.asarray(img.dataobj, dtype=np.float64)
    u = np.clip(np.round(data) + 32768.0, 0.0, 65535.0)
    count, h, w = {0: (x, z, y), 1: (y, z, x), 2: (z, y, x)}[axis]
    print(count * vols, h, w, float(u.mean()) / 65535.0)

def summary(path):
    """total per-class-counts shape dtype mean, from `prep inspect --json`."""
    v = json.load(open(path))
    total, per, msum = 0, [0] * len(v["classes"]), 0.0
    for s in v["splits"]:
        total += s["samples"]
        msum += s["samples"] * (s["mean"][0] if s["mean"] else 0.0)
        for k, c in enumerate(s["class_counts"]):
            per[k] += c
    shape = "x".join(str(d) for d in v["shape"])
    print(total, ",".join(map(str, per)), shape, v["dtype"], msum / max(total, 1))

def rejects(path, *names):
    """For each name: the reason prep gave for it in rejects.jsonl, or MISSING."""
    rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    for name in names:
        r = [x for x in rows if x.get("path") == name]
        print(name, "->", r[0]["reason"] if r and r[0].get("reason") else "MISSING")

def close(a, b, tol):
    sys.exit(0 if abs(float(a) - float(b)) <= float(tol) else 1)

def testdata(dest):
    """Copy the four files out of the installed packages."""
    import pydicom.data, nibabel
    # nibabel.testing.data_path is this folder; importing nibabel.testing needs pytest.
    nib_data = os.path.join(os.path.dirname(nibabel.__file__), "tests", "data")
    os.makedirs(dest, exist_ok=True)
    for name in ("CT_small.dcm", "MR_small.dcm"):
        shutil.copy(pydicom.data.get_testdata_file(name), os.path.join(dest, name))
    for name in ("example4d.nii.gz", "anatomical.nii"):
        shutil.copy(os.path.join(nib_data, name), os.path.join(dest, name))

def series(dest, n):
    """Write CT_small.dcm as an n-slice series in shuffled file and instance order (slice k's
    pixels raised by 10*k, positions 2.5 mm apart along the slice normal); print the slices'
    rescaled means in position order, as pydicom computes them."""
    import pydicom, pydicom.data
    import random
    n = int(n)
    src = pydicom.dcmread(pydicom.data.get_testdata_file("CT_small.dcm"))
    o = [float(v) for v in src.ImageOrientationPatient]
    normal = np.cross(o[:3], o[3:])
    p0 = np.array([float(v) for v in src.ImagePositionPatient])
    uid = pydicom.uid.generate_uid()
    order = list(range(n)); random.Random(7).shuffle(order)
    means = []
    os.makedirs(dest, exist_ok=True)
    for k in range(n):
        ds = pydicom.dcmread(pydicom.data.get_testdata_file("CT_small.dcm"))
        px = ds.pixel_array.astype(np.int32) + 10 * k
        ds.PixelData = px.astype(ds.pixel_array.dtype).tobytes()
        ds.SeriesInstanceUID = uid
        ds.SOPInstanceUID = pydicom.uid.generate_uid()
        ds.ImagePositionPatient = [f"{v:.4f}" for v in p0 + 2.5 * k * normal]
        ds.InstanceNumber = n - k  # reversed: the positions must decide the order
        ds.save_as(os.path.join(dest, f"slice_{order[k]:03d}.dcm"))
        r = px * float(getattr(ds, "RescaleSlope", 1)) + float(getattr(ds, "RescaleIntercept", 0))
        means.append(float(r.astype(np.float32).mean()))
    print(" ".join(f"{m:.4f}" for m in means))

def colmajor_means(d, c, h, w):
    """Per-sample means of a colmajor dataset, train then test, in file order."""
    f = int(c) * int(h) * int(w)
    out = []
    for split in ("train", "test"):
        p = os.path.join(d, f"images_{split}.bin")
        if os.path.exists(p) and os.path.getsize(p) > 0:
            x = np.fromfile(p, dtype="<f4").reshape((-1, f), order="F")
            out += [float(r.mean(dtype=np.float64)) for r in x]
    print(" ".join(f"{m:.4f}" for m in out))

def same_means(a, b, tol):
    a, b = [float(v) for v in a.split()], [float(v) for v in b.split()]
    sys.exit(0 if len(a) == len(b) and all(abs(x - y) <= float(tol) for x, y in zip(a, b)) else 1)

cmd, args = sys.argv[1], sys.argv[2:]
{"dicom": dicom, "nifti": lambda p, a: nifti(p, int(a)), "summary": summary, "rejects": rejects,
 "close": close, "testdata": testdata, "series": series, "colmajor_means": colmajor_means,
 "same_means": same_means}[cmd](*args)
EOF
h() { $py "$tmp/h.py" "$@"; }

src="$tmp/src"
if ! h testdata "$src"; then
  echo "ci-scans: the test files are not in the installed pydicom/nibabel"
  echo "scans: $pass passed, $((fail + 1)) failed"
  exit 1
fi

# convert NAME INPUT OUT EXPECTED_EXIT ARGS...: run prep convert, check its exit code.
convert() {
  local name=$1 input=$2 out=$3 code=$4
  shift 4
  "$prep" convert "$input" --out "$out" --quiet "$@" > "$out.log" 2>&1
  local rc=$?
  if [ "$rc" == "$code" ]; then
    ok "$name: exit $rc"
    return 0
  fi
  bad "$name: exit $rc, expected $code"
  sed 's/^/    /' "$out.log" | tail -20
  return 1
}
# summary OUT: "total per-class shape dtype mean" of a dataset.
summary() { "$prep" inspect "$1" --json > "$1.json" 2> "$1.inspect.log" && h summary "$1.json"; }

# --- DICOM: each file on its own, at its native size, 16-bit ------------------------------------
echo "== DICOM"
for f in CT_small MR_small; do
  cls=$(echo "$f" | cut -d_ -f1 | tr A-Z a-z)
  mkdir -p "$tmp/d1_$f/$cls"
  cp "$src/$f.dcm" "$tmp/d1_$f/$cls/"
  read -r rows cols frames mean < <(h dicom "$src/$f.dcm")
  if convert "$f" "$tmp/d1_$f" "$tmp/o1_$f" 0 --kind dicom --dtype u16; then
    read -r total per shape dtype got < <(summary "$tmp/o1_$f")
    expect "$f: samples" "$total" "$frames"
    expect "$f: shape (native)" "$shape" "1x${rows}x${cols}"
    expect "$f: dtype" "$dtype" "u16"
    if h close "$got" "$mean" 0.002; then ok "$f: mean $got (pydicom: $mean)"; else bad "$f: mean $got, pydicom says $mean"; fi
  fi
done

# Both classes in one tree, one size.
mkdir -p "$tmp/d2/ct" "$tmp/d2/mr"
cp "$src/CT_small.dcm" "$tmp/d2/ct/"
cp "$src/MR_small.dcm" "$tmp/d2/mr/"
read -r _ _ ct_frames _ < <(h dicom "$src/CT_small.dcm")
read -r _ _ mr_frames _ < <(h dicom "$src/MR_small.dcm")
# CT and MR together are refused (their units differ) unless asked for.
if convert "dicom tree, mixed modalities" "$tmp/d2" "$tmp/o2x" 2 --kind dicom --size 64x64; then
  if grep -q "modalities" "$tmp/o2x.log"; then ok "dicom tree: CT beside MR refused by name"; else bad "dicom tree: the refusal does not name the modalities"; fi
fi
if convert "dicom tree" "$tmp/d2" "$tmp/o2" 0 --kind dicom --size 64x64 --mixed-modalities; then
  read -r total per shape dtype _ < <(summary "$tmp/o2")
  expect "dicom tree: samples per class (ct,mr)" "$per" "$ct_frames,$mr_frames"
  expect "dicom tree: shape" "$shape" "1x64x64"
  expect "dicom tree: dtype" "$dtype" "u8"
fi

# --- NIfTI: each file on its own, native slice size; axis 2 and axis 0 ---------------------------
echo "== NIfTI"
for f in anatomical.nii example4d.nii.gz; do
  mkdir -p "$tmp/n1_$f/vol"
  cp "$src/$f" "$tmp/n1_$f/vol/"
  for axis in 2 0; do
    read -r slices hh ww mean < <(h nifti "$src/$f" "$axis")
    o="$tmp/on_${f}_$axis"
    if convert "$f axis $axis" "$tmp/n1_$f" "$o" 0 --kind nifti --axis "$axis" --dtype u16; then
      read -r total per shape dtype got < <(summary "$o")
      expect "$f axis $axis: slices" "$total" "$slices"
      expect "$f axis $axis: shape" "$shape" "1x${hh}x${ww}"
      if h close "$got" "$mean" 0.002; then ok "$f axis $axis: mean $got (nibabel: $mean)"; else bad "$f axis $axis: mean $got, nibabel says $mean"; fi
    fi
  done
done

mkdir -p "$tmp/n2/anat" "$tmp/n2/func"
cp "$src/anatomical.nii" "$tmp/n2/anat/"
cp "$src/example4d.nii.gz" "$tmp/n2/func/"
read -r anat_slices _ < <(h nifti "$src/anatomical.nii" 2)
read -r func_slices _ < <(h nifti "$src/example4d.nii.gz" 2)
if convert "nifti tree" "$tmp/n2" "$tmp/o3" 0 --kind nifti --axis 2 --size 32x32; then
  read -r total per shape _ _ < <(summary "$tmp/o3")
  expect "nifti tree: slices per class (anat,func)" "$per" "$anat_slices,$func_slices"
  expect "nifti tree: shape" "$shape" "1x32x32"
fi

# --- DICOM series: files written by pydicom, one volume ordered by position ----------------------
echo "== DICOM series"
means=$(h series "$tmp/s1/ct" 6)
read -r rows cols _ _ < <(h dicom "$src/CT_small.dcm")
if convert "dicom series, f32" "$tmp/s1" "$tmp/os1" 0 --kind dicom --dtype f32 --format colmajor; then
  got=$(h colmajor_means "$tmp/os1" 1 "$rows" "$cols")
  if h same_means "$got" "$means" 0.01; then ok "series: 6 slices in position order, modality units ($got)"; else bad "series: slice means $got, pydicom in position order: $means"; fi
  key=$(python3 -c "import json; print(json.load(open('$tmp/os1/manifest.json'))['provenance']['source'].get('split_key'))")
  expect "series: split key" "$key" "PatientID"
fi

# --- Truncated copies --------------------------------------------------------------------------
echo "== truncated files"
cut_copy() { # SRC DEST: the first half of SRC
  local n
  n=$(($(wc -c < "$1") / 2))
  head -c "$n" "$1" > "$2"
}
mkdir -p "$tmp/d3/ct" "$tmp/d3/mr"
cp "$src/CT_small.dcm" "$tmp/d3/ct/"
cp "$src/MR_small.dcm" "$tmp/d3/mr/"
cut_copy "$src/CT_small.dcm" "$tmp/d3/ct/CT_cut.dcm"
cut_copy "$src/MR_small.dcm" "$tmp/d3/mr/MR_cut.dcm"
mkdir -p "$tmp/n3/anat" "$tmp/n3/func"
cp "$src/anatomical.nii" "$tmp/n3/anat/"
cp "$src/example4d.nii.gz" "$tmp/n3/func/"
cut_copy "$src/anatomical.nii" "$tmp/n3/anat/anat_cut.nii"
cut_copy "$src/example4d.nii.gz" "$tmp/n3/func/func_cut.nii.gz"

check_rejects() { # NAME OUT REL...
  local name=$1 out=$2
  shift 2
  while read -r rel _ reason; do
    if [ "$reason" != "MISSING" ]; then ok "$name: $rel rejected: $reason"; else bad "$name: $rel not listed in rejects.jsonl"; fi
  done < <(h rejects "$out/rejects.jsonl" "$@")
}
for kind in dicom nifti; do
  if [ $kind == dicom ]; then
    in="$tmp/d3"; cuts=(ct/CT_cut.dcm mr/MR_cut.dcm); good=$((ct_frames + mr_frames))
  else
    in="$tmp/n3"; cuts=(anat/anat_cut.nii func/func_cut.nii.gz); good=$((anat_slices + func_slices))
  fi
  if convert "$kind truncated, --on-error skip" "$in" "$tmp/t_$kind" 0 --kind $kind --size 32x32 --mixed-modalities; then
    check_rejects "$kind skip" "$tmp/t_$kind" "${cuts[@]}"
    read -r total _ < <(summary "$tmp/t_$kind")
    expect "$kind skip: good files still converted" "$total" "$good"
  fi
  if convert "$kind truncated, --on-error fail" "$in" "$tmp/f_$kind" 1 --kind $kind --size 32x32 --mixed-modalities --on-error fail; then
    named=no
    for c in "${cuts[@]}"; do
      grep -q "$(basename "$c")" "$tmp/f_$kind.log" && named=yes
    done
    expect "$kind fail: the error names the truncated file" "$named" "yes"
  fi
done

echo "scans: $pass passed, $fail failed"
[ "$fail" == 0 ]
