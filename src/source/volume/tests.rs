use super::*;

const LPS: Axes = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
const RAS: Axes = [[-1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]];
const LAS: Axes = [[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]];

fn geo(axes: Axes) -> Geometry {
    Geometry {
        dims: [4, 3, 2],
        axes: Some(axes),
        spacing: [Some(0.5), Some(1.0), Some(2.5)],
    }
}

/// A volume whose voxel holds its own index: x + 10 y + 100 z.
fn indexed(d: [usize; 3]) -> Vec<f32> {
    let mut v = Vec::new();
    for z in 0..d[2] {
        for y in 0..d[1] {
            for x in 0..d[0] {
                v.push((x + 10 * y + 100 * z) as f32);
            }
        }
    }
    v
}

#[test]
fn axis_codes_and_the_closest_lps_orientation() {
    assert_eq!(geo(LPS).codes(), "LPS");
    assert_eq!(geo(RAS).codes(), "RAS");
    assert_eq!(geo(LAS).codes(), "LAS");
    assert!(geo(LPS).reorient(Orientation::Lps).is_identity());
    let r = geo(RAS).reorient(Orientation::Lps);
    assert_eq!((r.perm, r.flip), ([0, 1, 2], [true, true, false]));
    assert!(geo(RAS).reorient(Orientation::Stored).is_identity());
    // Stored as (S, A, R): axis 0 toward superior, 1 anterior, 2 right.
    let sar: Axes = [[0.0, 0.0, 1.0], [0.0, -1.0, 0.0], [-1.0, 0.0, 0.0]];
    let g = geo(sar);
    assert_eq!(g.codes(), "SAR");
    let r = g.reorient(Orientation::Lps);
    assert_eq!((r.perm, r.flip), ([2, 1, 0], [true, true, false]));
    let t = g.target(Orientation::Lps, None).unwrap();
    assert_eq!(t.dims, [2, 3, 4]);
    assert_eq!(t.spacing, [Some(2.5), Some(1.0), Some(0.5)]);
    assert_eq!(t.codes(), "LPS");
    // Oblique by 20 degrees about z: still the nearest axes, still a permutation.
    let (c, s) = (20f64.to_radians().cos(), 20f64.to_radians().sin());
    let obl: Axes = [[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]];
    assert!(Reorient::to_lps(&obl).is_identity());
    // 45 degrees exactly: ties go to the first pair found, and each axis is used once.
    let h = std::f64::consts::FRAC_1_SQRT_2;
    let diagonal = [[h, h, 0.0], [-h, h, 0.0], [0.0, 0.0, 1.0]];
    let r = Reorient::to_lps(&diagonal);
    let mut p = r.perm;
    p.sort();
    assert_eq!(p, [0, 1, 2]);
    // Its codes name each patient axis once.
    let codes = geo(diagonal).codes();
    let mut letters: Vec<char> = codes.chars().collect();
    letters.sort();
    assert!(letters.windows(2).all(|w| w[0] != w[1]), "{codes}");
}

#[test]
fn reorienting_moves_each_voxel_where_source_says() {
    let d = [4, 3, 2];
    let v = indexed(d);
    for r in [
        Reorient::IDENTITY,
        Reorient::to_lps(&RAS),
        Reorient::to_lps(&LAS),
        Reorient {
            perm: [2, 0, 1],
            flip: [true, false, true],
        },
    ] {
        let out = r.apply(&v, d);
        let od = r.dims(d);
        assert_eq!(out.len(), v.len());
        for z in 0..od[2] {
            for y in 0..od[1] {
                for x in 0..od[0] {
                    let s = r.source([x, y, z], d);
                    assert_eq!(
                        out[x + od[0] * (y + od[1] * z)],
                        (s[0] + 10 * s[1] + 100 * s[2]) as f32,
                        "{r:?} at {x},{y},{z}"
                    );
                }
            }
        }
    }
    // RAS to LPS reverses x and y: the first output voxel is the last x, last y of z 0.
    let out = Reorient::to_lps(&RAS).apply(&v, d);
    assert_eq!(out[0], (3 + 10 * 2) as f32);
}

#[test]
fn resampling_keeps_extent_ramps_and_labels() {
    let d = [4, 3, 2];
    let from = [Some(0.5), Some(1.0), Some(2.5)];
    assert_eq!(
        resampled_dims(d, &from, [1.0, 1.0, 1.0]).unwrap(),
        [2, 3, 5]
    );
    assert!(resampled_dims(d, &[None, Some(1.0), Some(1.0)], [1.0; 3])
        .unwrap_err()
        .0
        .contains("axis 0"));
    assert!(
        resampled_dims([1 << 20, 1 << 10, 1], &[Some(1.0); 3], [0.01; 3])
            .unwrap_err()
            .0
            .contains("limit")
    );
    // A ramp along z (value = z position in mm) stays a ramp: linear interpolation is exact.
    let d = [2, 2, 5];
    let v: Vec<f32> = (0..20).map(|i| (i / 4) as f32 * 2.0).collect();
    let (out, od) = resample(&v, d, &[Some(1.0), Some(1.0), Some(2.0)], [1.0; 3], false).unwrap();
    assert_eq!(od, [2, 2, 10]);
    for z in 0..10 {
        let want = (z as f32).min(8.0);
        assert_eq!(out[4 * z], want, "z {z}");
    }
    // Nearest: only values of the source, never a blend of two labels.
    let labels: Vec<f32> = (0..20).map(|i| ((i / 4) % 3) as f32).collect();
    let (out, _) = resample(
        &labels,
        d,
        &[Some(1.0), Some(1.0), Some(2.0)],
        [1.0; 3],
        true,
    )
    .unwrap();
    assert!(out.iter().all(|v| [0.0, 1.0, 2.0].contains(v)));
    assert_eq!(out[4 * 2], labels[4]);
    // The same spacing: the same voxels.
    let (same, sd) = resample(
        &v,
        d,
        &[Some(1.0), Some(1.0), Some(2.0)],
        [1.0, 1.0, 2.0],
        false,
    )
    .unwrap();
    assert_eq!((same, sd), (v, d));
}

#[test]
fn spacing_flags_parse_or_say_why() {
    assert_eq!(parse_spacing("1").unwrap(), [1.0; 3]);
    assert_eq!(parse_spacing("0.8x0.8x2.5").unwrap(), [0.8, 0.8, 2.5]);
    assert!(parse_spacing("1x2").is_err());
    assert!(parse_spacing("0x1x1").unwrap_err().contains("positive"));
    assert!(parse_spacing("a").is_err());
}
