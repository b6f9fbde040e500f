#!/usr/bin/env python3
"""Write the seeds of the convert decoder targets into fuzz/seeds/<target>/.

Needs numpy, pydicom (3.x) and nibabel, and ffmpeg on PATH for the PNG/JPEG/BMP/GIF/WebP/TIFF
images. Every file is small (tiny images), so mutations stay fast. Run from fuzz/:

    python3 scripts/make_decoder_seeds.py
"""
import gzip
import io
import os
import struct
import subprocess
import tempfile

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "seeds")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def ramp(shape, dtype, seed=0):
    n = int(np.prod(shape))
    return ((np.arange(n) * 37 + seed * 11) % 251).astype(dtype).reshape(shape)


# IDX: magic 00 00 08 ND, big-endian u32 dims, u8 data.
def idx(arr):
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return head + arr.astype(np.uint8).tobytes()


put("idx", "images-3x4x5", idx(ramp((3, 4, 5), np.uint8)))
put("idx", "labels-3", idx(np.array([0, 1, 2], np.uint8)))
put("idx", "images-2x3x3.gz", gzip.compress(idx(ramp((2, 3, 3), np.uint8, 1)), mtime=0))

# CIFAR: one record each (label byte(s) + 3072 pixel bytes).
put("cifar", "cifar10-1rec.bin", bytes([7]) + ramp((3072,), np.uint8).tobytes())
put("cifar", "cifar100-1rec.bin", bytes([3, 42]) + ramp((3072,), np.uint8, 2).tobytes())


# .npy through numpy itself (format 1.0, and 2.0 for one file).
def npy(arr, version=None):
    b = io.BytesIO()
    if version is None:
        np.save(b, arr)
    else:
        np.lib.format.write_array(b, arr, version=version)
    return b.getvalue()


put("npy", "u1-nhw-4x5x6.npy", npy(ramp((4, 5, 6), np.uint8)))
put("npy", "u1-nhwc-2x3x4x3.npy", npy(ramp((2, 3, 4, 3), np.uint8)))
put("npy", "u2-nchw-2x1x4x4.npy", npy(ramp((2, 1, 4, 4), np.uint16) * 250))
put("npy", "f4-nhw-2x3x3.npy", npy(ramp((2, 3, 3), np.float32) / 251))
put("npy", "f8-nhwc-1x2x2x4.npy", npy(ramp((1, 2, 2, 4), np.float64) / 251))
put("npy", "f2-nhw-2x2x3.npy", npy(ramp((2, 2, 3), np.float16) / 251))
put("npy", "u1-v2-nhw-2x3x3.npy", npy(ramp((2, 3, 3), np.uint8), version=(2, 0)))
put("npy", "labels-i8-4.npy", npy(np.array([0, 3, 1, 2], np.int64)))
put("npy", "labels-u1-4.npy", npy(np.array([1, 0, 1, 0], np.uint8)))


# Images through ffmpeg's encoders, from its test pattern.
def ffmpeg(ext, *args, size="12x8", frames=1):
    with tempfile.TemporaryDirectory() as t:
        out = os.path.join(t, "o." + ext)
        subprocess.run(
            ["ffmpeg", "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i",
             f"testsrc=size={size}:rate=1", "-frames:v", str(frames), *args, "-y", out],
            check=True)
        return open(out, "rb").read()


put("image", "rgb8.png", ffmpeg("png", "-pix_fmt", "rgb24"))
put("image", "grey16.png", ffmpeg("png", "-pix_fmt", "gray16be"))
put("image", "rgba8.png", ffmpeg("png", "-pix_fmt", "rgba"))
put("image", "pal8.png", ffmpeg("png", "-pix_fmt", "pal8"))
put("image", "yuv420.jpg", ffmpeg("jpg", "-pix_fmt", "yuvj420p"))
put("image", "yuv444.jpg", ffmpeg("jpg", "-pix_fmt", "yuvj444p"))
put("image", "grey.jpg", ffmpeg("jpg", "-pix_fmt", "gray"))
put("image", "rgb24.bmp", ffmpeg("bmp", "-pix_fmt", "bgr24"))
put("image", "pal8.bmp", ffmpeg("bmp", "-pix_fmt", "pal8"))
put("image", "grey.bmp", ffmpeg("bmp", "-pix_fmt", "gray"))
put("image", "two-frames.gif", ffmpeg("gif", frames=2))
put("image", "lossy.webp", ffmpeg("webp", "-c:v", "libwebp", "-lossless", "0"))
put("image", "lossless.webp", ffmpeg("webp", "-c:v", "libwebp", "-lossless", "1"))
put("image", "rgb-lzw.tiff", ffmpeg("tiff", "-compression_algo", "lzw"))

