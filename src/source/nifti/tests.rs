use super::*;
use std::io::Write;

/// A NIfTI-1 single file: 348-byte header, 4 extension bytes (none), voxel data.
pub(crate) fn nifti_bytes(
    dims: &[u16],
    datatype: i16,
    bitpix: i16,
    slope: f32,
    inter: f32,
    data: &[u8],
    big: bool,
) -> Vec<u8> {
    let mut h = vec![0u8; 352];
    macro_rules! put {
        ($off:expr, $v:expr) => {{
            let b = if big {
                $v.to_be_bytes()
            } else {
                $v.to_le_bytes()
            };
            h[$off..$off + b.len()].copy_from_slice(&b);
        }};
    }
    put!(0, 348i32);
    put!(40, dims.len() as i16);
    for i in 0..7 {
        put!(42 + 2 * i, *dims.get(i).unwrap_or(&1) as i16);
    }
    put!(70, datatype);
    put!(72, bitpix);
    for i in 0..8 {
        put!(76 + 4 * i, 1.0f32);
    }
    put!(108, 352.0f32);
    put!(112, slope);
    put!(116, inter);
    h[344..348].copy_from_slice(b"n+1\0");
    h.extend_from_slice(data);
    h
}

pub(crate) fn i16_data(vals: impl IntoIterator<Item = i16>, big: bool) -> Vec<u8> {
    vals.into_iter()
        .flat_map(|v| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        })
        .collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

type Gray16 = ImageBuffer<Luma<u16>, Vec<u16>>;

fn run(path: &Path, opts: &DecodeOptions) -> Result<Vec<Gray16>, Reject> {
    let mut out = Vec::new();
    decode(path, opts, &mut |f: Frame| {
        match f.expect_image() {
            DynamicImage::ImageLuma16(b) => out.push(b),
            other => panic!("expected Luma16, got {:?}", other.color()),
        }
        Ok(())
    })?;
    Ok(out)
}

#[test]
fn probe_gives_the_decoded_slice_size() {
    let t = tempfile::tempdir().unwrap();
    let data = i16_data((0..4 * 5 * 6).map(|i| i as i16), false);
    let bytes = nifti_bytes(&[4, 5, 6], 4, 16, 1.0, 0.0, &data, false);
    for (name, b) in [("a.nii", bytes.clone()), ("b.nii.gz", gz(&bytes))] {
        let p = write(t.path(), name, &b);
        for axis in 0..3 {
            let o = opts(axis, None);
            let first = &run(&p, &o).unwrap()[0];
            let got = probe(&p, &o).unwrap();
            assert!(!got.colour);
            assert_eq!(
                got.size,
                Some((first.height(), first.width())),
                "{name} axis {axis}"
            );
        }
    }
    let p = write(t.path(), "short.nii", &bytes[..100]);
    assert!(probe(&p, &opts(2, None)).is_err());
}

fn opts(axis: usize, window: Option<(f64, f64)>) -> DecodeOptions {
    DecodeOptions {
        axis,
        window,
        ..DecodeOptions::default()
    }
}

/// 4 x 3 x 2 volume whose voxel (x, y, z) holds x + 4y + 12z; stored value v is scaled to
/// 2v + 10 by the header.
fn small(big: bool) -> Vec<u8> {
    nifti_bytes(&[4, 3, 2], 4, 16, 2.0, 10.0, &i16_data(0..24, big), big)
}

