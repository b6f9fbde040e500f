//! Masks beside a tree's images (`--masks DIR`, or `images/` beside `masks/` or `labels/`):
//! converted masks equal their source pixel for pixel, or after `--size` equal `fit_mask` of it;
//! palette PNGs give indices, 16-bit masks a u16 field; every bad pairing is a reject naming the
//! file, or under `--on-error fail` an error with nothing written.

use crate::util::{run, stderr, stdout};
use prep::format::fields::FieldKind;
use prep::format::shard::{Dataset, Dtype};
use prep::source::transform::{fit_mask, Fit, Target};
use std::path::{Path, PathBuf};

/// One sample read back: its split, pixels, class and each field's bytes.
pub struct Sample {
    pub split: String,
    pub px: Vec<u8>,
    pub class: u32,
    pub fields: Vec<Vec<u8>>,
}

/// Every sample of a dataset in split order (splits by name, then file order).
pub fn read_all(ds: &Path) -> (Vec<Sample>, Dataset) {
    let d = Dataset::open(ds).unwrap();
    let mut out = Vec::new();
    for (split, sh) in d.shards() {
        let r = d.open_shard(sh).unwrap();
        for b in 0..r.num_blocks() {
            let blk = r.read_block(b).unwrap();
            for i in 0..blk.len() {
                out.push(Sample {
                    split: split.to_string(),
                    px: blk.sample(i).to_vec(),
                    class: blk.label(i),
                    fields: (0..d.manifest.fields.0.len())
                        .map(|f| blk.field(&d.manifest.fields, f, i).to_vec())
                        .collect(),
                });
            }
        }
    }
    (out, d)
}

