//! Sample fields (format version 3) through the library's writer and every reader: the values come
//! back as written, the summaries add up, and a reader refuses what breaks a field's rules.

use crate::util::{run, stderr, stdout};
use prep::format::fields::{Field, FieldKind, Fields};
use prep::format::shard::manifest::{Provenance, SplitInfo};
use prep::format::shard::{
    Block, Codec, Dataset, Dtype, Manifest, SampleSpec, Shape, ShardReader, SplitWriter,
};
use std::collections::BTreeMap;
use std::path::Path;

fn names(p: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{p}{i}")).collect()
}

/// Mask `seg` (3 names, u8), labels `tags` (4), values `size` (2) on 1x6x5 u8 images.
pub fn fields_for(shape: &[u32]) -> Fields {
    Fields(vec![
        Field::mask("seg", shape, Dtype::U8, names("m", 3)),
        Field::labels("tags", names("t", 4)),
        Field::values("size", names("v", 2)),
    ])
}

/// Sample `i`'s image, class, mask, labels and values: functions of `i` alone.
pub fn sample(i: usize, shape: &[u32]) -> (Vec<u8>, u32, Vec<u8>, Vec<u8>, Vec<f32>) {
    let plane = (shape[1] * shape[2]) as usize;
    let img: Vec<u8> = (0..plane * shape[0] as usize)
        .map(|p| ((i * 7 + p * 3) % 251) as u8)
        .collect();
    let mask: Vec<u8> = (0..plane).map(|p| ((i + p) % 3) as u8).collect();
    let labels: Vec<u8> = (0..4).map(|k| ((i >> k) & 1) as u8).collect();
    let values = vec![i as f32 * 0.5 - 3.0, (i % 7) as f32 / 3.0];
    (img, (i % 2) as u32, mask, labels, values)
}

/// A dataset of `n` train samples (blocks of 16, shards of 2 blocks) carrying `fields_for`.
pub fn write_dataset(dir: &Path, n: usize, codec: Codec) -> Fields {
    let shape = [1u32, 6, 5];
    let spec = SampleSpec {
        shape: Shape::new(shape.to_vec()).unwrap(),
        dtype: Dtype::U8,
    };
    let fields = fields_for(&shape);
    let mut w = SplitWriter::new(dir, "train", &spec, codec, 2, 2).with_fields(&fields);
    for start in (0..n).step_by(16) {
        let m = 16.min(n - start);
        let mut b = Block::with_fields(m, spec.bytes(), fields.bytes());
        for j in 0..m {
            let (img, class, mask, labels, values) = sample(start + j, &shape);
            b.sample_mut(j).copy_from_slice(&img);
            b.set_label(j, class);
            b.field_mut(&fields, 0, j).copy_from_slice(&mask);
            b.field_mut(&fields, 1, j).copy_from_slice(&labels);
            let v: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            b.field_mut(&fields, 2, j).copy_from_slice(&v);
        }
        w.push(&b.encode_fields(&spec, 2, codec, &fields).unwrap())
            .unwrap();
    }
    let shards = w.finish().unwrap();
    let mut splits = BTreeMap::new();
    splits.insert("train".into(), SplitInfo::from_shards(&spec, 2, shards));
    let prov = Provenance::here(serde_json::json!({"test": "fields"}));
    Manifest::new(spec, names("c", 2), codec, 16, splits, prov)
        .with_fields(fields.clone())
        .write(dir)
        .unwrap();
    fields
}

