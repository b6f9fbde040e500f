//! `prep convert` on array datasets and image folders, made inside the tests.

use crate::util::*;
use image::{DynamicImage, GrayImage, ImageBuffer, Luma, Rgb, RgbImage, Rgba, RgbaImage};
use prep::format::shard::Dataset;
use std::io::Write;
use std::path::Path;

/// Every (pixels, label) of a split, in order.
fn samples(d: &Path, split: &str) -> Vec<(Vec<u8>, u32)> {
    let ds = Dataset::open(d).unwrap();
    let mut out = Vec::new();
    for info in &ds.manifest.splits[split].shards {
        let r = ds.open_shard(info).unwrap();
        for b in 0..r.num_blocks() {
            let block = r.read_block(b).unwrap();
            for i in 0..block.len() {
                out.push((block.sample(i).to_vec(), block.label(i)));
            }
        }
    }
    out
}

fn write_idx(path: &Path, dims: &[u32], data: &[u8], gz: bool) {
    let mut bytes = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    if gz {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&bytes).unwrap();
        bytes = e.finish().unwrap();
    }
    std::fs::write(path, bytes).unwrap();
}

fn pseudo(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 24) as u8)
        .collect()
}

#[test]
fn idx_converts_pixel_exact_and_colmajor_matches() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("mnist");
    std::fs::create_dir(&src).unwrap();
    let (ntr, nte) = (600, 100);
    let tr_px = pseudo(ntr * 28 * 28, 1);
    let tr_lb: Vec<u8> = (0..ntr).map(|i| (i * 7 % 10) as u8).collect();
    let te_px = pseudo(nte * 28 * 28, 2);
    let te_lb: Vec<u8> = (0..nte).map(|i| (i % 10) as u8).collect();
    write_idx(
        &src.join("train-images-idx3-ubyte.gz"),
        &[ntr as u32, 28, 28],
        &tr_px,
        true,
    );
    write_idx(
        &src.join("train-labels-idx1-ubyte.gz"),
        &[ntr as u32],
        &tr_lb,
        true,
    );
    write_idx(
        &src.join("t10k-images-idx3-ubyte"),
        &[nte as u32, 28, 28],
        &te_px,
        false,
    );
    write_idx(
        &src.join("t10k-labels-idx1-ubyte"),
        &[nte as u32],
        &te_lb,
        false,
    );
    let out = t.path().join("out");
    run(
        &[
            "convert",
            src.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    let m = Dataset::open(&out).unwrap().manifest;
    assert_eq!(m.sample.shape.0, vec![1, 28, 28]);
    assert_eq!(m.classes.len(), 10);
    assert_eq!(m.splits["train"].class_counts, vec![60; 10]);
    for (split, px, lb) in [("train", &tr_px, &tr_lb), ("test", &te_px, &te_lb)] {
        let s = samples(&out, split);
        assert_eq!(s.len(), lb.len());
        for (i, (p, l)) in s.iter().enumerate() {
            assert_eq!(&p[..], &px[i * 784..(i + 1) * 784], "{split} sample {i}");
            assert_eq!(*l, lb[i] as u32);
        }
    }
    let cm = t.path().join("cm");
    run(
        &[
            "convert",
            src.to_str().unwrap(),
            "--out",
            cm.to_str().unwrap(),
            "--format",
            "colmajor",
            "--quiet",
        ],
        0,
    );
    let images = std::fs::read(cm.join("images_train.bin")).unwrap();
    let labels = std::fs::read(cm.join("labels_train.bin")).unwrap();
    assert_eq!(images.len(), ntr * 784 * 4);
    for i in (0..ntr).step_by(37) {
        for f in (0..784).step_by(13) {
            let o = (f * ntr + i) * 4;
            let v = f32::from_le_bytes(images[o..o + 4].try_into().unwrap());
            assert_eq!(v, tr_px[i * 784 + f] as f32 / 255.0);
        }
        assert_eq!(
            i32::from_le_bytes(labels[i * 4..i * 4 + 4].try_into().unwrap()),
            tr_lb[i] as i32
        );
    }
    // A truncated IDX file stops the run with its name; the output folder is left as it was.
    let bad = t.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, bad.join(f.file_name().unwrap())).unwrap();
    }
    let p = bad.join("t10k-images-idx3-ubyte");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 100]).unwrap();
    let out2 = t.path().join("out2");
    let o = run(
        &[
            "convert",
            bad.to_str().unwrap(),
            "--out",
            out2.to_str().unwrap(),
            "--quiet",
        ],
        1,
    );
    assert!(
        stderr(&o).contains("t10k-images-idx3-ubyte") && stderr(&o).contains("bytes"),
        "{}",
        stderr(&o)
    );
    // The output folder the run created is removed again.
    assert!(!out2.exists(), "nothing may be left behind");
}

