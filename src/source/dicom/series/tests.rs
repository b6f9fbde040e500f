use super::*;

const AXIAL: [f64; 6] = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0];

fn h(series: &str, z: f64) -> SeriesHeader {
    SeriesHeader {
        series_uid: Some(series.into()),
        rows: 4,
        cols: 3,
        frames: 1,
        samples_per_pixel: 1,
        bits_allocated: 16,
        bits_stored: 12,
        pixel_representation: 0,
        photometric: "MONOCHROME2".into(),
        pixel_spacing: Some([0.5, 0.5]),
        orientation: Some(AXIAL),
        position: Some([0.0, 0.0, z]),
        instance: None,
        ..SeriesHeader::default()
    }
}

fn input(rel: &str, class: &str, header: SeriesHeader) -> Input {
    Input {
        rel: rel.into(),
        path: PathBuf::from(rel),
        class: class.into(),
        header,
    }
}

/// `series::group` cutting along `axis` in the default (LPS) orientation.
fn group(inputs: Vec<Input>, axis: usize) -> Grouping {
    super::group(
        inputs,
        &DecodeOptions {
            axis,
            ..DecodeOptions::default()
        },
    )
}

fn plan(g: &Group) -> &SeriesPlan {
    match &g.what {
        What::Series(p) => p,
        What::File { rel, .. } => panic!("{rel} is on its own"),
    }
}

fn order(p: &SeriesPlan) -> Vec<Vec<&str>> {
    p.slots
        .iter()
        .map(|s| s.iter().map(|f| f.rel.as_str()).collect())
        .collect()
}

#[test]
fn orders_by_position_along_the_normal_with_duplicates_together() {
    // Sagittal: rows along y, columns along -z; the normal is (0, 0, 0) x ... = (-1, 0, 0)
    // for these cosines, so ascending order is descending x.
    let sag = [0.0, 1.0, 0.0, 0.0, 0.0, -1.0];
    let at = |x: f64| SeriesHeader {
        orientation: Some(sag),
        position: Some([x, 5.0, 9.0]),
        ..h("1.1", 0.0)
    };
    let g = group(
        vec![
            input("a", "c", at(1.0)),
            input("b", "c", at(3.0)),
            input("c", "c", at(2.0)),
            input("d", "c", at(3.004)), // the same position as b, within 0.01 mm
            input("e", "c", at(0.0)),
        ],
        2,
    );
    assert!(g.rejects.is_empty(), "{:?}", g.rejects);
    assert_eq!(g.groups.len(), 1);
    let p = plan(&g.groups[0]);
    assert_eq!(p.order, Order::Position);
    assert_eq!(order(p), [vec!["b", "d"], vec!["c"], vec!["a"], vec!["e"]]);
    assert_eq!(g.groups[0].first, "a");
    // Columns toward P, rows toward I, slices toward R: brought to LPS the volume is 4 (L) x 3
    // (P) x 4 (S) voxels; as stored 3 x 4 x 4.
    assert_eq!(p.geometry.codes(), "PIR");
    assert_eq!(p.geometry.spacing, [Some(0.5), Some(0.5), Some(1.0)]);
    let probe = |axis, orientation| {
        let o = DecodeOptions {
            axis,
            orientation,
            ..DecodeOptions::default()
        };
        p.probe(&o).unwrap().size.unwrap()
    };
    use crate::source::volume::Orientation::{Lps, Stored};
    assert_eq!([0, 1, 2].map(|a| probe(a, Lps)), [(4, 3), (4, 4), (3, 4)]);
    assert_eq!(
        [0, 1, 2].map(|a| probe(a, Stored)),
        [(4, 4), (4, 3), (4, 3)]
    );
}

