use super::*;

fn dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("prep-masks-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The centre of source pixel (sy, sx) in cell (row, col) of the written picture.
fn at(
    img: &RgbImage,
    l: &Layout,
    row: usize,
    col: usize,
    sy: i64,
    sx: i64,
    hw: (i64, i64),
) -> Color {
    let (x, y) = l.cell(row, col);
    let (px, py) = (
        x + (2 * sx + 1) * l.cw / (2 * hw.1),
        y + (2 * sy + 1) * l.ch / (2 * hw.0),
    );
    img.get_pixel(px as u32, py as u32).0
}

#[test]
fn overlays_by_hand() {
    // Sample 0: grey values 0..5 scale to 0, 51, 102, 153, 204, 255. Sample 1 is constant: black.
    let images = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0];
    let truth = [0, 1, 2, 0, 255, 1, 0, 0, 0, 0, 0, 0];
    let pred = [0, 1, 1, 2, 0, 1, 0, 0, 0, 0, 0, 2];
    let classes = names(&["bg", "a", "b"]);
    let g = MaskGrid {
        images: &images,
        truth: &truth,
        pred: &pred,
        shape: [1, 2, 3],
        classes: &classes,
        background: Some(0),
    };
    let d = dir("hand");
    let path = d.join("m.png");
    masks_png(&g, &path).unwrap();
    let img = image::open(&path).unwrap().to_rgb8();
    let l = layout(&g, 2, "2 test samples: image, truth, prediction", true);
    assert_eq!(
        (img.width() as i64, img.height() as i64),
        (l.width, l.height)
    );
    // 2x3 pixels grow by 192 / 3 = 64.
    assert_eq!((l.cw, l.ch), (192, 128));
    let px = |row, col, sy, sx| at(&img, &l, row, col, sy, sx, (2, 3));
    assert_eq!(px(0, 0, 1, 1), [204; 3]);
    assert_eq!(px(0, 0, 0, 0), [0; 3]);
    assert_eq!(px(0, 0, 1, 2), [255; 3]);
    // Truth: background stays the image; class a (red 230 25 75) half over grey 51:
    // 25.5 + 115 = 140.5 -> 141, 25.5 + 12.5 = 38, 25.5 + 37.5 = 63; the unnamed 255 is white
    // half over 204: 102 + 127.5 = 229.5 -> 230.
    assert_eq!(px(0, 1, 0, 0), [0; 3]);
    assert_eq!(px(0, 1, 0, 1), [141, 38, 63]);
    assert_eq!(px(0, 1, 1, 1), [230; 3]);
    // Prediction: class b (green 60 180 75) half over 153: 106.5 -> 107, 166.5 -> 167, 114.
    assert_eq!(px(0, 2, 1, 0), [107, 167, 114]);
    assert_eq!(px(0, 2, 1, 1), [204; 3]);
    // The constant sample is black under its overlays.
    assert_eq!(px(1, 0, 0, 0), [0; 3]);
    assert_eq!(px(1, 2, 1, 2), over([0; 3], class_color(2), ALPHA));
    // The legend names the foreground classes and, since 255 occurs, "unnamed".
    let legend: Vec<String> = l.legend.concat().into_iter().map(|e| e.1).collect();
    assert_eq!(legend, ["a", "b", "unnamed"]);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn row_dice_by_hand() {
    let classes = names(&["bg", "a", "b"]);
    let mut g = MaskGrid {
        images: &[],
        truth: &[],
        pred: &[],
        shape: [1, 2, 3],
        classes: &classes,
        background: Some(0),
    };
    // (truth, pred): (0,0) tp0; (1,1) tp1; (2,1) fp1 fn2; (0,2) fp2 fn0; (255,0) skipped;
    // (1,1) tp1. Dice a = 4 / (4 + 1) = 0.8, b = 0 / (0 + 1 + 1) = 0: mean 0.4.
    let (t, p) = ([0, 1, 2, 0, 255, 1], [0, 1, 1, 2, 0, 1]);
    assert!((row_dice(&t, &p, &g).unwrap() - 0.4).abs() < 1e-12);
    // Only background: nothing to average.
    assert_eq!(row_dice(&[0, 0], &[0, 0], &g), None);
    // Without a background class 0 counts too: (1 + 0.8 + 0) / 3 with bg tp 1, fn 1 -> 2/3.
    g.background = None;
    let want = (2.0 / 3.0 + 0.8 + 0.0) / 3.0;
    assert!((row_dice(&t, &p, &g).unwrap() - want).abs() < 1e-12);
}

#[test]
fn rgb_and_odd_channels() {
    // One RGB pixel 0, 0.5, 1 scaled together: 0, 127.5 -> 128, 255.
    assert_eq!(to_rgb(&[0.0, 0.5, 1.0], 3, 1), vec![[0, 128, 255]]);
    // Two channels: the first in grey; NaN black, infinities ignored by the scaling.
    let got = to_rgb(
        &[1.0, f32::NAN, 3.0, f32::INFINITY, 9.0, 9.0, 9.0, 9.0],
        2,
        4,
    );
    assert_eq!(got, vec![[0; 3], [0; 3], [255; 3], [0; 3]]);
    assert_eq!(to_rgb(&[f32::NAN; 2], 1, 2), vec![[0; 3]; 2]);
}

#[test]
fn sizes_stay_bounded() {
    let d = dir("sizes");
    let classes: Vec<String> = (0..300).map(|i| format!("a_long_class_name_{i}")).collect();
    for (n, [c, h, w]) in [
        (20, [1, 300, 200]),
        (1, [1, 1, 1]),
        (3, [3, 1, 5000]),
        (2, [4, 7, 5]),
    ] {
        let plane = h * w;
        let images: Vec<f32> = (0..n * c * plane).map(|i| (i % 97) as f32).collect();
        let truth: Vec<u32> = (0..n * plane).map(|i| (i % 301) as u32).collect();
        let pred: Vec<u32> = (0..n * plane).map(|i| (i % 7) as u32).collect();
        let g = MaskGrid {
            images: &images,
            truth: &truth,
            pred: &pred,
            shape: [c, h, w],
            classes: &classes,
            background: Some(0),
        };
        let path = d.join(format!("g{n}-{h}x{w}.png"));
        masks_png(&g, &path).unwrap();
        let img = image::open(&path).unwrap();
        let ok = |v: u32| (100..=2100).contains(&v);
        assert!(
            ok(img.width()) && ok(img.height()),
            "{n} {h}x{w}: {}x{}",
            img.width(),
            img.height()
        );
    }
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn bad_shapes_name_the_path() {
    let d = dir("bad");
    let classes = names(&["bg", "a"]);
    let g = MaskGrid {
        images: &[0.0; 12],
        truth: &[0; 6],
        pred: &[0; 6],
        shape: [1, 2, 3],
        classes: &classes,
        background: Some(0),
    };
    let cases = [
        MaskGrid {
            truth: &[0; 5],
            ..g
        },
        MaskGrid {
            pred: &[0; 12],
            ..g
        },
        MaskGrid {
            images: &[0.0; 7],
            ..g
        },
        MaskGrid {
            images: &[],
            truth: &[],
            pred: &[],
            ..g
        },
        MaskGrid {
            shape: [1, 0, 3],
            ..g
        },
        MaskGrid {
            shape: [0, 2, 3],
            ..g
        },
    ];
    for (i, bad) in cases.iter().enumerate() {
        let err = masks_png(bad, &d.join("bad.png")).unwrap_err();
        assert!(err.to_string().contains("bad.png"), "case {i}: {err}");
    }
    assert!(!d.join("bad.png").exists());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn every_label_has_a_glyph() {
    let unknown = crate::util::font::glyph('\u{1}');
    let text =
        "first 12 of 100 test samples: image, truth, prediction sample 3: mean Dice 0.912 - \
                unnamed +7 more";
    assert!(text.chars().all(|c| crate::util::font::glyph(c) != unknown));
}