#[test]
fn cifar10_batches_convert() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("cifar-10-batches-bin");
    std::fs::create_dir(&src).unwrap();
    let mut all = Vec::new();
    for b in 1..=2 {
        let mut bytes = Vec::new();
        for i in 0..50u32 {
            let label = ((i + b) % 10) as u8;
            let px = pseudo(3072, i + 100 * b);
            bytes.push(label);
            bytes.extend_from_slice(&px);
            all.push((px, label as u32));
        }
        std::fs::write(src.join(format!("data_batch_{b}.bin")), bytes).unwrap();
    }
    std::fs::write(
        src.join("test_batch.bin"),
        [&[3u8][..], &pseudo(3072, 9)].concat(),
    )
    .unwrap();
    std::fs::write(
        src.join("batches.meta.txt"),
        "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n",
    )
    .unwrap();
    let out = t.path().join("out");
    run(
        &[
            "convert",
            t.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    let m = Dataset::open(&out).unwrap().manifest;
    assert_eq!(m.classes[3], "cat");
    assert_eq!(m.sample.shape.0, vec![3, 32, 32]);
    assert_eq!(
        samples(&out, "train"),
        all.iter().map(|(p, l)| (p.clone(), *l)).collect::<Vec<_>>()
    );
    assert_eq!(samples(&out, "test")[0].1, 3);
}

#[test]
fn npy_hwc_arrays_convert_to_planar() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("np");
    std::fs::create_dir(&src).unwrap();
    let (n, h, w) = (20, 4, 5);
    let px = pseudo(n * h * w * 3, 5);
    write_npy(&src.join("x_train.npy"), "|u1", &[n, h, w, 3], &px);
    let labels: Vec<u8> = (0..n as i64).flat_map(|i| (i % 4).to_le_bytes()).collect();
    write_npy(&src.join("y_train.npy"), "<i8", &[n], &labels);
    let out = t.path().join("out");
    run(
        &[
            "convert",
            src.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
        0,
    );
    let s = samples(&out, "train");
    assert_eq!(s.len(), n);
    // Sample 3, channel 2, pixel (y=1, x=2): HWC index ((1*5)+2)*3+2; planar index 2*20 + 1*5 + 2.
    assert_eq!(s[3].0[2 * 20 + 5 + 2], px[3 * 60 + (5 + 2) * 3 + 2]);
    assert_eq!(s[3].1, 3);
}

/// A folder of mixed formats, modes, depths and sizes, with corrupt and non-image files.
fn mixed_folder(root: &Path) -> usize {
    let cats = root.join("cats");
    let dogs = root.join("dogs");
    std::fs::create_dir_all(&cats).unwrap();
    std::fs::create_dir_all(&dogs).unwrap();
    let rgb = RgbImage::from_fn(40, 30, |x, y| Rgb([x as u8 * 6, y as u8 * 8, 100]));
    rgb.save(cats.join("a.png")).unwrap();
    rgb.save(cats.join("b.jpg")).unwrap();
    rgb.save(cats.join("c.bmp")).unwrap();
    DynamicImage::ImageRgb8(rgb.clone())
        .save(cats.join("d.gif"))
        .unwrap();
    DynamicImage::ImageRgba8(RgbaImage::from_pixel(16, 16, Rgba([200, 10, 10, 128])))
        .save(cats.join("e.webp"))
        .unwrap();
    GrayImage::from_pixel(64, 64, Luma([77]))
        .save(dogs.join("grey8.png"))
        .unwrap();
    ImageBuffer::<Luma<u16>, Vec<u16>>::from_pixel(20, 10, Luma([40000]))
        .save(dogs.join("grey16.png"))
        .unwrap();
    ImageBuffer::<Rgb<u16>, Vec<u16>>::from_pixel(8, 8, Rgb([1000, 2000, 65535]))
        .save(dogs.join("rgb16.tif"))
        .unwrap();
    // A 3-page TIFF stack.
    {
        let f = std::fs::File::create(dogs.join("stack.tiff")).unwrap();
        let mut enc = tiff::encoder::TiffEncoder::new(f).unwrap();
        for p in 0..3u8 {
            enc.write_image::<tiff::encoder::colortype::Gray8>(12, 12, &vec![p * 50; 144])
                .unwrap();
        }
    }
    // Bad ones: truncated PNG, zero bytes, text named .jpg, absurd dimensions, a stray text file.
    let png = std::fs::read(cats.join("a.png")).unwrap();
    std::fs::write(cats.join("truncated.png"), &png[..png.len() / 2]).unwrap();
    std::fs::write(cats.join("empty.jpg"), b"").unwrap();
    std::fs::write(dogs.join("notes.jpg"), b"this is not a jpeg").unwrap();
    let mut huge = png.clone();
    huge[16..20].copy_from_slice(&100_000u32.to_be_bytes()); // IHDR width
    std::fs::write(dogs.join("huge.png"), huge).unwrap();
    std::fs::write(dogs.join("README.txt"), b"hello").unwrap();
    5 // bad files
}

#[test]
fn image_folder_counts_labels_and_rejects() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("in");
    let bad = mixed_folder(&src);
    let out = t.path().join("out");
    let o = run(
        &[
            "convert",
            src.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--size",
            "16x16",
            "--channels",
            "3",
            "--test-fraction",
            "0",
            "--json",
        ],
        0,
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        r["rejects"].as_array().unwrap().len(),
        bad,
        "{}",
        r["rejects"]
    );
    let m = Dataset::open(&out).unwrap().manifest;
    assert_eq!(m.classes, vec!["cats", "dogs"]);
    assert_eq!(m.sample.shape.0, vec![3, 16, 16]);
    // cats: png, jpg, bmp, gif, webp = 5; dogs: grey8, grey16, rgb16.tif, 3 TIFF pages = 6.
    assert_eq!(m.splits["train"].class_counts, vec![5, 6]);
    let rejects = std::fs::read_to_string(out.join("rejects.jsonl")).unwrap();
    for name in [
        "cats/truncated.png",
        "cats/empty.jpg",
        "dogs/notes.jpg",
        "dogs/huge.png",
        "dogs/README.txt",
    ] {
        assert!(
            rejects.contains(name),
            "{name} missing from rejects:\n{rejects}"
        );
    }
    assert!(rejects
        .lines()
        .all(
            |l| serde_json::from_str::<serde_json::Value>(l).unwrap()["reason"]
                .as_str()
                .unwrap()
                .len()
                > 5
        ));
    // Sample order: cats' files by name, then dogs' (grey16.png is dogs' first good file).
    // The grey 16-bit PNG (40000) becomes 40000/257 = 155.6 in u8; kept exactly with --dtype u16.
    let s = samples(&out, "train");
    assert!((155..=156).contains(&s[5].0[0]), "{}", s[5].0[0]);
    assert_eq!(s[6].0[0], 77);
    let out16 = t.path().join("out16");
    run(
        &[
            "convert",
            src.to_str().unwrap(),
            "--out",
            out16.to_str().unwrap(),
            "--size",
            "16x16",
            "--channels",
            "1",
            "--dtype",
            "u16",
            "--test-fraction",
            "0",
            "--quiet",
        ],
        0,
    );
    let s = samples(&out16, "train");
    assert_eq!(u16::from_le_bytes([s[5].0[0], s[5].0[1]]), 40000);
    run(&["verify", out16.to_str().unwrap()], 0);

    // --on-error fail: exit 1 naming the first bad file; the output folder gets nothing.
    let out3 = t.path().join("out3");
    let o = run(
        &[
            "convert",
            src.to_str().unwrap(),
            "--out",
            out3.to_str().unwrap(),
            "--size",
            "16x16",
            "--on-error",
            "fail",
            "--quiet",
        ],
        1,
    );
    assert!(
        stderr(&o).contains("truncated.png")
            || stderr(&o).contains("empty.jpg")
            || stderr(&o).contains("README.txt"),
        "{}",
        stderr(&o)
    );
    assert!(!out3.exists(), "nothing may be left behind");
}

