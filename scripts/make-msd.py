#!/usr/bin/env python3
"""A small Medical Segmentation Decathlon-style dataset, written with nibabel: CASES cases of two
MR-like channels ("T1", "T2") of 64x64x24 voxels with a label volume of two structures (1: a
sphere, "core"; 2: a shell around it, "edema") and a background, in the MSD layout (one 4-D file
per case) or nnU-Net v2's (`_0000`, `_0001` per channel), with dataset.json.

    scripts/make-msd.py OUT [--cases 6] [--nnunet]
"""
import argparse
import json
import os

import nibabel as nib
import numpy as np

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--cases", type=int, default=6)
p.add_argument("--nnunet", action="store_true")
a = p.parse_args()
rng = np.random.default_rng(0)
os.makedirs(f"{a.out}/imagesTr", exist_ok=True)
os.makedirs(f"{a.out}/labelsTr", exist_ok=True)
X, Y, Z = 64, 64, 24
x, y, z = np.meshgrid(np.arange(X), np.arange(Y), np.arange(Z), indexing="ij")
affine = np.diag([0.9, 0.9, 3.0, 1.0])
training = []
for c in range(a.cases):
    cx, cy, cz = rng.integers(20, 44), rng.integers(20, 44), rng.integers(8, 16)
    r = rng.uniform(5, 9)
    d = np.sqrt((x - cx) ** 2 + (y - cy) ** 2 + ((z - cz) * 3.0 / 0.9) ** 2)
    label = np.where(d < r, 1, np.where(d < r + 5, 2, 0)).astype(np.uint8)
    t1 = (400 + 300 * (label == 1) + 120 * (label == 2) + rng.normal(0, 30, label.shape)).astype(np.float32)
    t2 = (900 - 200 * (label == 1) + 500 * (label == 2) + rng.normal(0, 40, label.shape)).astype(np.float32)
    name = f"brain_{c:03d}"
    if a.nnunet:
        nib.save(nib.Nifti1Image(t1, affine), f"{a.out}/imagesTr/{name}_0000.nii.gz")
        nib.save(nib.Nifti1Image(t2, affine), f"{a.out}/imagesTr/{name}_0001.nii.gz")
    else:
        nib.save(nib.Nifti1Image(np.stack([t1, t2], axis=-1), affine), f"{a.out}/imagesTr/{name}.nii.gz")
    nib.save(nib.Nifti1Image(label, affine), f"{a.out}/labelsTr/{name}.nii.gz")
    training.append({"image": f"./imagesTr/{name}.nii.gz", "label": f"./labelsTr/{name}.nii.gz"})
if a.nnunet:
    meta = {"channel_names": {"0": "T1", "1": "T2"},
            "labels": {"background": 0, "core": 1, "edema": 2},
            "numTraining": a.cases, "file_ending": ".nii.gz"}
else:
    meta = {"name": "synthetic", "modality": {"0": "T1", "1": "T2"},
            "labels": {"0": "background", "1": "core", "2": "edema"},
            "numTraining": a.cases, "numTest": 0, "training": training, "test": []}
with open(f"{a.out}/dataset.json", "w") as f:
    json.dump(meta, f, indent=1)
print(f"{a.out}: {a.cases} cases, 2 channels, {X}x{Y}x{Z}")