#[test]
fn fields_come_back_as_written_and_their_summaries_add_up() {
    for codec in [Codec::None, Codec::Zstd { level: 1 }] {
        let d = tempfile::tempdir().unwrap();
        let fields = write_dataset(d.path(), 100, codec);
        let ds = Dataset::open(d.path()).unwrap();
        assert_eq!(ds.manifest.version, 3);
        assert_eq!(ds.manifest.fields, fields);
        let shape = [1u32, 6, 5];
        let mut i = 0;
        let (mut mask_counts, mut label_counts, mut sum0) = (vec![0u64; 3], vec![0u64; 4], 0f64);
        for (_, sh) in ds.shards() {
            let r = ds.open_shard(sh).unwrap();
            assert_eq!(r.header.num_fields, 3);
            for b in 0..r.num_blocks() {
                let block = r.read_block(b).unwrap();
                for j in 0..block.len() {
                    let (img, class, mask, labels, values) = sample(i, &shape);
                    assert_eq!(block.sample(j), &img[..]);
                    assert_eq!(block.label(j), class);
                    assert_eq!(block.field(&fields, 0, j), &mask[..]);
                    assert_eq!(block.field(&fields, 1, j), &labels[..]);
                    let v: Vec<f32> = block
                        .field(&fields, 2, j)
                        .chunks(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    assert_eq!(v, values, "values bit-exact in f32");
                    mask.iter().for_each(|&m| mask_counts[m as usize] += 1);
                    labels
                        .iter()
                        .enumerate()
                        .for_each(|(k, &l)| label_counts[k] += l as u64);
                    sum0 += values[0] as f64;
                    i += 1;
                }
            }
        }
        assert_eq!(i, 100);
        let split = &ds.manifest.splits["train"];
        assert_eq!(split.fields[0].counts, mask_counts);
        assert_eq!(split.fields[1].counts, label_counts);
        assert_eq!(split.fields[2].sum[0], sum0);
        assert_eq!(split.fields[2].min[0], -3.0);
        // Every reader of the CLI takes it: verify reads every block, inspect summarises.
        let p = d.path().to_str().unwrap();
        let v = run(&["verify", p], 0);
        assert!(stdout(&v).contains("OK"), "{}", stdout(&v));
        let i = stdout(&run(&["inspect", p], 0));
        for want in [
            "field seg (mask u8 6x5): share of pixels",
            "field tags (labels u8 4): samples with the label",
            "field size (values f32 2): min .. max, mean +- std",
            "-3.0000 .. 46.5000",
        ] {
            assert!(i.contains(want), "{want}:\n{i}");
        }
        let j: serde_json::Value =
            serde_json::from_slice(&run(&["inspect", p, "--json"], 0).stdout).unwrap();
        assert_eq!(j["fields"][0]["name"], "seg");
        assert_eq!(j["splits"][0]["fields"][1]["counts"][0], label_counts[0]);
    }
}

#[test]
fn a_reader_refuses_values_beyond_a_fields_rules_and_names_the_field() {
    let d = tempfile::tempdir().unwrap();
    let fields = write_dataset(d.path(), 40, Codec::Zstd { level: 1 });
    let ds = Dataset::open(d.path()).unwrap();
    let sh = &ds.manifest.splits["train"].shards[0];
    // The same bytes read under a declaration of two mask values: value 2 is beyond them.
    let mut two = fields.clone();
    two.0[0].names.truncate(2);
    let r = ShardReader::open(ds.shard_path(sh))
        .unwrap()
        .with_fields(two);
    let e = r.read_block(0).unwrap_err().to_string();
    assert!(
        e.contains("block 0")
            && e.contains("field seg")
            && e.contains("mask value 2 beyond its 2 names"),
        "{e}"
    );
    // Labels declared as values (same bytes per sample? no: refused at open by size).
    let mut m = ds.manifest.clone();
    m.fields.0.truncate(2);
    for s in m.splits.values_mut() {
        s.fields.truncate(2);
        s.shards.iter_mut().for_each(|sh| sh.fields.truncate(2));
    }
    m.write(d.path()).unwrap();
    let ds = Dataset::open(d.path()).unwrap();
    let e = ds.open_shard(sh).map(|_| ()).unwrap_err().to_string();
    assert!(
        e.contains("holds 3 fields of 42 bytes a sample, the manifest declares 2 of 34"),
        "{e}"
    );
    let o = run(&["verify", d.path().to_str().unwrap()], 1);
    assert!(
        stdout(&o).contains("manifest declares 2") || stderr(&o).contains("manifest declares 2")
    );
}

#[test]
fn a_manifest_whose_fields_break_the_rules_is_refused_naming_them() {
    let d = tempfile::tempdir().unwrap();
    write_dataset(d.path(), 20, Codec::None);
    let good = Dataset::open(d.path()).unwrap().manifest;
    let cases: Vec<(&str, Box<dyn Fn(&mut Manifest)>)> = vec![
        (
            "spatial shape",
            Box::new(|m| m.fields.0[0].shape = vec![5, 6]),
        ),
        (
            "reserved",
            Box::new(|m| m.fields.0[1].name = "class".into()),
        ),
        (
            "expected f32",
            Box::new(|m| m.fields.0[2].dtype = Dtype::U8),
        ),
        ("fields come with version 3", Box::new(|m| m.version = 2)),
        (
            "does not fit",
            Box::new(|m| m.splits.get_mut("train").unwrap().fields[0].counts[0] += 1),
        ),
        (
            "field summaries",
            Box::new(|m| {
                m.splits.get_mut("train").unwrap().shards[0].fields.pop();
            }),
        ),
        (
            "declared twice",
            Box::new(|m| {
                m.fields.0[2].name = "tags".into();
                m.fields.0[2].kind = FieldKind::Values;
            }),
        ),
    ];
    for (want, change) in cases {
        let mut m = good.clone();
        change(&mut m);
        m.write(d.path()).unwrap();
        let e = Dataset::open(d.path()).map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains(want) && e.contains("manifest.json"),
            "{want}: {e}"
        );
    }
}

#[test]
fn converting_a_dataset_with_fields_again_is_refused_rather_than_dropping_them() {
    let d = tempfile::tempdir().unwrap();
    let ds = d.path().join("ds");
    write_dataset(&ds, 40, Codec::Zstd { level: 1 });
    for (format, why) in [
        ("shards", "keeps only its images and classes"),
        (
            "colmajor",
            "column-major layout has images and class labels only",
        ),
    ] {
        let out = d.path().join(format);
        let o = crate::util::prep()
            .args([
                "convert",
                ds.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ])
            .args(["--format", format])
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_ne!(o.status.code(), Some(0));
        assert!(
            e.contains("carry fields (seg (mask), tags (labels), size (values))")
                && e.contains(why),
            "{e}"
        );
        assert!(!out.join("manifest.json").exists());
    }
}