#[test]
fn labels_csv_split_and_existing_output() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("flat");
    std::fs::create_dir(&src).unwrap();
    let mut csv = String::from("path,label\n");
    for i in 0..40 {
        GrayImage::from_pixel(8, 8, Luma([i as u8 * 5]))
            .save(src.join(format!("{i}.png")))
            .unwrap();
        csv.push_str(&format!(
            "{i}.png,{}\n",
            if i % 2 == 0 { "even" } else { "odd" }
        ));
    }
    csv.push_str("missing.png,odd\n");
    std::fs::write(t.path().join("labels.csv"), csv).unwrap();
    let out = t.path().join("out");
    let csv_path = t.path().join("labels.csv");
    let args = [
        "convert",
        src.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--labels",
        csv_path.to_str().unwrap(),
        "--test-fraction",
        "0.25",
        "--quiet",
    ];
    run(&args, 0);
    let m = Dataset::open(&out).unwrap().manifest;
    assert_eq!(m.classes, vec!["even", "odd"]);
    let (tr, te) = (m.splits["train"].samples, m.splits["test"].samples);
    assert_eq!(tr + te, 40);
    assert!((4..=18).contains(&te), "test split {te} of 40 at 25%");
    assert!(std::fs::read_to_string(out.join("rejects.jsonl"))
        .unwrap()
        .contains("missing.png"));
    // Same input, same split: deterministic.
    let before = shard_files(&out);
    // The same command again has nothing to do; another split is refused without --force.
    run(&args, 0);
    let mut other = args.to_vec();
    other[7] = "0.3";
    let o = run(&other, 2);
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    let mut forced = args.to_vec();
    forced.push("--force");
    run(&forced, 0);
    assert!(shard_files(&out) == before);
}