#[test]
fn slices_along_each_axis_with_given_window() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "v.nii", &small(false));
    // Window 10..56 covers scaled values 2*0+10 ..= 2*23+10 exactly.
    let w = Some((10.0, 56.0));
    let z = run(&p, &opts(2, w)).unwrap();
    assert_eq!(z.len(), 2);
    assert_eq!(z[0].dimensions(), (4, 3));
    let val = |x: u32, y: u32, zz: u32| {
        window_to_u16((2 * (x + 4 * y + 12 * zz) + 10) as f64, 10.0, 56.0)
    };
    // No qform or sform: RAS by the NIfTI rule, brought to LPS (x and y reversed). Axial: the
    // top row is the highest y (anterior), the first column the highest x (the patient's right).
    for zz in 0..2 {
        for r in 0..3 {
            for c in 0..4 {
                assert_eq!(
                    z[zz as usize].get_pixel(c, r)[0],
                    val(3 - c, 2 - r, zz),
                    "z={zz} row={r} col={c}"
                );
            }
        }
    }
    assert_eq!(z[0].get_pixel(3, 2)[0], 0);
    assert_eq!(z[1].get_pixel(0, 0)[0], 65535);

    // Sagittal: slices from the right (highest x), columns anterior to posterior, superior on top.
    let x = run(&p, &opts(0, w)).unwrap();
    assert_eq!(x.len(), 4);
    assert_eq!(x[0].dimensions(), (3, 2));
    // Coronal: slices from anterior (highest y), columns right to left, superior on top.
    let y = run(&p, &opts(1, w)).unwrap();
    assert_eq!(y.len(), 3);
    assert_eq!(y[0].dimensions(), (4, 2));
    for s in 0..4u32 {
        for c in 0..3 {
            for r in 0..2 {
                assert_eq!(x[s as usize].get_pixel(c, r)[0], val(3 - s, 2 - c, 1 - r));
            }
        }
    }
    for s in 0..3u32 {
        for c in 0..4 {
            for r in 0..2 {
                assert_eq!(y[s as usize].get_pixel(c, r)[0], val(3 - c, 2 - s, 1 - r));
            }
        }
    }
    // Stored axes: cut by the same rule, no reversal.
    let stored = DecodeOptions {
        orientation: crate::source::volume::Orientation::Stored,
        ..opts(2, w)
    };
    let z = run(&p, &stored).unwrap();
    assert_eq!(z[1].get_pixel(1, 2)[0], val(1, 2, 1));

    assert!(run(&p, &opts(3, w)).unwrap_err().0.contains("axis"));
}

