#!/usr/bin/env python3
"""Write scikit-learn's figures for random metric cases to fixtures/scores/sklearn.json, which
`src/train/scores/tests.rs` (agrees_with_sklearn) checks prep's metrics against.

    scripts/scores-sklearn.py [--check]

Cases: multi-label probabilities (quantised to one decimal so ties are common, and continuous),
a label without positives, regression predictions and targets, and segmentation masks. Figures:
average_precision_score per label (None where a label has no positives), micro/macro F1 at
probability > 0.5 with zero_division=nan (labels neither true nor predicted left out), subset
accuracy (exact match), MAE, RMSE and R2 per target, and Dice (= per-class F1) and IoU (= Jaccard)
per class (every class occurs in every case's masks). With --check, compare with the file instead of writing it (exit 1 on a difference).
Without scikit-learn it says so and exits 0, so callers can run it unconditionally.
"""
import argparse, json, sys
from pathlib import Path

try:
    import numpy as np
    import sklearn
    from sklearn import metrics as m
except ImportError as e:
    print(f"skipped: {e} (pip install scikit-learn)")
    sys.exit(0)

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "scores" / "sklearn.json"


def case(rng, n, k, quantise, classes, pixels):
    scores = rng.random((n, k)).astype(np.float32)
    if quantise:
        scores = np.round(scores, 1).astype(np.float32)
    truth = (rng.random((n, k)) < np.linspace(0.15, 0.6, k)).astype(np.uint8)
    # Scores that carry some signal, so APs are spread rather than all near the positive rate.
    scores = np.where(truth == 1, np.minimum(scores + np.float32(0.2), np.float32(1)), scores)
    truth[:, -1] = 0  # one label without positives: AP undefined, F1 only from false positives
    pred = scores > 0.5
    s64 = scores.astype(np.float64)
    ap = [None if truth[:, j].sum() == 0 else float(m.average_precision_score(truth[:, j], s64[:, j]))
          for j in range(k)]
    target = (rng.normal(size=(n, k)) * np.arange(1, k + 1) * 10 + 100).astype(np.float32)
    rpred = (target + rng.normal(size=(n, k)).astype(np.float32) * 5).astype(np.float32)
    t64, p64 = target.astype(np.float64), rpred.astype(np.float64)
    mask_truth = rng.integers(0, classes, pixels)
    mask_pred = np.where(rng.random(pixels) < 0.7, mask_truth, rng.integers(0, classes, pixels))
    labels = list(range(classes))
    f1 = dict(zero_division=np.nan)
    return {
        "n": n, "k": k,
        "scores": [float(v) for v in scores.ravel()],
        "truth": [int(v) for v in truth.ravel()],
        "ap": ap,
        "micro_f1": float(m.f1_score(truth, pred, average="micro", **f1)),
        "macro_f1": float(m.f1_score(truth, pred, average="macro", **f1)),
        "exact_match": float(m.accuracy_score(truth, pred)),
        "pred": [float(v) for v in rpred.ravel()],
        "target": [float(v) for v in target.ravel()],
        "mae": m.mean_absolute_error(t64, p64, multioutput="raw_values").tolist(),
        "rmse": np.sqrt(m.mean_squared_error(t64, p64, multioutput="raw_values")).tolist(),
        "r2": m.r2_score(t64, p64, multioutput="raw_values").tolist(),
        "mask_pred": [int(v) for v in mask_pred],
        "mask_truth": [int(v) for v in mask_truth],
        "classes": classes,
        "dice": m.f1_score(mask_truth, mask_pred, labels=labels, average=None, **f1).tolist(),
        "iou": m.jaccard_score(mask_truth, mask_pred, labels=labels, average=None).tolist(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(29)
    cases = [case(rng, n, k, q, c, p) for n, k, q, c, p in [
        (12, 3, True, 2, 50), (40, 4, True, 3, 200), (97, 2, False, 4, 300),
        (150, 5, True, 5, 400), (200, 3, False, 3, 256), (64, 6, True, 6, 500)]]
    text = json.dumps(cases, separators=(",", ":")) + "\n"
    if args.check:
        same = OUT.read_text() == text
        print("same" if same else f"{OUT} differs from scikit-learn {sklearn.__version__}'s figures")
        sys.exit(0 if same else 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text)} bytes, {len(cases)} cases)")


if __name__ == "__main__":
    main()