pub fn convert(input: &Path, out: &Path, extra: &[&str], code: i32) -> std::process::Output {
    let mut args = vec![
        "convert",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run(&args, code)
}

/// The rejects report: (path, reason).
pub fn rejects(out: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(out.join("rejects.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["path"].as_str().unwrap().to_string(),
                v["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The report's notes (`--json`).
fn notes(o: &std::process::Output) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(&stdout(o)).unwrap();
    v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

fn dir_of(p: &Path) -> &Path {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    p
}

/// An image `w` x `h` whose pixels depend on `seed`: grey or colour, saved in the format of
/// its extension.
pub fn image(p: &Path, w: u32, h: u32, seed: u32, colour: bool) {
    let v = |x: u32, y: u32, c: u32| ((x * 37 + y * 11 + c * 71 + seed * 13) % 256) as u8;
    if colour {
        image::RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([v(x, y, 0), v(x, y, 1), v(x, y, 2)])
        })
        .save(dir_of(p))
        .unwrap();
    } else {
        image::GrayImage::from_fn(w, h, |x, y| image::Luma([v(x, y, 0)]))
            .save(dir_of(p))
            .unwrap();
    }
}

/// A mask of `k` values, `w` x `h`, depending on `seed`.
pub fn mask_values(w: u32, h: u32, seed: u32, k: u32) -> Vec<u8> {
    (0..w * h)
        .map(|i| ((i / 3 + seed * 5 + i % w) % k) as u8)
        .collect()
}

/// A PNG through the `png` crate: `palette` makes it indexed, `bits` deep; `data` packed rows.
pub fn png_raw(p: &Path, w: u32, h: u32, ct: png::ColorType, bits: png::BitDepth, data: &[u8]) {
    let f = std::fs::File::create(dir_of(p)).unwrap();
    let mut e = png::Encoder::new(std::io::BufWriter::new(f), w, h);
    e.set_color(ct);
    e.set_depth(bits);
    if ct == png::ColorType::Indexed {
        // Colours unlike their indices: only the indices must come back.
        let pal: Vec<u8> = (0..16u8).flat_map(|i| [255 - i * 9, i * 13, 7]).collect();
        e.set_palette(pal);
    }
    let mut wr = e.write_header().unwrap();
    wr.write_image_data(data).unwrap();
}

/// `values` (each below 16) as an indexed PNG of 4 bits a pixel, rows packed high nibble first.
pub fn palette_png4(p: &Path, w: u32, h: u32, values: &[u8]) {
    let mut data = Vec::new();
    for row in values.chunks(w as usize) {
        for pair in row.chunks(2) {
            data.push(pair[0] << 4 | pair.get(1).copied().unwrap_or(0));
        }
    }
    png_raw(p, w, h, png::ColorType::Indexed, png::BitDepth::Four, &data);
}

pub fn grey_png(p: &Path, w: u32, h: u32, values: &[u8]) {
    image::GrayImage::from_raw(w, h, values.to_vec())
        .unwrap()
        .save(dir_of(p))
        .unwrap();
}

fn grey_png16(p: &Path, w: u32, h: u32, values: &[u16]) {
    let be: Vec<u8> = values.iter().flat_map(|v| v.to_be_bytes()).collect();
    png_raw(
        p,
        w,
        h,
        png::ColorType::Grayscale,
        png::BitDepth::Sixteen,
        &be,
    );
}

/// A TIFF of `pages` grey 8-bit pages.
fn tiff_pages(p: &Path, w: u32, h: u32, pages: &[Vec<u8>]) {
    let f = std::fs::File::create(dir_of(p)).unwrap();
    let mut e = tiff::encoder::TiffEncoder::new(f).unwrap();
    for page in pages {
        e.write_image::<tiff::encoder::colortype::Gray8>(w, h, page)
            .unwrap();
    }
}

const W: u32 = 13;
const H: u32 = 7;

#[test]
fn masks_beside_images_come_back_pixel_exact() {
    let t = tempfile::tempdir().unwrap();
    let (input, masks, out) = (
        t.path().join("in"),
        t.path().join("m"),
        t.path().join("out"),
    );
    // Grey and colour, JPEG and PNG, odd sizes; masks as palette, grey and TIFF, and one all
    // background; the mask's extension differs from its image's.
    let files = [
        ("cat/a.png", false, "cat/a.png"),
        ("cat/b.jpg", true, "cat/b.png"),
        ("dog/c.png", true, "dog/c.tif"),
        ("dog/d.jpg", false, "dog/d.png"),
        ("dog/e.png", false, "dog/e.png"),
    ];
    let mut want = Vec::new();
    for (i, (img, colour, m)) in files.iter().enumerate() {
        image(&input.join(img), W, H, i as u32, *colour);
        let v = if i == 4 {
            vec![0; (W * H) as usize]
        } else {
            mask_values(W, H, i as u32, 5)
        };
        match i {
            0 | 3 => palette_png4(&masks.join(m), W, H, &v),
            2 => tiff_pages(&masks.join(m), W, H, std::slice::from_ref(&v)),
            _ => grey_png(&masks.join(m), W, H, &v),
        }
        want.push(v);
    }
    let o = convert(
        &input,
        &out,
        &[
            "--masks",
            masks.to_str().unwrap(),
            "--test-fraction",
            "0",
            "--json",
        ],
        0,
    );
    assert!(
        notes(&o)
            .iter()
            .any(|n| n.contains("masks: from") && n.contains("5 pairs")),
        "{:?}",
        notes(&o)
    );
    let (samples, ds) = read_all(&out);
    let f = &ds.manifest.fields.0[0];
    assert_eq!((f.kind, f.dtype), (FieldKind::Mask, Dtype::U8));
    assert_eq!(f.shape, vec![H, W]);
    assert_eq!(f.names, ["0", "1", "2", "3", "4"]);
    assert_eq!(ds.manifest.classes, ["cat", "dog"]);
    assert_eq!(ds.manifest.sample.shape.0, vec![3, H, W]);
    assert_eq!(samples.len(), 5);
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(s.fields[0], want[i], "{}", files[i].0);
        assert_eq!(s.class, u32::from(i >= 2));
    }
    assert!(rejects(&out).is_empty());
    // prep verify reads every block, the mask values against their names.
    run(&["verify", out.to_str().unwrap()], 0);
}

#[test]
fn masks_follow_their_images_through_every_fit() {
    let t = tempfile::tempdir().unwrap();
    let (input, masks) = (t.path().join("in"), t.path().join("m"));
    // Two sizes, so both are resized: 7x13 and 11x8 (height x width).
    let sizes = [(W, H), (8, 11)];
    let mut src = Vec::new();
    for (i, &(w, h)) in sizes.iter().enumerate() {
        image(&input.join(format!("{i}.png")), w, h, i as u32, false);
        let v = mask_values(w, h, i as u32, 4);
        grey_png(&masks.join(format!("{i}.png")), w, h, &v);
        src.push((w, h, v));
    }
    for (fit, name) in [
        (Fit::Crop, "crop"),
        (Fit::Stretch, "stretch"),
        (Fit::Pad, "pad"),
    ] {
        let out = t.path().join(format!("out-{name}"));
        convert(
            &input,
            &out,
            &[
                "--masks",
                masks.to_str().unwrap(),
                "--size",
                "6x9",
                "--fit",
                name,
                "--test-fraction",
                "0",
                "--quiet",
            ],
            0,
        );
        let (samples, ds) = read_all(&out);
        assert_eq!(ds.manifest.fields.0[0].shape, vec![6, 9]);
        let target = Target {
            channels: 1,
            height: 6,
            width: 9,
            dtype: Dtype::U8,
            fit,
        };
        for (i, (w, h, v)) in src.iter().enumerate() {
            assert_eq!(
                samples[i].fields[0],
                fit_mask(v, *w, *h, &target),
                "{name} {i}"
            );
        }
    }
}

#[test]
fn palette_indices_and_16_bit_masks() {
    let t = tempfile::tempdir().unwrap();
    let (input, masks, out) = (
        t.path().join("in"),
        t.path().join("m"),
        t.path().join("out"),
    );
    // One 16-bit mask makes the field u16; an 8-bit one beside it is widened.
    let big: Vec<u16> = (0..W * H).map(|i| (i * 17 % 1001) as u16).collect();
    let mut big_max = big.clone();
    big_max[5] = 1000;
    image(&input.join("a.png"), W, H, 1, false);
    grey_png16(&masks.join("a.png"), W, H, &big_max);
    image(&input.join("b.png"), W, H, 2, false);
    let small = mask_values(W, H, 2, 9);
    palette_png4(&masks.join("b.png"), W, H, &small);
    convert(
        &input,
        &out,
        &[
            "--masks",
            masks.to_str().unwrap(),
            "--test-fraction",
            "0",
            "--quiet",
        ],
        0,
    );
    let (samples, ds) = read_all(&out);
    let f = &ds.manifest.fields.0[0];
    assert_eq!(f.dtype, Dtype::U16);
    assert_eq!(f.names.len(), 1001);
    let le = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    assert_eq!(samples[0].fields[0], le(&big_max));
    let widened: Vec<u16> = small.iter().map(|&x| x as u16).collect();
    assert_eq!(samples[1].fields[0], le(&widened));
    // The summaries count every value seen, cut to the names.
    let counts = &ds.manifest.splits["train"].fields[0].counts;
    assert_eq!(counts.len(), 1001);
    assert_eq!(counts.iter().sum::<u64>(), 2 * (W * H) as u64);
}

#[test]
fn mask_names_name_the_values() {
    let t = tempfile::tempdir().unwrap();
    let (input, masks, out) = (
        t.path().join("in"),
        t.path().join("m"),
        t.path().join("out"),
    );
    image(&input.join("a.png"), W, H, 1, true);
    grey_png(&masks.join("a.png"), W, H, &vec![1; (W * H) as usize]);
    convert(
        &input,
        &out,
        &[
            "--masks",
            masks.to_str().unwrap(),
            "--mask-names",
            "background,road,car",
            "--quiet",
        ],
        0,
    );
    let (_, ds) = read_all(&out);
    assert_eq!(ds.manifest.fields.0[0].names, ["background", "road", "car"]);
}

#[test]
fn images_beside_masks_or_labels_with_split_folders() {
    let t = tempfile::tempdir().unwrap();
    for (masks_name, classes) in [("masks", false), ("labels", true)] {
        let ds = t.path().join(format!("DS-{masks_name}"));
        let out = t.path().join(format!("out-{masks_name}"));
        let mut want = Vec::new();
        for (i, rel) in ["train/a", "train/b", "val/c"].iter().enumerate() {
            let rel = if classes {
                let (split, name) = rel.split_once('/').unwrap();
                format!("{split}/k{}/{name}", i % 2)
            } else {
                rel.to_string()
            };
            image(&ds.join(format!("images/{rel}.jpg")), W, H, i as u32, true);
            let v = mask_values(W, H, i as u32, 3);
            grey_png(&ds.join(format!("{masks_name}/{rel}.png")), W, H, &v);
            want.push((rel, v));
        }
        // A mask without its image, and a file beside the two folders.
        grey_png(
            &ds.join(format!("{masks_name}/train/zz.png")),
            W,
            H,
            &[0; (W * H) as usize],
        );
        std::fs::write(ds.join("README.md"), "a dataset").unwrap();
        let o = convert(&ds, &out, &["--json"], 0);
        let n = notes(&o);
        assert!(
            n.iter().any(
                |x| x.contains(&format!("laid out as images/ beside {masks_name}/"))
                    && x.contains("3 pairs")
                    && x.contains("not read: README.md")
            ),
            "{n:?}"
        );
        let (samples, d) = read_all(&out);
        assert_eq!(d.manifest.splits["train"].samples, 2);
        assert_eq!(d.manifest.splits["test"].samples, 1);
        if classes {
            assert_eq!(d.manifest.classes, ["k0", "k1"]);
        } else {
            // Images directly in their split folders: one class, named after the dataset.
            assert_eq!(d.manifest.classes, [format!("DS-{masks_name}")]);
        }
        // Splits by name: test (val/c) first, then train.
        let order = [2, 0, 1];
        for (s, &i) in samples.iter().zip(&order) {
            assert_eq!(s.fields[0], want[i].1, "{}", want[i].0);
        }
        assert_eq!(samples[0].split, "test");
        let r = rejects(&out);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].0, format!("{masks_name}/train/zz.png"));
        assert!(r[0].1.contains("a mask without an image"), "{r:?}");
    }
}

