use super::*;

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-12)
}

#[track_caller]
fn assert_close(a: Option<f64>, b: f64) {
    assert!(close(a, b), "{a:?} != {b}");
}

// ---- segmentation

#[test]
fn seg_counts_by_hand() {
    // Pixel by pixel (truth, pred): (0,0) tp0; (0,1) fp1 fn0; (1,1) tp1; (1,1) tp1; (1,0) fp0 fn1;
    // (2,2) tp2; (2,0) fp0 fn2; (0,0) tp0; (255,2) ignored; (3 never present).
    let truth = [0, 0, 1, 1, 1, 2, 2, 0, 255];
    let pred = [0, 1, 1, 1, 0, 2, 0, 0, 2];
    let mut c = SegCounts::new(4);
    c.add(&pred, &truth, Some(255)).unwrap();
    assert_eq!(c.counts(), &[[2, 2, 1], [2, 1, 1], [1, 0, 1], [0, 0, 0]]);
    let s = SegScores::from_counts(c.counts(), &names(&["bg", "road", "car", "bus"]), Some(0));
    let s = s.unwrap();
    // Dice: bg 4/(4+3), road 4/(4+2), car 2/(2+1); IoU road 2/4, car 1/2; bus undefined.
    assert_close(s.dice[0], 4.0 / 7.0);
    assert_close(s.dice[1], 2.0 / 3.0);
    assert_close(s.dice[2], 2.0 / 3.0);
    assert_eq!((s.dice[3], s.iou[3]), (None, None));
    assert_close(s.iou[0], 2.0 / 5.0);
    assert_close(s.iou[1], 0.5);
    // Means over road and car only (bg is background, bus undefined).
    assert_close(s.mean_dice, 2.0 / 3.0);
    assert_close(s.mean_iou, 0.5);
    assert_close(s.pixel_accuracy, 5.0 / 8.0);
    assert_eq!(
        s.summary(),
        "mean Dice 0.667 (road 0.67, car 0.67, bus -), mean IoU 0.500, pixel accuracy 0.625"
    );
    // Without a background every defined class counts: (4/7 + 2/3 + 2/3) / 3.
    let all = SegScores::from_counts(c.counts(), &s.classes, None).unwrap();
    assert_close(all.mean_dice, (4.0 / 7.0 + 4.0 / 3.0) / 3.0);
}

#[test]
fn seg_all_correct_empty_and_merge() {
    let mut a = SegCounts::new(3);
    a.add(&[0, 1, 2, 1], &[0, 1, 2, 1], None).unwrap();
    let s = SegScores::from_counts(a.counts(), &names(&["bg", "a", "b"]), Some(0)).unwrap();
    assert_eq!(s.dice, vec![Some(1.0); 3]);
    assert_eq!(
        (s.mean_dice, s.mean_iou, s.pixel_accuracy),
        (Some(1.0), Some(1.0), Some(1.0))
    );
    // Only background in truth and prediction: no foreground figure is defined.
    let mut bg = SegCounts::new(3);
    bg.add(&[0; 5], &[0; 5], None).unwrap();
    let s = SegScores::from_counts(bg.counts(), &names(&["bg", "a", "b"]), Some(0)).unwrap();
    assert_eq!(
        (s.mean_dice, s.mean_iou, s.pixel_accuracy),
        (None, None, Some(1.0))
    );
    assert!(
        s.summary().starts_with("mean Dice - (a -, b -)"),
        "{}",
        s.summary()
    );
    // Nothing counted at all.
    let s = SegScores::from_counts(SegCounts::new(2).counts(), &names(&["bg", "a"]), Some(0));
    assert_eq!(s.unwrap().pixel_accuracy, None);
    // Merging is adding.
    a.merge(&bg).unwrap();
    assert_eq!(a.counts(), &[[6, 0, 0], [2, 0, 0], [1, 0, 0]]);
    assert!(a.merge(&SegCounts::new(2)).is_err());
}