for algo in ["raw", "packbits", "lzw", "deflate"]:
    put("tiff_stack", f"rgb-{algo}.tif", ffmpeg("tiff", "-compression_algo", algo))
put("tiff_stack", "grey16-deflate.tif", ffmpeg("tiff", "-pix_fmt", "gray16le", "-compression_algo", "deflate"))


# Multi-page TIFFs by hand (little-endian, one uncompressed strip per page).
def tiff_pages(pages):
    """pages: list of (width, height, samples, bits, data bytes)."""
    out = bytearray(b"II*\x00" + struct.pack("<I", 0))
    prev_next = 4
    for (w, h, spp, bits, data) in pages:
        data_off = len(out)
        out += data
        if len(out) % 2:
            out += b"\x00"
        bps_off = None
        if spp > 2:  # up to two SHORTs fit in the entry itself
            bps_off = len(out)
            out += struct.pack("<" + "H" * spp, *([bits] * spp))
        ifd_off = len(out)
        struct.pack_into("<I", out, prev_next, ifd_off)
        photometric = 2 if spp >= 3 else 1
        entries = [
            (256, 3, 1, w), (257, 3, 1, h),
            (258, 3, spp, bits if spp == 1 else bits | bits << 16 if spp == 2 else bps_off),
            (259, 3, 1, 1), (262, 3, 1, photometric), (273, 4, 1, data_off),
            (277, 3, 1, spp), (278, 3, 1, h), (279, 4, 1, len(data)),
        ]
        if spp in (2, 4):
            entries.append((338, 3, 1, 2))
        out += struct.pack("<H", len(entries))
        for tag, typ, count, val in entries:
            if typ == 3 and count == 2:
                out += struct.pack("<HHII", tag, typ, count, val)
            elif typ == 3 and count == 1:
                out += struct.pack("<HHIHH", tag, typ, count, val, 0)
            else:
                out += struct.pack("<HHII", tag, typ, count, val)
        prev_next = len(out)
        out += struct.pack("<I", 0)
    return bytes(out)


put("tiff_stack", "grey8-3pages.tif",
    tiff_pages([(5, 4, 1, 8, ramp((4, 5), np.uint8, i).tobytes()) for i in range(3)]))
put("tiff_stack", "grey16-2pages.tif",
    tiff_pages([(4, 3, 1, 16, (ramp((3, 4), np.uint16, i) * 200).astype("<u2").tobytes()) for i in range(2)]))
put("tiff_stack", "mixed-pages.tif", tiff_pages([
    (3, 2, 3, 8, ramp((2, 3, 3), np.uint8).tobytes()),
    (3, 2, 4, 8, ramp((2, 3, 4), np.uint8).tobytes()),
    (3, 2, 2, 16, ramp((2, 3, 2), np.uint16).astype("<u2").tobytes()),
]))

# NIfTI-1 through nibabel.
import nibabel as nib


def nii(arr, slope=None, inter=None, gz=False, big_endian=False):
    img = nib.Nifti1Image(arr, np.eye(4))
    if slope is not None:
        img.header.set_slope_inter(slope, inter)
    if big_endian:
        img = nib.Nifti1Image(arr, np.eye(4), header=img.header.as_byteswapped(">"))
    b = img.to_bytes()
    return gzip.compress(b, mtime=0) if gz else b


put("nifti", "i16-6x5x4.nii", nii(ramp((6, 5, 4), np.int16) - 100))
put("nifti", "u8-4x4x3.nii.gz", nii(ramp((4, 4, 3), np.uint8), gz=True))
put("nifti", "f32-4d-3x3x2x2-scaled.nii", nii(ramp((3, 3, 2, 2), np.float32) / 7, slope=2.0, inter=-1.0))
put("nifti", "f64-2d-4x3.nii", nii(ramp((4, 3), np.float64) / 3))
put("nifti", "i16-be-3x3x3.nii", nii(ramp((3, 3, 3), np.int16), big_endian=True))

# DICOM through pydicom.
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import (ExplicitVRLittleEndian, ImplicitVRLittleEndian, ExplicitVRBigEndian,
                         DeflatedExplicitVRLittleEndian, RLELossless, JPEGBaseline8Bit,
                         SecondaryCaptureImageStorage, generate_uid)