/// A folder of two images with masks, one of them bad as `spoil` makes it: under skip it is
/// rejected with `reason`, under fail the run stops naming it, writing nothing.
fn bad_pair(name: &str, spoil: impl Fn(&Path, &Path), extra: &[&str], file: &str, reason: &str) {
    let t = tempfile::tempdir().unwrap();
    let (input, masks) = (t.path().join("in"), t.path().join("m"));
    for i in 0..2 {
        image(&input.join(format!("{i}.png")), W, H, i, false);
        grey_png(
            &masks.join(format!("{i}.png")),
            W,
            H,
            &mask_values(W, H, i, 3),
        );
    }
    spoil(&input, &masks);
    let m = masks.to_str().unwrap();
    let out = t.path().join("skip");
    let mut args = vec!["--masks", m, "--quiet"];
    args.extend_from_slice(extra);
    convert(&input, &out, &args, 0);
    let r = rejects(&out);
    assert!(
        r.iter().any(|(p, why)| p == file && why.contains(reason)),
        "{name}: {r:?}"
    );
    let out = t.path().join("fail");
    args.extend_from_slice(&["--on-error", "fail"]);
    let o = convert(&input, &out, &args, 1);
    let e = stderr(&o);
    assert!(e.contains(file) && e.contains(reason), "{name}: {e}");
    assert!(!out.exists(), "{name}: {out:?} left behind");
}