#[test]
fn seg_bad_input_is_an_error_and_counts_nothing() {
    let mut c = SegCounts::new(2);
    let err = c.add(&[0, 1, 0], &[0, 1, 2], None).unwrap_err();
    assert!(err.to_string().contains("pixel 2"), "{err}");
    assert!(c.add(&[0, 5], &[0, 1], Some(9)).is_err());
    assert!(c.add(&[0], &[0, 1], None).is_err());
    assert_eq!(c.counts(), &[[0; 3]; 2]);
    // A prediction out of range on an ignored pixel is not looked at.
    c.add(&[7, 1], &[9, 1], Some(9)).unwrap();
    assert_eq!(c.counts(), &[[0, 0, 0], [1, 0, 0]]);
    let k2 = c.counts();
    assert!(SegScores::from_counts(k2, &names(&["a"]), None).is_err());
    assert!(SegScores::from_counts(k2, &names(&["a", "b"]), Some(2)).is_err());
}

#[test]
fn seg_scores_serialise() {
    let s = SegScores::from_counts(&[[1, 0, 0], [0, 0, 0]], &names(&["bg", "x"]), Some(0));
    let json = serde_json::to_string(&s.unwrap()).unwrap();
    assert!(json.contains(r#""dice":[1.0,null]"#), "{json}");
    assert!(json.contains(r#""mean_dice":null"#), "{json}");
    let back: SegScores = serde_json::from_str(&json).unwrap();
    assert_eq!(back.counts, vec![[1, 0, 0], [0, 0, 0]]);
}

// ---- average precision

fn ap(scores: &[f32], truth: &[u8]) -> Option<f64> {
    average_precision(scores, truth).unwrap()
}

#[test]
fn ap_by_hand() {
    // Ranked + - + -: points (P 1, R 1/2), (1/2, 1/2), (2/3, 1), (1/2, 1):
    // AP = 1/2 * 1 + 0 + 1/2 * 2/3 + 0 = 5/6.
    assert_close(ap(&[0.9, 0.8, 0.7, 0.6], &[1, 0, 1, 0]), 5.0 / 6.0);
    // Ties enter together. 3 positives; groups in decreasing score:
    // {0.9: -} tp 0 of 1 seen, R 0 -> +0;
    // {0.5: +, -, +} tp 2 of 4 seen, R 2/3 -> +(2/3)(2/4) = 1/3;
    // {0.1: +} tp 3 of 5 seen, R 1 -> +(1/3)(3/5) = 1/5. AP = 8/15.
    // (Broken ties, + first, would give 1/3*1/2 + 1/3*2/3 + 1/3*3/5 = 0.5889; - first 0.5222.)
    assert_close(ap(&[0.9, 0.5, 0.5, 0.5, 0.1], &[0, 1, 0, 1, 1]), 8.0 / 15.0);
    // Everything tied: one point at P = positives / n.
    assert_close(ap(&[0.5; 4], &[1, 0, 1, 0]), 0.5);
    // Perfect ranking and all positive: 1.
    assert_close(ap(&[0.1, 0.9, 0.2], &[0, 1, 0]), 1.0);
    assert_close(ap(&[0.3, 0.3, 0.1], &[1, 1, 1]), 1.0);
    // Worst ranking: the one positive last of 4: 1 * 1/4.
    assert_close(ap(&[0.9, 0.8, 0.7, 0.1], &[0, 0, 0, 1]), 0.25);
    // No positives: undefined. Nothing at all: undefined.
    assert_eq!(ap(&[0.9, 0.1], &[0, 0]), None);
    assert_eq!(ap(&[], &[]), None);
}

#[test]
fn ap_nan_and_signed_zero() {
    // NaN ranks last: {0.2: -} then {NaN: +} -> 1 * 1/2.
    assert_close(ap(&[f32::NAN, 0.2], &[1, 0]), 0.5);
    // NaN and -inf tie at the bottom: {1: +} R 1/2 P 1, {-inf, NaN: +, -} R 1 P 2/3.
    let s = [f32::NEG_INFINITY, 1.0, f32::NAN];
    assert_close(ap(&s, &[1, 1, 0]), 0.5 + 0.5 * 2.0 / 3.0);
    // -0.0 and 0.0 are one score (a group): 1 * 1/2, not 1 (0.0 before -0.0) or 1/2 by luck.
    assert_close(ap(&[-0.0, 0.0], &[0, 1]), 0.5);
    assert_close(ap(&[0.0, -0.0], &[0, 1]), 0.5);
}

#[test]
fn ap_bad_input() {
    assert!(average_precision(&[0.1], &[1, 0]).is_err());
    let err = average_precision(&[0.1, 0.2], &[1, 2]).unwrap_err();
    assert!(err.to_string().contains("not 0 or 1"), "{err}");
}

// ---- multi-label

/// 4 samples x labels a, b, c (c never true). Probabilities > 0.5 predict:
/// s0 [1,0,1] truth [1,0,0]; s1 [0,1,0] truth [1,1,0]; s2 [1,0,0] (0.5 is not > 0.5) truth [0,0,0];
/// s3 [0,1,0] truth [0,1,0].
const PROBS: [f32; 12] = [0.9, 0.2, 0.6, 0.4, 0.7, 0.1, 0.6, 0.3, 0.5, 0.1, 0.8, 0.5];
const TRUTH: [u8; 12] = [1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0];

#[track_caller]
fn check_example(s: &LabelScores) {
    // AP a: ranked 0.9 +, 0.6 -, 0.4 +, 0.1 -: 1/2 * 1 + 1/2 * 2/3 = 5/6. AP b: both positives
    // first: 1. c: no positives. mAP = (5/6 + 1) / 2.
    assert_close(s.ap[0], 5.0 / 6.0);
    assert_close(s.ap[1], 1.0);
    assert_eq!(s.ap[2], None);
    assert_close(s.map, 11.0 / 12.0);
    // F1 a: tp 1 (s0) fp 1 (s2) fn 1 (s1) -> 2/4; b: tp 2 -> 1; c: fp 1 (s0) -> 0.
    assert_close(s.f1[0], 0.5);
    assert_close(s.f1[1], 1.0);
    assert_close(s.f1[2], 0.0);
    // Micro: tp 3, fp 2, fn 1 -> 6 / 9. Macro: (0.5 + 1 + 0) / 3. Exact: s3 only.
    assert_close(s.micro_f1, 2.0 / 3.0);
    assert_close(s.macro_f1, 0.5);
    assert_close(s.exact_match, 0.25);
    assert_eq!((s.samples, s.ap_samples), (4, 4));
}

#[test]
fn labels_by_hand_probabilities_and_logits() {
    let abc = names(&["a", "b", "c"]);
    let mut acc = LabelAccum::new(3, ScoreKind::Probabilities);
    acc.add(&PROBS[..6], &TRUTH[..6]).unwrap();
    acc.add(&PROBS[6..], &TRUTH[6..]).unwrap();
    let s = acc.finish(&abc).unwrap();
    check_example(&s);
    assert_eq!(
        s.summary(),
        "mAP 0.917, micro F1 0.667, macro F1 0.500, exact match 0.250"
    );
    // The same model as logits (0.5 -> logit 0, again not a positive).
    let logits: Vec<f32> = PROBS.iter().map(|p| (p / (1.0 - p)).ln()).collect();
    assert_eq!(logits[8], 0.0);
    let mut acc = LabelAccum::new(3, ScoreKind::Logits);
    acc.add(&logits, &TRUTH).unwrap();
    check_example(&acc.finish(&abc).unwrap());
}

#[test]
fn labels_edge_cases() {
    let ab = names(&["a", "b"]);
    // All correct, label b never true nor predicted: its F1 is undefined and left out.
    let mut acc = LabelAccum::new(2, ScoreKind::Probabilities);
    acc.add(&[0.9, 0.1, 0.2, 0.3], &[1, 0, 0, 0]).unwrap();
    let s = acc.finish(&ab).unwrap();
    assert_eq!((s.f1[0], s.f1[1]), (Some(1.0), None));
    assert_eq!(
        (s.macro_f1, s.micro_f1, s.exact_match),
        (Some(1.0), Some(1.0), Some(1.0))
    );
    assert_eq!((s.ap[0], s.ap[1], s.map), (Some(1.0), None, Some(1.0)));
    // No positives anywhere and nothing predicted: nothing is defined but exact match.
    let mut acc = LabelAccum::new(2, ScoreKind::Logits);
    acc.add(&[-1.0, -2.0], &[0, 0]).unwrap();
    let s = acc.finish(&ab).unwrap();
    assert_eq!((s.map, s.micro_f1, s.macro_f1), (None, None, None));
    assert_eq!(s.exact_match, Some(1.0));
    assert_eq!(
        s.summary(),
        "mAP -, micro F1 -, macro F1 -, exact match 1.000"
    );
    // Nothing added.
    let s = LabelAccum::new(2, ScoreKind::Logits).finish(&ab).unwrap();
    assert_eq!((s.exact_match, s.samples), (None, 0));
}

#[test]
fn labels_bad_input_changes_nothing() {
    let mut acc = LabelAccum::new(2, ScoreKind::Probabilities);
    acc.add(&[0.9, 0.1], &[1, 0]).unwrap();
    assert!(acc.add(&[0.9, 0.1, 0.3], &[1, 0, 1]).is_err()); // not whole samples
    assert!(acc.add(&[0.9, 0.1], &[1]).is_err());
    let err = acc.add(&[0.9, 0.1, 0.5, 0.5], &[1, 0, 0, 3]).unwrap_err();
    assert!(err.to_string().contains("sample 1 label 1"), "{err}");
    assert!(acc.finish(&names(&["a"])).is_err());
    assert!(LabelAccum::new(0, ScoreKind::Logits).add(&[], &[]).is_err());
    let s = acc.finish(&names(&["a", "b"])).unwrap();
    assert_eq!((s.samples, s.exact_match), (1, Some(1.0)));
}

#[test]
fn labels_subsample_past_the_bound() {
    // One label, at most 4 kept: samples 0-4 fill it past the bound -> keep 0, 2, 4 (stride 2);
    // 6 and 8 come in -> 0, 2, 4, 6, 8 -> keep 0, 4, 8 (stride 4); 9 is skipped.
    let mut acc = LabelAccum::with_max_values(1, ScoreKind::Probabilities, 4);
    for i in 0..10 {
        acc.add(&[i as f32 / 10.0], &[(i % 4 == 0) as u8]).unwrap();
    }
    assert_eq!(acc.kept_scores, vec![0.0, 0.4, 0.8]);
    assert_eq!(acc.stride, 4);
    let s = acc.finish(&names(&["a"])).unwrap();
    assert_eq!((s.samples, s.ap_samples), (10, 3));
    // AP over the kept 0.8 +, 0.4 +, 0.0 +: 1. F1 over all ten: truth at 0, 4, 8; predicted 6-9:
    // tp 1 (8), fp 3, fn 2 -> 2 / 7.
    assert_eq!(s.ap[0], Some(1.0));
    assert_close(s.f1[0], 2.0 / 7.0);
    assert!(
        s.summary().contains("(AP over 3 of 10 samples)"),
        "{}",
        s.summary()
    );

    // Many samples in uneven batches: the kept ones are exactly the multiples of the stride.
    let mut acc = LabelAccum::with_max_values(3, ScoreKind::Probabilities, 64);
    let scores: Vec<f32> = (0..3000).map(|i| (i / 3) as f32).collect();
    for chunk in scores.chunks(3 * 37) {
        acc.add(chunk, &vec![0; chunk.len()]).unwrap();
    }
    assert!(acc.kept_truth.len() <= 3 * 21, "{}", acc.kept_truth.len());
    let want: Vec<f32> = (0..1000u64)
        .step_by(acc.stride as usize)
        .flat_map(|i| [i as f32; 3])
        .collect();
    assert_eq!(acc.kept_scores, want);
}

// ---- regression

#[test]
fn regression_by_hand() {
    // area: targets 1 2 3 4, predictions 1 2 3 5 -> errors 0 0 0 1: MAE 1/4, RMSE sqrt(1/4),
    //   mean 2.5, SS_tot 2.25 + 0.25 + 0.25 + 2.25 = 5, SS_res 1, R2 0.8.
    // distractors: targets all 7, predictions 6 7 8 7 -> errors -1 0 1 0: MAE 1/2, RMSE sqrt(1/2),
    //   R2 undefined (constant targets).
    let target = [1.0, 7.0, 2.0, 7.0, 3.0, 7.0, 4.0, 7.0];
    let pred = [1.0, 6.0, 2.0, 7.0, 3.0, 8.0, 5.0, 7.0];
    let mut acc = RegAccum::new(2);
    acc.add(&pred[..2], &target[..2]).unwrap();
    acc.add(&pred[2..], &target[2..]).unwrap();
    let s = acc.finish(&names(&["area", "distractors"])).unwrap();
    assert_close(s.mae[0], 0.25);
    assert_close(s.mae[1], 0.5);
    assert_close(s.rmse[0], 0.5);
    assert_close(s.rmse[1], 0.5f64.sqrt());
    assert_close(s.r2[0], 0.8);
    assert_eq!(s.r2[1], None);
    assert_close(s.mean_mae, 0.375);
    assert_close(s.mean_rmse, (0.5 + 0.5f64.sqrt()) / 2.0);
    assert_close(s.mean_r2, 0.8);
    assert_eq!(s.samples, 4);
    assert_eq!(
        s.summary(),
        "R2 0.800 (area 0.80, distractors -), MAE (area 0.250, distractors 0.500), \
         RMSE (area 0.500, distractors 0.707)"
    );
    // One batch, or two accumulators merged (as ranks would), give the same figures.
    let mut one = RegAccum::new(2);
    one.add(&pred, &target).unwrap();
    let (mut a, mut b) = (RegAccum::new(2), RegAccum::new(2));
    a.add(&pred[..6], &target[..6]).unwrap();
    b.add(&pred[6..], &target[6..]).unwrap();
    a.merge(&b).unwrap();
    a.merge(&RegAccum::new(2)).unwrap();
    for other in [one, a] {
        let o = other.finish(&s.names).unwrap();
        for j in 0..2 {
            assert_close(o.mae[j], s.mae[j].unwrap());
            assert_close(o.rmse[j], s.rmse[j].unwrap());
        }
        assert_close(o.r2[0], 0.8);
        assert_eq!(o.r2[1], None);
    }
    let mut fresh = RegAccum::new(2);
    fresh.merge(&acc).unwrap();
    assert_close(fresh.finish(&s.names).unwrap().r2[0], 0.8);
}

#[test]
fn regression_large_offset_and_perfect() {
    // Targets 1e6 + 1..4 (exact in f32), predictions off by 0 0 0 1: R2 0.8 as above. A
    // one-pass sum of squares loses about 1e-3 of SS_tot = 5 to cancellation against 4e12.
    let target: Vec<f32> = (1..=4).map(|i| 1e6 + i as f32).collect();
    let mut pred = target.clone();
    pred[3] += 1.0;
    let mut acc = RegAccum::new(1);
    for (p, t) in pred.iter().zip(&target) {
        acc.add(&[*p], &[*t]).unwrap();
    }
    let s = acc.finish(&names(&["x"])).unwrap();
    assert!((s.r2[0].unwrap() - 0.8).abs() < 1e-9, "{:?}", s.r2);
    // Perfect predictions: R2 1, errors 0.
    let mut acc = RegAccum::new(1);
    acc.add(&target, &target).unwrap();
    let s = acc.finish(&names(&["x"])).unwrap();
    assert_eq!(
        (s.r2[0], s.mae[0], s.rmse[0]),
        (Some(1.0), Some(0.0), Some(0.0))
    );
}

#[test]
fn regression_empty_and_bad_input() {
    let s = RegAccum::new(2).finish(&names(&["a", "b"])).unwrap();
    assert_eq!(
        (s.mae[0], s.rmse[1], s.r2[0], s.mean_r2),
        (None, None, None, None)
    );
    assert_eq!(
        s.summary(),
        "R2 - (a -, b -), MAE (a -, b -), RMSE (a -, b -)"
    );
    let mut acc = RegAccum::new(2);
    assert!(acc.add(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]).is_err());
    assert!(acc.add(&[1.0, 2.0], &[1.0]).is_err());
    assert!(acc.finish(&names(&["a"])).is_err());
    assert!(acc.merge(&RegAccum::new(3)).is_err());
    assert_eq!(acc, RegAccum::new(2));
}

#[test]
fn summaries_shorten() {
    assert_eq!(sig3(Some(1.23456e-5)), "1.23e-5");
    assert_eq!(sig3(Some(0.0456789)), "0.0457");
    assert_eq!(sig3(Some(123.456)), "123");
    assert_eq!(sig3(Some(4.56e6)), "4.56e6");
    assert_eq!(sig3(Some(0.0)), "0");
    assert_eq!(sig3(None), "-");
    let many: Vec<String> = (0..11).map(|i| format!("c{i}")).collect();
    let list = named_list(&many, (0..11).map(|i| i.to_string()));
    assert_eq!(
        list,
        "(c0 0, c1 1, c2 2, c3 3, c4 4, c5 5, c6 6, c7 7, ... and 3 more)"
    );
}

// ---- scikit-learn's figures for random cases with ties (scripts/scores-sklearn.py writes them)

#[derive(Deserialize)]
struct Case {
    n: usize,
    k: usize,
    scores: Vec<f32>,
    truth: Vec<u8>,
    ap: Vec<Option<f64>>,
    micro_f1: f64,
    macro_f1: f64,
    exact_match: f64,
    pred: Vec<f32>,
    target: Vec<f32>,
    mae: Vec<f64>,
    rmse: Vec<f64>,
    r2: Vec<f64>,
    mask_pred: Vec<u32>,
    mask_truth: Vec<u32>,
    classes: usize,
    dice: Vec<f64>,
    iou: Vec<f64>,
}

#[test]
fn agrees_with_sklearn() {
    let text = include_str!("../../../fixtures/scores/sklearn.json");
    let cases: Vec<Case> = serde_json::from_str(text).unwrap();
    assert!(cases.len() >= 5);
    let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= 1e-9 * b.abs().max(1.0));
    for (i, c) in cases.iter().enumerate() {
        let labels: Vec<String> = (0..c.k).map(|j| format!("l{j}")).collect();
        let mut acc = LabelAccum::new(c.k, ScoreKind::Probabilities);
        acc.add(&c.scores, &c.truth).unwrap();
        let s = acc.finish(&labels).unwrap();
        assert_eq!(s.samples, c.n as u64);
        for j in 0..c.k {
            let ok = match c.ap[j] {
                Some(want) => near(s.ap[j], want),
                None => s.ap[j].is_none(),
            };
            assert!(
                ok,
                "case {i} label {j}: AP {:?}, sklearn {:?}",
                s.ap[j], c.ap[j]
            );
        }
        assert!(
            near(s.micro_f1, c.micro_f1),
            "case {i}: {:?} {}",
            s.micro_f1,
            c.micro_f1
        );
        assert!(
            near(s.macro_f1, c.macro_f1),
            "case {i}: {:?} {}",
            s.macro_f1,
            c.macro_f1
        );
        assert!(near(s.exact_match, c.exact_match), "case {i}");

        let mut reg = RegAccum::new(c.k);
        reg.add(&c.pred, &c.target).unwrap();
        let r = reg.finish(&labels).unwrap();
        for j in 0..c.k {
            assert!(near(r.mae[j], c.mae[j]), "case {i} target {j}");
            assert!(near(r.rmse[j], c.rmse[j]), "case {i} target {j}");
            assert!(
                near(r.r2[j], c.r2[j]),
                "case {i} target {j}: {:?} {}",
                r.r2[j],
                c.r2[j]
            );
        }

        let mut seg = SegCounts::new(c.classes);
        seg.add(&c.mask_pred, &c.mask_truth, None).unwrap();
        let classes: Vec<String> = (0..c.classes).map(|j| format!("c{j}")).collect();
        let g = SegScores::from_counts(seg.counts(), &classes, Some(0)).unwrap();
        for j in 0..c.classes {
            assert!(near(g.dice[j], c.dice[j]), "case {i} class {j}");
            assert!(near(g.iou[j], c.iou[j]), "case {i} class {j}");
        }
    }
}
