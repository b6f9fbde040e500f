use crate::util::*;

#[test]
fn inspect_reports_counts_and_sizes() {
    let t = tempfile::tempdir().unwrap();
    let d = small_dataset(t.path(), &[]);
    let o = run(&["inspect", d.to_str().unwrap(), "--json"], 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["shape"], serde_json::json!([3, 12, 12]));
    assert_eq!(v["dtype"], "u8");
    assert_eq!(v["shards"], 4);
    let train = v["splits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "train")
        .unwrap();
    assert_eq!(train["samples"], 3000);
    let ratio = v["compression_ratio"].as_f64().unwrap();
    assert!(ratio > 1.0 && ratio < 10.0, "{ratio}");
    let mean = v["mean"].as_array().unwrap();
    assert_eq!(mean.len(), 3);
    assert!(mean
        .iter()
        .all(|m| m.as_f64().unwrap() > 0.05 && m.as_f64().unwrap() < 0.95));
    let o = run(&["inspect", d.to_str().unwrap()], 0);
    let s = stdout(&o);
    assert!(
        s.contains("3x12x12 u8, 5 classes") && s.contains("3,000"),
        "{s}"
    );
}

/// The grid has one row per class, and rows of different classes differ far more than samples of a
/// class differ from their own row's average.
#[test]
fn grid_rows_show_distinct_classes() {
    let t = tempfile::tempdir().unwrap();
    let d = small_dataset(t.path(), &[]);
    let png = t.path().join("grid.png");
    run(
        &[
            "inspect",
            d.to_str().unwrap(),
            "--grid",
            png.to_str().unwrap(),
            "--per-class",
            "6",
            "--zoom",
            "1",
        ],
        0,
    );
    let img = image::open(&png).unwrap().to_rgb8();
    // A label column, then 6 cells of 12 px plus 1 px gaps; 5 rows.
    let label = img.width() - (6 * 13 + 1);
    assert!(label > 0 && label < 200, "label column {label} px");
    assert_eq!(img.height(), 5 * 13 + 1);
    let cell = |k: u32, j: u32| -> Vec<f64> {
        let mut v = Vec::new();
        for y in 0..12 {
            for x in 0..12 {
                let p = img.get_pixel(label + 1 + j * 13 + x, 1 + k * 13 + y);
                v.extend(p.0.iter().map(|&c| c as f64));
            }
        }
        v
    };
    // Colour histogram-free check: mean colour per row.
    let row_mean = |k: u32| -> [f64; 3] {
        let mut m = [0.0; 3];
        for j in 0..6 {
            for (i, v) in cell(k, j).iter().enumerate() {
                m[i % 3] += v / (6.0 * 144.0);
            }
        }
        m
    };
    let means: Vec<[f64; 3]> = (0..5).map(row_mean).collect();
    for a in 0..5 {
        for b in a + 1..5 {
            let d: f64 = (0..3).map(|c| (means[a][c] - means[b][c]).abs()).sum();
            assert!(
                d > 10.0,
                "rows {a} and {b} look alike: {:?} {:?}",
                means[a],
                means[b]
            );
        }
    }
}

/// A grey dataset's grid is grey; with a mask its samples carry coloured overlays and a legend
/// names the mask's values below; labels add a caption strip under every sample.
#[test]
fn grid_draws_masks_as_overlays_and_labels_as_captions() {
    let t = tempfile::tempdir().unwrap();
    let grid = |task: &str| {
        let d = t.path().join(task);
        run(
            &[
                "synth",
                "--task",
                task,
                "--train",
                "200",
                "--test",
                "20",
                "--shape",
                "1x16x16",
                "--out",
                d.to_str().unwrap(),
                "--quiet",
            ],
            0,
        );
        let png = t.path().join(format!("{task}.png"));
        run(
            &[
                "inspect",
                d.to_str().unwrap(),
                "--grid",
                png.to_str().unwrap(),
                "--per-class",
                "4",
                "--zoom",
                "2",
            ],
            0,
        );
        image::open(&png).unwrap().to_rgb8()
    };
    let coloured = |img: &image::RgbImage, rows: std::ops::Range<u32>| {
        img.enumerate_pixels()
            .filter(|(_, y, p)| {
                // Neither grey nor the picture's dark blue-grey ground.
                rows.contains(y) && !(p[0] == p[1] && p[1] == p[2]) && p.0 != [40, 40, 48]
            })
            .count()
    };
    let class = grid("class");
    assert_eq!(
        coloured(&class, 0..class.height()),
        0,
        "a grey dataset draws grey"
    );
    let mask = grid("mask");
    // Rows of 16 * 2 px cells and a 1 px gap, then the legend.
    let rows = mask.height() - class.height();
    assert!(rows >= 12, "a legend below the rows: {rows} px");
    let cells = coloured(&mask, 0..class.height());
    assert!(cells > 100, "mask overlays: {cells} coloured pixels");
    assert!(
        coloured(&mask, class.height()..mask.height()) > 0,
        "legend swatches"
    );
    let labels = grid("labels");
    assert!(
        labels.height() > class.height(),
        "a caption strip under each row"
    );
    assert_eq!(coloured(&labels, 0..labels.height()), 0);
}