#[test]
fn bad_pairs_are_rejected_naming_the_file() {
    bad_pair(
        "size",
        |_, m| grey_png(&m.join("1.png"), 30, 20, &vec![0; 600]),
        &[],
        "1.png",
        "is 20x30, its image 7x13",
    );
    bad_pair(
        "no mask",
        |_, m| std::fs::remove_file(m.join("1.png")).unwrap(),
        &[],
        "1.png",
        "no mask",
    );
    bad_pair(
        "beyond names",
        |_, m| grey_png(&m.join("1.png"), W, H, &vec![7; (W * H) as usize]),
        &["--mask-names", "a,b,c"],
        "1.png",
        "holds value 7, beyond its 3 names",
    );
    bad_pair(
        "colour",
        |_, m| {
            image::RgbImage::from_pixel(W, H, image::Rgb([200, 0, 0]))
                .save(m.join("1.png"))
                .unwrap()
        },
        &[],
        "1.png",
        "mask is colour",
    );
    bad_pair(
        "two masks",
        |_, m| grey_png(&m.join("1.bmp"), W, H, &vec![0; (W * H) as usize]),
        &[],
        "1.png",
        "2 masks pair with it",
    );
    bad_pair(
        "stack without as many masks",
        |i, m| {
            std::fs::remove_file(i.join("1.png")).unwrap();
            std::fs::remove_file(m.join("1.png")).unwrap();
            let page = vec![9u8; (W * H) as usize];
            tiff_pages(&i.join("1.tif"), W, H, &[page.clone(), page.clone(), page]);
            tiff_pages(&m.join("1.tif"), W, H, &[vec![1; (W * H) as usize]]);
        },
        &[],
        "1.tif",
        "has 1 frame, its image at least 2",
    );
    bad_pair(
        "undecodable mask",
        |_, m| std::fs::write(m.join("1.png"), b"\x89PNG\r\n\x1a\nnot really").unwrap(),
        &[],
        "1.png",
        "cannot decode",
    );
}

