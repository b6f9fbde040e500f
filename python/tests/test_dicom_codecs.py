"""Compressed DICOM through `prep convert`, value by value against pydicom with the pylibjpeg
plugins: JPEG 2000 (pylibjpeg-openjpeg), JPEG-LS and 12-bit lossy JPEG (pylibjpeg-libjpeg).

The files are fixtures/dicom/ (copied from pydicom's test data) and three more of pydicom's test
files read from the installed package. Each is converted on its own to float values
(`--dtype f32 --format colmajor`: modality values of grey images, 0..255 of RGB ones) and compared
with pydicom's `pixel_array` (x Rescale Slope + Intercept): equal for the lossless files and for
JPEG 2000 lossy (both decoders are OpenJPEG), within 1 for 12-bit JPEG (libjpeg-turbo-rs's integer
IDCT and libjpeg's round differently). Colour JPEG-LS must be refused by name.

Skips without pydicom and the plugins, unless PREP_REQUIRE_PYDICOM=1 (.ci/run installs them).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, prep_bin

FIXTURES = REPO / "fixtures" / "dicom"

# (file, where, largest difference allowed)
CASES = [
    ("JPEG2000.dcm", "fixture", 0),
    ("MR_small_jp2klossless.dcm", "fixture", 0),
    ("GDCMJ2K_TextGBR.dcm", "fixture", 0),
    ("MR_small_jpeg_ls_lossless.dcm", "fixture", 0),
    ("JPEGLSNearLossless_08.dcm", "fixture", 0),
    ("JPEGLSNearLossless_16.dcm", "fixture", 0),
    ("JPGExtended.dcm", "fixture", 1),
    # JPEG 2000 lossy, Bits Stored 14 in a 16-bit codestream, Rescale Intercept -1024.
    ("693_J2KI.dcm", "pydicom", 0),
    # JPEG 2000 Lossless: an unsigned 13-bit codestream, Pixel Representation 1.
    ("J2K_pixelrep_mismatch.dcm", "pydicom", 0),
    # JPEG 2000 Lossless, 640x480 YBR_RCT.
    ("examples_jpeg2k.dcm", "pydicom", 0),
]


@pytest.fixture(scope="module")
def pydicom():
    try:
        import pydicom
        import pylibjpeg  # noqa: F401
        import openjpeg  # noqa: F401  (pylibjpeg-openjpeg)
        import libjpeg  # noqa: F401  (pylibjpeg-libjpeg)
    except ImportError as e:
        if os.environ.get("PREP_REQUIRE_PYDICOM"):
            pytest.fail(f"PREP_REQUIRE_PYDICOM is set but {e}")
        pytest.skip(f"needs pydicom, pylibjpeg, pylibjpeg-openjpeg and pylibjpeg-libjpeg ({e})")
    return pydicom


def source(pydicom, name, where):
    if where == "fixture":
        return FIXTURES / name
    import pydicom.data

    return Path(pydicom.data.get_testdata_file(name))


def convert(src_dir: Path, out: Path, *extra):
    return subprocess.run(
        [prep_bin(), "convert", str(src_dir), "--out", str(out), "--kind", "dicom", "--quiet",
         *extra],
        capture_output=True, text=True)


def read_colmajor(out: Path) -> np.ndarray:
    """The one sample of a colmajor f32 dataset, as (channels, height, width)."""
    m = json.loads((out / "manifest.json").read_text())
    shape = m["sample"]["shape"]
    [(split, info)] = m["splits"].items()
    assert info["samples"] == 1
    x = np.fromfile(out / info["images"], dtype="<f4").reshape((1, -1), order="F")
    return x[0].reshape(shape)


@pytest.mark.parametrize("name,where,tol", CASES, ids=[c[0] for c in CASES])
def test_convert_matches_pydicom(pydicom, tmp_path, name, where, tol):
    path = source(pydicom, name, where)
    ds = pydicom.dcmread(path)
    d = tmp_path / "in" / "x"
    d.mkdir(parents=True)
    if "SeriesInstanceUID" in ds and "InstanceNumber" not in ds:
        # A lone file of a series with neither Instance Number nor Image Position is left out by
        # the series grouping (series.rs), whatever its codec: give it an Instance Number.
        ds.InstanceNumber = 1
        ds.save_as(d / name)
    else:
        shutil.copy(path, d / name)
    r = convert(tmp_path / "in", tmp_path / "out", "--dtype", "f32", "--format", "colmajor")
    assert r.returncode == 0, f"prep convert {name}: {r.stderr}"
    got = read_colmajor(tmp_path / "out").astype(np.float64)

    a = ds.pixel_array
    if int(ds.SamplesPerPixel) == 3:
        want = a.transpose(2, 0, 1).astype(np.float64)
    else:
        slope = float(ds.get("RescaleSlope", 1) or 1)
        intercept = float(ds.get("RescaleIntercept", 0) or 0)
        want = (a.astype(np.float64) * slope + intercept).astype(np.float32).astype(np.float64)
        want = want[None]
    assert got.shape == want.shape, f"{name}: shape {got.shape}, pydicom {want.shape}"
    diff = np.abs(got - want)
    worst = float(diff.max())
    print(f"{name} ({ds.file_meta.TransferSyntaxUID.name}): max |prep - pydicom| = {worst:g}, "
          f"{int((diff > 0).sum())} of {diff.size} values differ")
    assert worst <= tol, f"{name}: values differ from pydicom's by up to {worst} (allowed {tol})"


def test_colour_jpeg_ls_is_refused_by_name(pydicom, tmp_path):
    d = tmp_path / "in" / "x"
    d.mkdir(parents=True)
    shutil.copy(FIXTURES / "MR_small_jpeg_ls_lossless.dcm", d)
    shutil.copy(FIXTURES / "SC_rgb_jls_lossy_line.dcm", d)
    ts = "1.2.840.10008.1.2.4.81 (JPEG-LS Near-Lossless)"

    r = convert(tmp_path / "in", tmp_path / "skip", "--size", "64x64")
    assert r.returncode == 0, r.stderr
    rejects = [json.loads(line) for line in (tmp_path / "skip" / "rejects.jsonl").open()]
    [rej] = [x for x in rejects if x["path"] == "x/SC_rgb_jls_lossy_line.dcm"]
    assert ts in rej["reason"], rej

    r = convert(tmp_path / "in", tmp_path / "fail", "--size", "64x64", "--on-error", "fail")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "SC_rgb_jls_lossy_line.dcm" in r.stderr and ts in r.stderr, r.stderr
