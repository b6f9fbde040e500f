//! Tests of the `pred` filter (pred.rs): round trips, the median step, the stored layout.

use super::*;

fn geometry(planes: usize, channels: usize, rows: usize, width: usize, wide: bool) -> Geometry {
    Geometry {
        planes,
        channels,
        rows,
        width,
        wide,
    }
}

#[test]
fn every_method_round_trips_bit_exactly() {
    let mut seed = 7u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (planes, channels, rows, width) in [
        (3, 3, 1, 1),
        (48, 3, 5, 7),
        (17, 1, 3, 4),
        (40, 4, 2, 9),
        (16, 1, 1, 33),
        (6, 3, 8, 1),
        (32, 1, 3, 37),
        (51, 3, 4, 50),
    ] {
        for wide in [false, true] {
            let g = geometry(planes, channels, rows, width, wide);
            // Smooth values with noise, and the extremes where wrapping matters.
            let px: Vec<u8> = (0..g.bytes())
                .map(|i| match next() % 4 {
                    0 => 0,
                    1 => 255,
                    _ => ((i / 3) as u8).wrapping_add((next() % 5) as u8),
                })
                .collect();
            for method in [0, 1, 2, 3, 0x11, 0x12, 0x13] {
                if !valid(method, Some(&g)) {
                    assert!(method & COLOUR != 0 && channels != 3);
                    continue;
                }
                let mut stored = Vec::new();
                encode(&px, &g, method, &mut stored);
                assert_eq!(stored.len(), px.len());
                let mut back = vec![0xAA; px.len()];
                decode(&stored, &g, method, &mut back);
                assert_eq!(back, px, "{g:?} method {method:#x}");
            }
            let m = choose(&px, &g);
            assert!(valid(m, Some(&g)), "{m:#x}");
        }
    }
}

#[test]
fn the_median_edge_detector_is_loco_i_s_for_every_u8_and_sampled_u16() {
    fn reference(a: i32, b: i32, c: i32) -> i32 {
        if c >= a.max(b) {
            a.min(b)
        } else if c <= a.min(b) {
            a.max(b)
        } else {
            a + b - c
        }
    }
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            for c in 0..=255u8 {
                let want = reference(a as i32, b as i32, c as i32);
                assert_eq!(med(a, b, c) as i32, want, "{a} {b} {c}");
            }
        }
    }
    let edges = [0u16, 1, 2, 255, 256, 32767, 32768, 65534, 65535];
    let mut seed = 3u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..3_000_000u64 {
        let pick = |v: u64| {
            if v % 4 == 0 {
                edges[(v / 4) as usize % edges.len()]
            } else {
                (v >> 8) as u16
            }
        };
        let (a, b, c) = (pick(next()), pick(next()), pick(next() ^ i));
        let want = reference(a as i32, b as i32, c as i32);
        assert_eq!(med(a, b, c) as i32, want, "{a} {b} {c}");
    }
}