#[test]
fn float_option_emits_scaled_values_without_window() {
    let dir = tempfile::tempdir().unwrap();
    let float = |axis| DecodeOptions {
        float: true,
        ..opts(axis, Some((0.0, 1.0)))
    };
    let run_float = |p: &Path, o: &DecodeOptions| {
        let mut out = Vec::new();
        decode(p, o, &mut |f| {
            match f {
                Frame::Float(f) => out.push(f),
                Frame::Image(_) | Frame::Windowed(_) => panic!("expected float values"),
            }
            Ok(())
        })
        .map(|()| out)
    };
    // int16 v scaled to 2v + 10; the window option does not apply.
    let p = write(dir.path(), "v.nii.gz", &gz(&small(true)));
    let z = run_float(&p, &float(2)).unwrap();
    assert_eq!(z.len(), 2);
    assert_eq!((z[1].width, z[1].height), (4, 3));
    // Slice z = 1, top row y = 2, columns from the highest x: voxels 12 + 8 + x.
    assert_eq!(z[1].data[..4], [56.0, 54.0, 52.0, 50.0]);
    let x = run_float(&p, &float(0)).unwrap();
    assert_eq!(x.len(), 4);
    // Sagittal slice 1 is x = 2; its top row z = 1, column 2 y = 0.
    assert_eq!(x[1].data[2], (2 * (2 + 12) + 10) as f32);
    // float64 voxels are rounded to float32; NaN stays, for the conversion to reject.
    let vals = [0.1f64, -1e-3, f64::NAN, 1e300, 7.0, -2.5];
    let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = write(
        dir.path(),
        "d.nii",
        &nifti_bytes(&[3, 2, 1], 64, 64, 1.0, 0.0, &data, false),
    );
    let f = run_float(&p, &float(2)).unwrap();
    let want = [-2.5, 7.0, f32::INFINITY, f32::NAN, -1e-3, 0.1];
    assert_eq!(
        f[0].data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn big_endian_and_gzip_give_the_same_images() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(2, None);
    let a = run(&write(dir.path(), "a.nii", &small(false)), &o).unwrap();
    let b = run(&write(dir.path(), "b.nii", &small(true)), &o).unwrap();
    let c = run(&write(dir.path(), "c.nii.gz", &gz(&small(false))), &o).unwrap();
    let d = run(&write(dir.path(), "d.nii.gz", &gz(&small(true))), &o).unwrap();
    assert_eq!(a, b);
    assert_eq!(a, c);
    assert_eq!(a, d);
}

#[test]
fn percentile_window_and_slope_zero() {
    let dir = tempfile::tempdir().unwrap();
    // 10 x 10 x 1 with values 0..99 and slope 0 (= unscaled).
    let bytes = nifti_bytes(
        &[10, 10, 1],
        4,
        16,
        0.0,
        5.0,
        &i16_data(0..100, false),
        false,
    );
    let p = write(dir.path(), "p.nii", &bytes);
    let o = DecodeOptions {
        percentiles: (10.0, 90.0),
        ..DecodeOptions::default()
    };
    let imgs = run(&p, &o).unwrap();
    assert_eq!(imgs.len(), 1);
    // NumPy: percentile(arange(100), [10, 90]) = [9.9, 89.1].
    let (lo, hi) = (9.9, 89.1);
    let px = |v: u32| imgs[0].get_pixel(9 - v % 10, 9 - v / 10)[0];
    assert_eq!(px(5), 0);
    assert_eq!(px(95), 65535);
    assert_eq!(px(50), window_to_u16(50.0, lo, hi));
    assert!((px(50) as i32 - 32768).abs() < 700, "{}", px(50));
}

#[test]
fn percentiles_match_numpy() {
    let mut v: Vec<f32> = (0..1000).rev().map(|x| x as f32).collect();
    let (lo, hi) = percentiles_in_place(&mut v, (0.5, 99.5));
    assert!((lo - 4.995).abs() < 1e-9, "{lo}");
    assert!((hi - 994.005).abs() < 1e-6, "{hi}");
    let mut one = vec![7.0f32];
    assert_eq!(percentiles_in_place(&mut one, (0.5, 99.5)), (7.0, 7.0));
    let mut s = Vec::new();
    assert_eq!(
        percentile_window(&[f32::NAN, f32::INFINITY], (1.0, 99.0), &mut s).unwrap(),
        (0.0, 0.0)
    );
}

#[test]
fn four_d_time_points_share_one_window_and_channels_stack() {
    let dir = tempfile::tempdir().unwrap();
    // 2 x 2 x 2 x 3 float32 volumes; volume t holds (i + 1) * 10^t, one NaN in volume 1.
    let mut vals = Vec::new();
    for t in 0..3 {
        for i in 0..8 {
            vals.push(if t == 1 && i == 3 {
                f32::NAN
            } else {
                (i + 1) as f32 * 10f32.powi(t)
            });
        }
    }
    let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let p = write(
        dir.path(),
        "t.nii.gz",
        &gz(&nifti_bytes(&[2, 2, 2, 3], 16, 32, 1.0, 0.0, &data, false)),
    );
    let time = DecodeOptions {
        percentiles: (0.0, 100.0),
        fourth: crate::source::volume::FourthAxis::Time,
        ..DecodeOptions::default()
    };
    let imgs = run(&p, &time).unwrap();
    assert_eq!(imgs.len(), 6);
    assert!(imgs.iter().all(|i| i.dimensions() == (2, 2)));
    // One window over the series (1 .. 800): later time points are brighter, the last
    // volume's maximum is white, the first's minimum black. (Voxel (x, y) is pixel
    // (1 - x, 1 - y): RAS brought to LPS.)
    assert_eq!(imgs[0].get_pixel(1, 1)[0], 0);
    assert_eq!(imgs[5].get_pixel(0, 0)[0], 65535);
    assert_eq!(imgs[1].get_pixel(0, 0)[0], window_to_u16(8.0, 1.0, 800.0));
    assert_eq!(imgs[3].get_pixel(0, 0)[0], window_to_u16(80.0, 1.0, 800.0));
    // NaN voxel (x=1, y=1, z=0) of volume 1 is 0.
    assert_eq!(imgs[2].get_pixel(0, 0)[0], 0);
    // Auto: 3 volumes are channels: 2 frames of 3 planes, each plane windowed on its own.
    let mut frames = Vec::new();
    let o = DecodeOptions {
        percentiles: (0.0, 100.0),
        ..DecodeOptions::default()
    };
    decode(&p, &o, &mut |f| {
        match f {
            Frame::Windowed(f) => frames.push(f),
            _ => panic!("expected windowed planes"),
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[1].channels, 3);
    // A header that gives the 4th axis a time unit and step (xyzt_units 10: mm and seconds,
    // pixdim[4] 2 s) makes auto read time points.
    let mut timed = nifti_bytes(&[2, 2, 2, 3], 16, 32, 1.0, 0.0, &data, false);
    timed[123] = 10;
    timed[92..96].copy_from_slice(&2f32.to_le_bytes());
    let p = write(dir.path(), "timed.nii", &timed);
    let g = grid(&p).unwrap();
    assert_eq!(g.time_step, Some(2.0));
    assert_eq!(
        fourth_axis(&g, crate::source::volume::FourthAxis::Auto),
        Fourth::Time(3)
    );
    assert_eq!(run(&p, &o).unwrap().len(), 6);
    // Slice z = 1, pixel (0, 0) is voxel (1, 1, 1) = i 7, each channel's maximum.
    for c in [0, 2] {
        assert_eq!(frames[1].data[c * 4], 65535.0, "channel {c}");
    }
}

#[test]
fn absurd_headers_are_rejected_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let huge = nifti_bytes(&[30000, 30000, 30000], 4, 16, 1.0, 0.0, &[0; 64], false);
    let e = run(&write(dir.path(), "h.nii", &huge), &opts(2, None)).unwrap_err();
    assert!(e.0.contains("too large"), "{e}");
    let e = run(&write(dir.path(), "h.nii.gz", &gz(&huge)), &opts(2, None)).unwrap_err();
    assert!(e.0.contains("too large"), "{e}");
    // Within the limit but far beyond the file: truncated, from the file size alone.
    let big = nifti_bytes(&[1024, 1024, 1024], 4, 16, 1.0, 0.0, &[0; 64], false);
    let e = run(&write(dir.path(), "b.nii", &big), &opts(2, None)).unwrap_err();
    assert!(e.0.starts_with("truncated NIfTI"), "{e}");
    let e = run(&write(dir.path(), "b.nii.gz", &gz(&big)), &opts(2, None)).unwrap_err();
    assert!(e.0.starts_with("truncated NIfTI"), "{e}");
    // Negative dimension, unsupported type, NIfTI-2, ni1 magic.
    let mut neg = small(false);
    neg[44..46].copy_from_slice(&(-3i16).to_le_bytes());
    assert!(run(&write(dir.path(), "n.nii", &neg), &opts(2, None))
        .unwrap_err()
        .0
        .contains("dim[2]"));
    let mut rgb = small(false);
    rgb[70..72].copy_from_slice(&128i16.to_le_bytes());
    assert!(run(&write(dir.path(), "r.nii", &rgb), &opts(2, None))
        .unwrap_err()
        .0
        .contains("RGB24"));
    let mut two = small(false);
    two[0..4].copy_from_slice(&540i32.to_le_bytes());
    assert!(run(&write(dir.path(), "2.nii", &two), &opts(2, None))
        .unwrap_err()
        .0
        .contains("NIfTI-2"));
    let mut pair = small(false);
    pair[344..348].copy_from_slice(b"ni1\0");
    assert!(run(&write(dir.path(), "i.nii", &pair), &opts(2, None))
        .unwrap_err()
        .0
        .contains("ni1"));
}

#[test]
fn truncated_and_garbage_files_are_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let full = small(false);
    let zipped = gz(&full);
    for cut in [0, 1, 100, 347, 348, 351, 352, 353, full.len() - 1] {
        let e = run(&write(dir.path(), "t.nii", &full[..cut]), &opts(2, None)).unwrap_err();
        assert!(
            e.0.contains("truncated") || e.0.contains("not a NIfTI"),
            "cut {cut}: {e}"
        );
    }
    for cut in [
        1,
        2,
        10,
        zipped.len() / 2,
        zipped.len() - 9,
        zipped.len() - 1,
    ] {
        let r = run(
            &write(dir.path(), "t.nii.gz", &zipped[..cut]),
            &opts(2, None),
        );
        // Cutting only the gzip trailer may leave every voxel readable; never a panic.
        if let Err(e) = r {
            assert!(!e.0.is_empty());
        }
    }
    let cut = run(
        &write(dir.path(), "t.nii.gz", &zipped[..zipped.len() / 2]),
        &opts(2, None),
    )
    .unwrap_err();
    assert!(
        cut.0.contains("truncated") || cut.0.contains("corrupt"),
        "{cut}"
    );
    let mut seed = 0x9e3779b97f4a7c15u64;
    for len in [0usize, 3, 348, 352, 1000, 5000] {
        let junk: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        assert!(run(&write(dir.path(), "j.nii", &junk), &opts(2, None)).is_err());
        let mut gzj = vec![0x1f, 0x8b];
        gzj.extend_from_slice(&junk);
        assert!(run(&write(dir.path(), "j.nii.gz", &gzj), &opts(2, None)).is_err());
    }
    // Byte flips in the header: errors or images, never panics.
    for i in 0..352 {
        let mut b = full.clone();
        b[i] ^= 0xA5;
        let _ = run(&write(dir.path(), "f.nii", &b), &opts(2, None));
    }
}

#[test]
fn emit_error_stops_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "v.nii", &small(false));
    let mut n = 0;
    let e = decode(&p, &opts(2, None), &mut |_| {
        n += 1;
        Err(Reject::new("stop"))
    })
    .unwrap_err();
    assert_eq!(e.0, "stop");
    assert_eq!(n, 1);
}