def dicom(arr, ts=ExplicitVRLittleEndian, photometric="MONOCHROME2", signed=False, frames=1,
          extra=None, pixel_bytes=None, bits_stored=None):
    ds = Dataset()
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = "1.2.3.4.5"
    meta.TransferSyntaxUID = ts
    ds.file_meta = meta
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = "1.2.3.4.5"
    ds.PatientID = "P1"
    ds.SeriesInstanceUID = "1.2.3.4"
    ds.Modality = "OT"
    spp = 3 if photometric in ("RGB", "YBR_FULL", "YBR_FULL_422") else 1
    ds.SamplesPerPixel = spp
    ds.PhotometricInterpretation = photometric
    if spp == 3:
        ds.PlanarConfiguration = 0
    rows, cols = arr.shape[-2 - (spp == 3)], arr.shape[-1 - (spp == 3)]
    ds.Rows, ds.Columns = rows, cols
    if frames > 1:
        ds.NumberOfFrames = frames
    bits = arr.dtype.itemsize * 8
    ds.BitsAllocated = bits
    ds.BitsStored = bits_stored or bits
    ds.HighBit = ds.BitsStored - 1
    ds.PixelRepresentation = 1 if signed else 0
    ds.ImagePositionPatient = [0, 0, 0]
    ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
    ds.PixelSpacing = [0.5, 0.5]
    ds.InstanceNumber = 1
    for k, v in (extra or {}).items():
        setattr(ds, k, v)
    if pixel_bytes is not None:
        ds.PixelData = pixel_bytes
    else:
        ds.PixelData = arr.tobytes() if ts != ExplicitVRBigEndian else arr.byteswap().tobytes()
    if ts == RLELossless:
        ds.PixelData = arr.tobytes()
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.compress(RLELossless, arr)
    ds.set_original_encoding(ts != ImplicitVRLittleEndian, ts != ExplicitVRBigEndian)
    b = io.BytesIO()
    ds.save_as(b, enforce_file_format=True)
    return b.getvalue()


put("dicom", "mono2-u16-explicit.dcm",
    dicom(ramp((6, 5), np.uint16) * 100, extra={"WindowCenter": 6000, "WindowWidth": 12000,
                                                "RescaleSlope": 1, "RescaleIntercept": -1024}))
put("dicom", "mono1-u8-implicit.dcm", dicom(ramp((4, 6), np.uint8), ts=ImplicitVRLittleEndian,
                                             photometric="MONOCHROME1"))
put("dicom", "mono2-i16-3frames.dcm", dicom(ramp((3, 4, 5), np.int16) - 50, signed=True, frames=3,
                                             bits_stored=12))
put("dicom", "rgb8.dcm", dicom(ramp((3, 4, 3), np.uint8), photometric="RGB"))
put("dicom", "mono2-u16-bigendian.dcm", dicom(ramp((4, 4), np.uint16) * 7, ts=ExplicitVRBigEndian))
put("dicom", "mono2-u16-deflated.dcm", dicom(ramp((5, 5), np.uint16) * 3, ts=DeflatedExplicitVRLittleEndian))
put("dicom", "mono2-u16-rle.dcm", dicom(ramp((4, 6), np.uint16) * 9, ts=RLELossless))
put("dicom", "rgb8-rle.dcm", dicom(ramp((4, 3, 3), np.uint8), ts=RLELossless, photometric="RGB"))


def grey_jpeg():
    """A 16x8 one-component baseline JPEG by hand (ffmpeg's MJPEG encoder always writes three
    components): two blocks, DC only; one-symbol Huffman tables (DC categories 0 and 2, AC EOB)."""
    seg = lambda m, body: bytes([0xFF, m]) + struct.pack(">H", len(body) + 2) + body
    dqt = seg(0xDB, bytes([0]) + bytes([1] * 64))
    sof = seg(0xC0, bytes([8]) + struct.pack(">HH", 8, 16) + bytes([1, 1, 0x11, 0]))
    # DC table 0: codes '0' -> category 0, '10' -> category 2; AC table 0: '0' -> EOB.
    dht_dc = seg(0xC4, bytes([0x00, 1, 1] + [0] * 14 + [0, 2]))
    dht_ac = seg(0xC4, bytes([0x10, 1] + [0] * 15 + [0x00]))
    sos = seg(0xDA, bytes([1, 1, 0x00, 0, 63, 0]))
    # Block 1: DC diff 0 ('0'), EOB ('0'); block 2: DC diff +3 ('10' then '11'), EOB ('0').
    bits = "0" + "0" + "10" + "11" + "0"
    bits += "1" * (-len(bits) % 8)
    scan = bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8))
    return b"\xff\xd8" + dqt + sof + dht_dc + dht_ac + sos + scan + b"\xff\xd9"


jpeg = grey_jpeg()
put("dicom", "mono2-u8-jpeg-baseline.dcm",
    dicom(np.zeros((8, 16), np.uint8), ts=JPEGBaseline8Bit, pixel_bytes=encapsulate([jpeg])))
jpeg = ffmpeg("jpg", "-pix_fmt", "yuvj420p", size="8x8")
put("dicom", "ybr-jpeg-baseline.dcm",
    dicom(np.zeros((8, 8, 3), np.uint8), ts=JPEGBaseline8Bit, photometric="YBR_FULL_422",
          pixel_bytes=encapsulate([jpeg])))