#[test]
fn smooth_planes_leave_small_residuals_and_are_filtered() {
    // A ramp: every filter but plain leaves residuals of 0 or 1.
    let g = geometry(32, 1, 16, 16, false);
    let px: Vec<u8> = (0..g.bytes())
        .map(|i| ((i % 256) / 16 + (i % 16)) as u8)
        .collect();
    let m = choose(&px, &g);
    assert_ne!(m & 0x0f, PLAIN);
    let mut stored = Vec::new();
    encode(&px, &g, m, &mut stored);
    let big = stored.iter().filter(|&&b| b > 2 && b < 254).count();
    assert!(big * 20 < stored.len(), "{big} of {}", stored.len());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_vector_transpose_is_a_transpose() {
    let m: [u8; 256] = std::array::from_fn(|i| (i * 7 + 3) as u8);
    let t = transpose16(&m);
    for r in 0..16 {
        for c in 0..16 {
            assert_eq!(t[c][r], m[r * 16 + c], "row {r} column {c}");
        }
    }
}

#[test]
fn sixteen_planes_are_stored_value_by_value_across_planes() {
    // The layout the format specifies: for each value, the residuals of the group's 16
    // planes side by side (up filter on a single row is left from the first value).
    let g = geometry(16, 1, 1, 40, false);
    let px: Vec<u8> = (0..g.bytes()).map(|i| (i * 13 % 251) as u8).collect();
    let mut stored = Vec::new();
    encode(&px, &g, LEFT, &mut stored);
    for x in 0..40 {
        for l in 0..16 {
            let v = px[l * 40 + x];
            let left = if x == 0 { 0 } else { px[l * 40 + x - 1] };
            assert_eq!(
                stored[x * 16 + l],
                v.wrapping_sub(left),
                "value {x} plane {l}"
            );
        }
    }
}

/// `Block::decode` of a pred block of `n` samples as a reader of shard `s.shard` calls it
/// (its stored checksum made to match).
fn decode_as_read(
    spec: &crate::format::shard::SampleSpec,
    n: usize,
    stored: &[u8],
    raw_xxh3: u64,
    classes: u32,
) -> crate::util::error::Result<crate::format::shard::Block> {
    use crate::format::shard::{block::BlockLayout, format::BlockEntry, Block, Codec};
    let entry = BlockEntry {
        offset: 0,
        stored_len: stored.len() as u64,
        num_samples: n as u32,
        stored_xxh3: twox_hash::XxHash3_64::oneshot(stored),
        raw_xxh3,
    };
    let fields = crate::format::fields::Fields::default();
    let layout = BlockLayout {
        spec,
        codec: Codec::Pred { level: 1 }.code(),
        num_classes: classes,
        field_bytes: 0,
        fields: &fields,
    };
    Block::decode(
        std::path::Path::new("s.shard"),
        0,
        &entry,
        stored,
        &layout,
        Vec::new(),
    )
}

/// The property the codec promises, through the block API a reader uses: random blocks of
/// every dtype, 1 to 5 channels and random shapes (2 to 4 dimensions) decode bit for bit,
/// whatever the filter chosen, and the method byte is one the reader accepts.
#[test]
fn random_blocks_of_every_dtype_and_channel_count_round_trip() {
    use crate::format::shard::{Block, Codec, Dtype, SampleSpec, Shape};
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for case in 0..240 {
        let dtype = [Dtype::U8, Dtype::U16, Dtype::F16, Dtype::F32][case % 4];
        let channels = 1 + (case / 4) % 5;
        let mut dims = vec![channels as u32];
        for _ in 0..1 + next(3) {
            dims.push(1 + next(40) as u32);
        }
        let spec = SampleSpec {
            shape: Shape::new(dims).unwrap(),
            dtype,
        };
        let n = 1 + next(40) as usize;
        let mut b = Block::zeroed(n, spec.bytes());
        // Smooth rows with noise, flat runs, or noise alone: each filter and the plain
        // method get chosen somewhere. Floats get finite values.
        let style = next(3);
        for (i, v) in b.pixels_mut().iter_mut().enumerate() {
            *v = match style {
                0 => ((i / 7) as u8).wrapping_add(next(3) as u8),
                1 => 0,
                _ => next(256) as u8,
            };
        }
        if dtype.is_float() {
            let size = dtype.size();
            for x in b.pixels_mut().chunks_exact_mut(size) {
                x[size - 1] &= 0x3f; // a small exponent: finite
            }
        }
        for i in 0..n {
            b.set_label(i, next(10) as u32);
        }
        // Every sixth at level 10, where the writer also tries zstd's matches.
        let level = if case % 6 == 5 { 10 } else { 1 };
        let e = b.encode(&spec, 10, Codec::Pred { level }).unwrap();
        let g = super::super::block::tests_pred_geometry(&spec, n);
        assert!(
            valid(e.bytes[0], g.as_ref()),
            "case {case}: method {:#x}",
            e.bytes[0]
        );
        let back = decode_as_read(&spec, n, &e.bytes, e.raw_xxh3, 10).unwrap();
        assert_eq!(back, b, "case {case}: {} {} x {n}", spec.shape, dtype);
    }
}

#[test]
fn a_block_with_a_method_its_samples_cannot_have_is_damaged() {
    use crate::format::shard::{Block, Codec, Dtype, SampleSpec, Shape};
    for (channels, method) in [(3, 0x14u8), (1, 0x13), (3, 0x10), (3, 0x33)] {
        let spec = SampleSpec {
            shape: Shape::new(vec![channels, 4, 20]).unwrap(),
            dtype: Dtype::U8,
        };
        let b = Block::zeroed(3, spec.bytes());
        let mut e = b.encode(&spec, 1, Codec::Pred { level: 1 }).unwrap();
        e.bytes[0] = method;
        let err = decode_as_read(&spec, 3, &e.bytes, e.raw_xxh3, 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("s.shard") && err.contains("pred method"),
            "{err}"
        );
    }
}

#[test]
fn methods_are_checked_against_the_geometry() {
    let rgb = geometry(3, 3, 2, 2, false);
    let grey = geometry(3, 1, 2, 2, false);
    assert!(valid(0x13, Some(&rgb)));
    assert!(!valid(0x13, Some(&grey)));
    assert!(!valid(0x10, Some(&rgb)));
    assert!(!valid(4, Some(&rgb)));
    assert!(!valid(0x23, Some(&rgb)));
    assert!(valid(0, None));
    assert!(!valid(1, None));
}