#[test]
fn a_stack_of_masks_follows_a_stack_of_images() {
    let t = tempfile::tempdir().unwrap();
    let (input, masks, out) = (
        t.path().join("in"),
        t.path().join("m"),
        t.path().join("out"),
    );
    let pages: Vec<Vec<u8>> = (0..3).map(|k| mask_values(W, H, k, 4)).collect();
    tiff_pages(&input.join("s.tif"), W, H, &pages);
    tiff_pages(&masks.join("s.tiff"), W, H, &pages);
    convert(
        &input,
        &out,
        &[
            "--masks",
            masks.to_str().unwrap(),
            "--test-fraction",
            "0",
            "--quiet",
        ],
        0,
    );
    let (samples, _) = read_all(&out);
    assert_eq!(samples.len(), 3);
    for (s, p) in samples.iter().zip(&pages) {
        assert_eq!(&s.fields[0], p);
        assert_eq!(&s.px, p);
    }
}

#[test]
fn masks_are_refused_where_they_cannot_go() {
    let t = tempfile::tempdir().unwrap();
    let (input, masks) = (t.path().join("in"), t.path().join("m"));
    image(&input.join("a.png"), W, H, 0, false);
    grey_png(&masks.join("a.png"), W, H, &mask_values(W, H, 0, 3));
    let m = masks.to_str().unwrap();
    let out: PathBuf = t.path().join("out");
    for (extra, says) in [
        (&["--format", "colmajor"][..], "column-major"),
        (&["--part", "0/2"], "need --mask-names"),
        (&["--mask-names", "a,a"], "named twice"),
    ] {
        let mut args = vec!["--masks", m];
        args.extend_from_slice(extra);
        let o = convert(&input, &out, &args, 2);
        assert!(stderr(&o).contains(says), "{extra:?}: {}", stderr(&o));
        assert!(!out.exists());
    }
    let o = convert(&input, &out, &["--mask-names", "a,b"], 2);
    assert!(stderr(&o).contains("has no masks"), "{}", stderr(&o));
    let o = convert(&input, &out, &["--masks", "/no/such/folder"], 2);
    assert!(stderr(&o).contains("not a folder"), "{}", stderr(&o));
}