#[test]
fn files_that_do_not_fit_are_rejected_and_the_majority_is_the_reference() {
    let g = group(
        vec![
            // The first file is the odd one out: the reference is what most files share.
            input(
                "a",
                "c",
                SeriesHeader {
                    rows: 8,
                    ..h("1.1", 0.0)
                },
            ),
            input("b", "c", h("1.1", 1.0)),
            input("c", "c", h("1.1", 2.0)),
            input(
                "d",
                "c",
                SeriesHeader {
                    pixel_representation: 1,
                    ..h("1.1", 3.0)
                },
            ),
            input(
                "e",
                "c",
                SeriesHeader {
                    pixel_spacing: Some([0.5, 0.6]),
                    ..h("1.1", 4.0)
                },
            ),
            input(
                "f",
                "c",
                SeriesHeader {
                    orientation: Some([1.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
                    ..h("1.1", 5.0)
                },
            ),
            input(
                "g",
                "c",
                SeriesHeader {
                    pixel_spacing: Some([0.5000004, 0.5]),
                    ..h("1.1", 3.0)
                },
            ),
        ],
        2,
    );
    let why: BTreeMap<&str, &str> = g
        .rejects
        .iter()
        .map(|(p, w)| (p.as_str(), w.as_str()))
        .collect();
    assert_eq!(
        why.keys().copied().collect::<Vec<_>>(),
        ["a", "d", "e", "f"]
    );
    assert!(
        why["a"].starts_with("Rows x Columns 8x3 differ from its series' 4x3"),
        "{why:?}"
    );
    assert!(
        why["d"].contains("signed") && why["d"].contains("unsigned"),
        "{why:?}"
    );
    assert!(why["e"].contains("Pixel Spacing 0.5\\0.6"), "{why:?}");
    assert!(why["f"].contains("Image Orientation"), "{why:?}");
    assert!(why["a"].ends_with("(series 1.1)"), "{why:?}");
    assert_eq!(order(plan(&g.groups[0])), [vec!["b"], vec!["c"], vec!["g"]]);
}

#[test]
fn a_series_in_two_classes_is_rejected_whole() {
    let g = group(
        vec![
            input("x/a", "x", h("1.1", 0.0)),
            input("x/b", "x", h("1.1", 1.0)),
            input("y/c", "y", h("1.1", 2.0)),
            input("y/d", "y", h("1.2", 0.0)),
        ],
        2,
    );
    assert_eq!(g.rejects.len(), 3);
    assert!(g
        .rejects
        .iter()
        .all(|(_, w)| w.contains("2 classes (x: 2, y: 1)")));
    assert_eq!(g.groups.len(), 1);
    assert!(matches!(&g.groups[0].what, What::File { rel, .. } if rel == "y/d"));
}

#[test]
fn uneven_spacing_refuses_reslicing_only() {
    let files = || {
        [0.0, 2.0, 4.0, 8.0]
            .iter()
            .enumerate()
            .map(|(i, &z)| input(&format!("f{i}"), "c", h("1.1", z)))
            .collect::<Vec<_>>()
    };
    let g = group(files(), 0);
    assert_eq!(g.rejects.len(), 4);
    assert!(
        g.rejects[0].1.contains("uneven slice spacing"),
        "{:?}",
        g.rejects
    );
    assert!(
        g.rejects[0].1.contains("4.0000 mm between f2 and f3"),
        "{:?}",
        g.rejects
    );
    assert!(g.groups.is_empty());
    let g = group(files(), 2);
    assert!(g.rejects.is_empty());
    assert_eq!(g.uneven.len(), 1);
    assert_eq!(plan(&g.groups[0]).slots.len(), 4);
    // 1% of the spacing is tolerated.
    let even = [0.0, 2.0, 4.019, 6.0]
        .iter()
        .enumerate()
        .map(|(i, &z)| input(&format!("f{i}"), "c", h("1.1", z)))
        .collect();
    let g = group(even, 0);
    assert!(
        g.rejects.is_empty() && g.uneven.is_empty(),
        "{:?}",
        g.rejects
    );
}

#[test]
fn instance_numbers_order_where_positions_cannot() {
    let with = |n: Option<i64>, o: Option<[f64; 6]>| SeriesHeader {
        instance: n,
        orientation: o,
        ..h("1.1", 0.0)
    };
    // A degenerate orientation: positions cannot be ordered.
    let zero = Some([0.0; 6]);
    let g = group(
        vec![
            input("a", "c", with(Some(3), zero)),
            input("b", "c", with(Some(1), zero)),
            input("c", "c", with(None, zero)),
            input("d", "c", with(Some(2), zero)),
            input("e", "c", with(Some(1), zero)),
        ],
        2,
    );
    assert_eq!(g.rejects.len(), 1);
    assert_eq!(g.rejects[0].0, "c");
    assert!(g.rejects[0].1.contains("no Instance Number"));
    let p = plan(&g.groups[0]);
    assert_eq!(p.order, Order::InstanceNumber);
    assert_eq!(order(p), [vec!["b", "e"], vec!["d"], vec!["a"]]);
    // No position on one file: instance numbers for all.
    let mut nopos = with(Some(1), Some(AXIAL));
    nopos.position = None;
    let g = group(
        vec![
            input(
                "a",
                "c",
                SeriesHeader {
                    position: Some([0.0, 0.0, -5.0]),
                    ..with(Some(2), Some(AXIAL))
                },
            ),
            input("b", "c", nopos),
        ],
        2,
    );
    assert_eq!(order(plan(&g.groups[0])), [vec!["b"], vec!["a"]]);
}

#[test]
fn lone_files_and_split_keys() {
    let multi = SeriesHeader {
        frames: 10,
        patient_id: Some("P1".into()),
        ..h("1.1", 0.0)
    };
    let no_uid = SeriesHeader {
        series_uid: None,
        study_uid: Some("9.9".into()),
        ..h("", 0.0)
    };
    let bare = SeriesHeader {
        series_uid: None,
        ..h("", 0.0)
    };
    let g = group(
        vec![
            input("m", "c", multi),
            input("n", "c", no_uid),
            input("o", "c", bare),
            input("s1", "c", h("2.2", 0.0)),
            input(
                "s2",
                "c",
                SeriesHeader {
                    patient_id: Some("P7".into()),
                    ..h("2.2", 1.0)
                },
            ),
            input("t", "c", h("3.3", 0.0)),
        ],
        2,
    );
    let keys: Vec<(&str, SplitKey, &str, bool)> = g
        .groups
        .iter()
        .map(|g| {
            (
                g.first.as_str(),
                g.key,
                g.key_value.as_str(),
                matches!(g.what, What::File { .. }),
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            ("m", SplitKey::PatientId, "P1", true),
            ("n", SplitKey::StudyUid, "9.9", true),
            ("o", SplitKey::Path, "o", true),
            ("s1", SplitKey::PatientId, "P7", false),
            ("t", SplitKey::SeriesUid, "3.3", true),
        ]
    );
}

#[test]
fn absurd_series_and_colour_reslicing_are_refused() {
    let big = |z: f64| SeriesHeader {
        rows: 65535,
        cols: 65535,
        ..h("1.1", z)
    };
    let g = group(
        (0..3)
            .map(|i| input(&format!("f{i}"), "c", big(i as f64)))
            .collect(),
        2,
    );
    assert_eq!(g.rejects.len(), 3);
    assert!(g.rejects[0].1.contains("too large"), "{:?}", g.rejects);
    let rgb = |z: f64| SeriesHeader {
        samples_per_pixel: 3,
        photometric: "RGB".into(),
        ..h("1.1", z)
    };
    let files = || {
        (0..3)
            .map(|i| input(&format!("f{i}"), "c", rgb(i as f64)))
            .collect()
    };
    let g = group(files(), 1);
    assert_eq!(g.rejects.len(), 3);
    assert!(g.rejects[0].1.contains("colour"), "{:?}", g.rejects);
    let g = group(files(), 2);
    assert!(plan(&g.groups[0]).colour);
}
