//! Sample fields (format version 3): what a sample carries beside its image and class. Each kind
//! knows its bytes, the rules a reader enforces on its values and how it is summarised, so adding
//! a kind touches this file, not every reader (`formats/shard.md`, "Fields").
//!
//! In a block the fields follow the labels, field after field in declaration order, each holding
//! its value for every sample of the block in order (`n * bytes` bytes).

use super::shard::Dtype;
use serde::{Deserialize, Serialize};

/// Most names a field declares (mask values, labels, values, metadata keys).
pub const MAX_NAMES: usize = 1 << 16;
/// Most bytes a sample's metadata takes.
pub const MAX_META_BYTES: usize = 4096;
pub use super::shard::format::MAX_FIELDS;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldKind {
    /// An integer map of the image's spatial shape: value `v` is `names[v]` (0 is background
    /// unless named otherwise); u8 or u16.
    Mask,
    /// K-hot over `names` (multi-label): u8 values 0 or 1.
    Labels,
    /// K named float32 targets (regression): finite.
    Values,
    /// Small per-sample facts (source path, patient, series, slice, frame time): a compact
    /// JSON object of strings, numbers, booleans or nulls under the declared keys (`names`),
    /// zero-padded to the field's size (`shape = [bytes]`); all zeros is no metadata.
    Meta,
}

impl FieldKind {
    pub fn name(self) -> &'static str {
        match self {
            FieldKind::Mask => "mask",
            FieldKind::Labels => "labels",
            FieldKind::Values => "values",
            FieldKind::Meta => "meta",
        }
    }
}

/// One declared field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Field {
    pub name: String,
    pub kind: FieldKind,
    pub dtype: Dtype,
    /// A mask: the image's spatial dimensions (H x W, or D x H x W); labels and values: [K].
    pub shape: Vec<u32>,
    /// What each value means: a mask's value names, the labels, the values.
    pub names: Vec<String>,
}

impl Field {
    pub fn mask(name: &str, image_shape: &[u32], dtype: Dtype, names: Vec<String>) -> Field {
        Field {
            name: name.into(),
            kind: FieldKind::Mask,
            dtype,
            shape: image_shape[1..].to_vec(),
            names,
        }
    }
    pub fn labels(name: &str, names: Vec<String>) -> Field {
        Field {
            name: name.into(),
            kind: FieldKind::Labels,
            dtype: Dtype::U8,
            shape: vec![names.len() as u32],
            names,
        }
    }
    pub fn values(name: &str, names: Vec<String>) -> Field {
        Field {
            name: name.into(),
            kind: FieldKind::Values,
            dtype: Dtype::F32,
            shape: vec![names.len() as u32],
            names,
        }
    }
    /// Metadata under `keys`, each sample's at most `bytes` bytes of JSON.
    pub fn meta(name: &str, keys: Vec<String>, bytes: usize) -> Field {
        Field {
            name: name.into(),
            kind: FieldKind::Meta,
            dtype: Dtype::U8,
            shape: vec![bytes as u32],
            names: keys,
        }
    }

    /// One sample's metadata as this field stores it: compact JSON, zero-padded. Err: a key not
    /// declared, a value that is not a string, number, boolean or null, or too many bytes.
    pub fn encode_meta(
        &self,
        obj: &serde_json::Map<String, serde_json::Value>,
    ) -> std::result::Result<Vec<u8>, String> {
        if let Some(why) = self.meta_rule(obj) {
            return Err(why);
        }
        let mut v = serde_json::to_vec(obj).map_err(|e| e.to_string())?;
        if v.len() > self.bytes() {
            return Err(format!(
                "metadata of {} bytes, over the {} of field {}",
                v.len(),
                self.bytes(),
                self.name
            ));
        }
        v.resize(self.bytes(), 0);
        Ok(v)
    }

    /// One sample's metadata back (empty for all zeros); None if the bytes break the rules.
    pub fn decode_meta(&self, v: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
        let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
        if v[end..].iter().any(|&b| b != 0) {
            return None;
        }
        if end == 0 {
            return Some(Default::default());
        }
        let obj: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&v[..end]).ok()?;
        self.meta_rule(&obj).is_none().then_some(obj)
    }

    fn meta_rule(&self, obj: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
        use serde_json::Value;
        obj.iter().find_map(|(k, v)| {
            if !self.names.iter().any(|n| n == k) {
                Some(format!("metadata key {k:?} is not one of the field's keys"))
            } else if matches!(v, Value::Array(_) | Value::Object(_)) {
                Some(format!(
                    "metadata {k:?} is not a string, number, boolean or null"
                ))
            } else {
                None
            }
        })
    }

    /// Values per sample.
    pub fn elems(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }
    /// Bytes per sample.
    pub fn bytes(&self) -> usize {
        self.elems() * self.dtype.size()
    }

    /// The declaration's own rules, for a dataset of images of `image_shape` (C first).
    pub fn validate(&self, image_shape: &[u32]) -> std::result::Result<(), String> {
        let n = &self.name;
        let ok_name = !n.is_empty()
            && n.len() <= 64
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok_name {
            return Err(format!(
                "field name {n:?} is not 1 to 64 of A-Z a-z 0-9 _ -"
            ));
        }
        if matches!(n.as_str(), "image" | "class" | "label") {
            return Err(format!(
                "field name {n:?} is reserved (the image and its class)"
            ));
        }
        let k = self.kind.name();
        if self.names.is_empty() || self.names.len() > MAX_NAMES {
            return Err(format!(
                "field {n} ({k}) declares {} names, expected 1 to {MAX_NAMES}",
                self.names.len()
            ));
        }
        match self.kind {
            FieldKind::Mask => {
                if !matches!(self.dtype, Dtype::U8 | Dtype::U16) {
                    return Err(format!(
                        "field {n} (mask) is {}, expected u8 or u16",
                        self.dtype
                    ));
                }
                if self.dtype == Dtype::U8 && self.names.len() > 256 {
                    return Err(format!(
                        "field {n} (mask) names {} values, more than a u8 holds",
                        self.names.len()
                    ));
                }
                if self.shape.as_slice() != &image_shape[1..] {
                    return Err(format!(
                        "field {n} (mask) is {:?}, the images' spatial shape is {:?}",
                        self.shape,
                        &image_shape[1..]
                    ));
                }
            }
            FieldKind::Meta => {
                if self.dtype != Dtype::U8 {
                    return Err(format!("field {n} (meta) is {}, expected u8", self.dtype));
                }
                let ok =
                    matches!(self.shape.as_slice(), [b] if (2..=MAX_META_BYTES as u32).contains(b));
                if !ok {
                    return Err(format!(
                        "field {n} (meta) has shape {:?}, expected [bytes] of 2 to {MAX_META_BYTES}",
                        self.shape
                    ));
                }
            }
            FieldKind::Labels | FieldKind::Values => {
                let want = if self.kind == FieldKind::Labels {
                    Dtype::U8
                } else {
                    Dtype::F32
                };
                if self.dtype != want {
                    return Err(format!(
                        "field {n} ({k}) is {}, expected {want}",
                        self.dtype
                    ));
                }
                if self.shape != [self.names.len() as u32] {
                    return Err(format!(
                        "field {n} ({k}) has shape {:?} for {} names",
                        self.shape,
                        self.names.len()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The first value of `values` (this field for `values.len() / bytes` samples) a reader
    /// refuses, as (sample, value index, why).
    pub fn first_bad(&self, values: &[u8]) -> Option<(usize, usize, String)> {
        let e = self.elems().max(1);
        let at = |i: usize| (i / e, i % e);
        match (self.kind, self.dtype) {
            (FieldKind::Mask, Dtype::U8) => {
                let k = self.names.len();
                // The largest value first: a scan the compiler vectorises, where a search for
                // the first bad one stops it.
                if (*values.iter().max()? as usize) < k {
                    return None;
                }
                let i = values.iter().position(|&v| v as usize >= k)?;
                let (s, p) = at(i);
                Some((
                    s,
                    p,
                    format!("mask value {} beyond its {k} names", values[i]),
                ))
            }
            (FieldKind::Mask, _) => {
                let k = self.names.len();
                let i = values
                    .chunks_exact(2)
                    .position(|b| u16::from_le_bytes([b[0], b[1]]) as usize >= k)?;
                let v = u16::from_le_bytes([values[2 * i], values[2 * i + 1]]);
                let (s, p) = at(i);
                Some((s, p, format!("mask value {v} beyond its {k} names")))
            }
            (FieldKind::Labels, _) => {
                if *values.iter().max()? <= 1 {
                    return None;
                }
                let i = values.iter().position(|&v| v > 1)?;
                let (s, p) = at(i);
                Some((s, p, format!("label value {} is not 0 or 1", values[i])))
            }
            (FieldKind::Values, _) => {
                let (i, v) = super::shard::first_non_finite(Dtype::F32, values)?;
                let (s, p) = at(i);
                Some((s, p, format!("value {v} is not finite")))
            }
            (FieldKind::Meta, _) => {
                let s = values
                    .chunks_exact(e)
                    .position(|v| self.decode_meta(v).is_none())?;
                Some((
                    s,
                    0,
                    "metadata that is not a JSON object of the field's keys, zero-padded".into(),
                ))
            }
        }
    }
}

/// The fields a dataset declares, in block order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fields(pub Vec<Field>);

impl Fields {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn iter(&self) -> std::slice::Iter<'_, Field> {
        self.0.iter()
    }
    /// Bytes of every field of one sample.
    pub fn bytes(&self) -> usize {
        self.0.iter().map(Field::bytes).sum()
    }
    /// Field `f`'s bytes within the fields region of a block of `n` samples.
    pub fn range(&self, f: usize, n: usize) -> std::ops::Range<usize> {
        let start: usize = self.0[..f].iter().map(|x| n * x.bytes()).sum();
        start..start + n * self.0[f].bytes()
    }
    pub fn find(&self, name: &str) -> Option<usize> {
        self.0.iter().position(|f| f.name == name)
    }

    /// Every declaration's rules, and names unique.
    pub fn validate(&self, image_shape: &[u32]) -> std::result::Result<(), String> {
        if self.0.len() > MAX_FIELDS {
            return Err(format!(
                "{} fields declared, at most {MAX_FIELDS}",
                self.0.len()
            ));
        }
        for (i, f) in self.0.iter().enumerate() {
            f.validate(image_shape)?;
            if self.0[..i].iter().any(|g| g.name == f.name) {
                return Err(format!("field {} is declared twice", f.name));
            }
        }
        if self.bytes() as u64 > super::shard::MAX_SAMPLE_BYTES {
            return Err(format!(
                "the fields of a sample are {} bytes, over the {}-byte cap",
                self.bytes(),
                super::shard::MAX_SAMPLE_BYTES
            ));
        }
        Ok(())
    }

    /// The first value in a block's fields region (`n` samples) that a reader refuses, as
    /// (field name, sample, value index, why).
    pub fn first_bad(&self, region: &[u8], n: usize) -> Option<(String, usize, usize, String)> {
        self.0.iter().enumerate().find_map(|(f, field)| {
            let (s, p, why) = field.first_bad(&region[self.range(f, n)])?;
            Some((field.name.clone(), s, p, why))
        })
    }

    /// Per-field summaries of a block's fields region (`n` samples).
    pub fn summarise(&self, region: &[u8], n: usize) -> Vec<FieldStats> {
        self.0
            .iter()
            .enumerate()
            .map(|(f, field)| FieldStats::of(field, &region[self.range(f, n)]))
            .collect()
    }
}

/// What a field's values come to over a shard or a split: a mask's pixels per value and a
/// labels field's samples per label (`counts`); a values field's per-name minimum, maximum, sum
/// and sum of squares (f64, added in sample order).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FieldStats {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counts: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub min: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub max: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sum: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sumsq: Vec<f64>,
}

impl FieldStats {
    /// Nothing seen yet.
    pub fn empty(f: &Field) -> Self {
        let k = f.names.len();
        match f.kind {
            FieldKind::Mask | FieldKind::Labels | FieldKind::Meta => FieldStats {
                counts: vec![0; k],
                ..Default::default()
            },
            FieldKind::Values => FieldStats {
                min: vec![f64::INFINITY; k],
                max: vec![f64::NEG_INFINITY; k],
                sum: vec![0.0; k],
                sumsq: vec![0.0; k],
                ..Default::default()
            },
        }
    }

    /// Of `values`, this field's bytes for some samples (already checked by `first_bad`).
    pub fn of(f: &Field, values: &[u8]) -> Self {
        let mut s = FieldStats::empty(f);
        let k = f.names.len();
        match (f.kind, f.dtype) {
            (FieldKind::Mask, Dtype::U8) => {
                // Four tables, so that runs of one value do not wait on one counter.
                let mut c = [[0u64; 256]; 4];
                let mut quads = values.chunks_exact(4);
                for q in &mut quads {
                    c[0][q[0] as usize] += 1;
                    c[1][q[1] as usize] += 1;
                    c[2][q[2] as usize] += 1;
                    c[3][q[3] as usize] += 1;
                }
                for &v in quads.remainder() {
                    c[0][v as usize] += 1;
                }
                for (j, n) in s.counts.iter_mut().enumerate() {
                    *n = c[0][j] + c[1][j] + c[2][j] + c[3][j];
                }
            }
            (FieldKind::Mask, _) => {
                for b in values.chunks_exact(2) {
                    s.counts[u16::from_le_bytes([b[0], b[1]]) as usize] += 1;
                }
            }
            (FieldKind::Labels, _) => {
                for sample in values.chunks_exact(k) {
                    for (c, &v) in s.counts.iter_mut().zip(sample) {
                        *c += v as u64;
                    }
                }
            }
            (FieldKind::Meta, _) => {
                // Samples that have each key.
                for sample in values.chunks_exact(f.bytes()) {
                    for key in f.decode_meta(sample).unwrap_or_default().keys() {
                        if let Some(j) = f.names.iter().position(|n| n == key) {
                            s.counts[j] += 1;
                        }
                    }
                }
            }
            (FieldKind::Values, _) => {
                for sample in values.chunks_exact(4 * k) {
                    for j in 0..k {
                        let v = f32::from_le_bytes(sample[4 * j..4 * j + 4].try_into().unwrap());
                        let v = v as f64;
                        s.min[j] = s.min[j].min(v);
                        s.max[j] = s.max[j].max(v);
                        s.sum[j] += v;
                        s.sumsq[j] += v * v;
                    }
                }
            }
        }
        s
    }

    /// Add `o` (of the same field) to these.
    pub fn add(&mut self, o: &FieldStats) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        for (a, b) in self.min.iter_mut().zip(&o.min) {
            *a = a.min(*b);
        }
        for (a, b) in self.max.iter_mut().zip(&o.max) {
            *a = a.max(*b);
        }
        for (a, b) in self.sum.iter_mut().zip(&o.sum) {
            *a += b;
        }
        for (a, b) in self.sumsq.iter_mut().zip(&o.sumsq) {
            *a += b;
        }
    }

    /// Whether these can be a summary of `f` over `samples` samples: the right lengths, counts
    /// that fit, finite sums. (A manifest's summaries are checked as it is read.)
    pub fn fits(&self, f: &Field, samples: u64) -> bool {
        let k = f.names.len();
        match f.kind {
            FieldKind::Mask => {
                let pixels = samples.checked_mul(f.elems() as u64);
                self.counts.len() == k
                    && self.min.is_empty()
                    && super::shard::format::checked_sum(&self.counts) == pixels
            }
            FieldKind::Labels | FieldKind::Meta => {
                self.counts.len() == k
                    && self.min.is_empty()
                    && self.counts.iter().all(|&c| c <= samples)
            }
            FieldKind::Values => {
                let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
                self.counts.is_empty()
                    && [&self.min, &self.max, &self.sum, &self.sumsq]
                        .iter()
                        .all(|v| v.len() == k)
                    && finite(&self.sum)
                    && finite(&self.sumsq)
                    && (samples == 0 || (finite(&self.min) && finite(&self.max)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i}")).collect()
    }

    #[test]
    fn declarations_are_checked_against_the_image() {
        let img = [3, 8, 6];
        assert!(Field::mask("seg", &img, Dtype::U8, names(3))
            .validate(&img)
            .is_ok());
        let e = Field::mask("seg", &[3, 8, 5], Dtype::U8, names(3))
            .validate(&img)
            .unwrap_err();
        assert!(e.contains("spatial shape"), "{e}");
        let e = Field::mask("seg", &img, Dtype::U8, names(300))
            .validate(&img)
            .unwrap_err();
        assert!(e.contains("more than a u8 holds"), "{e}");
        assert!(Field::mask("seg", &img, Dtype::U16, names(300))
            .validate(&img)
            .is_ok());
        let e = Field::labels("class", names(2)).validate(&img).unwrap_err();
        assert!(e.contains("reserved"), "{e}");
        let e = Field::values("bad name", names(2))
            .validate(&img)
            .unwrap_err();
        assert!(e.contains("A-Z"), "{e}");
        let e = Field::values("v", vec![]).validate(&img).unwrap_err();
        assert!(e.contains("0 names"), "{e}");
        let two = Fields(vec![
            Field::values("v", names(1)),
            Field::labels("v", names(2)),
        ]);
        assert!(two.validate(&img).unwrap_err().contains("twice"));
    }

    #[test]
    fn values_beyond_the_rules_are_found_where_they_are() {
        let img = [1, 2, 2];
        let m = Field::mask("seg", &img, Dtype::U8, names(3));
        assert_eq!(
            m.first_bad(&[0, 1, 2, 2, 0, 0, 3, 1]),
            Some((1, 2, "mask value 3 beyond its 3 names".into()))
        );
        let m16 = Field::mask("seg", &img, Dtype::U16, names(3));
        let v: Vec<u8> = [0u16, 2, 9, 1]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(m16.first_bad(&v).unwrap().1, 2);
        let l = Field::labels("tags", names(3));
        assert_eq!(l.first_bad(&[0, 1, 1, 1, 2, 0]).unwrap().0, 1);
        let vf = Field::values("age", names(2));
        let v: Vec<u8> = [1.0f32, 2.0, f32::NAN, 0.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(vf.first_bad(&v).unwrap().0, 1);
        let ok: Vec<u8> = [1.0f32, -2.5]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert!(vf.first_bad(&ok).is_none());
    }

    #[test]
    fn metadata_is_a_padded_object_of_the_declared_keys() {
        let f = Field::meta("meta", vec!["source".into(), "frame".into()], 48);
        assert!(f.validate(&[1, 2, 2]).is_ok());
        let obj = serde_json::json!({"source": "a/b.mp4", "frame": 3});
        let v = f.encode_meta(obj.as_object().unwrap()).unwrap();
        assert_eq!(v.len(), 48);
        assert_eq!(f.decode_meta(&v).unwrap(), *obj.as_object().unwrap());
        assert!(f.decode_meta(&[0; 48]).unwrap().is_empty());
        let bad = serde_json::json!({"patient": "x"});
        assert!(f
            .encode_meta(bad.as_object().unwrap())
            .unwrap_err()
            .contains("patient"));
        let nested = serde_json::json!({"frame": [1, 2]});
        assert!(f.encode_meta(nested.as_object().unwrap()).is_err());
        let long = serde_json::json!({"source": "x".repeat(60)});
        assert!(f
            .encode_meta(long.as_object().unwrap())
            .unwrap_err()
            .contains("over"));
        // Two samples, the second with bytes after its padding starts, then one not JSON.
        let mut two = v.clone();
        two.extend(&v);
        assert!(f.first_bad(&two).is_none());
        two[48 + 40] = b'x';
        assert_eq!(f.first_bad(&two).unwrap().0, 1);
        let mut junk = vec![0u8; 48];
        junk[..5].copy_from_slice(b"{\"so\"");
        assert_eq!(f.first_bad(&junk).unwrap().0, 0);
        let st = FieldStats::of(&f, &v);
        assert_eq!(st.counts, vec![1, 1]);
        assert!(st.fits(&f, 1) && !st.fits(&f, 0));
        let e = Field::meta("meta", vec!["a".into()], 1 << 20)
            .validate(&[1, 2, 2])
            .unwrap_err();
        assert!(e.contains("bytes"), "{e}");
    }

    #[test]
    fn summaries_add_up_and_fit() {
        let img = [1, 1, 2];
        let fs = Fields(vec![
            Field::mask("seg", &img, Dtype::U8, names(3)),
            Field::labels("tags", names(2)),
            Field::values("v", names(1)),
        ]);
        assert_eq!(fs.bytes(), 2 + 2 + 4);
        // Two samples: masks [0,2] [1,1]; labels [1,0] [1,1]; values 3.0, -1.0.
        let mut region = vec![0u8, 2, 1, 1, 1, 0, 1, 1];
        region.extend(3.0f32.to_le_bytes());
        region.extend((-1.0f32).to_le_bytes());
        assert_eq!(fs.range(1, 2), 4..8);
        assert!(fs.first_bad(&region, 2).is_none());
        let s = fs.summarise(&region, 2);
        assert_eq!(s[0].counts, vec![1, 2, 1]);
        assert_eq!(s[1].counts, vec![2, 1]);
        assert_eq!(
            (s[2].min[0], s[2].max[0], s[2].sum[0], s[2].sumsq[0]),
            (-1.0, 3.0, 2.0, 10.0)
        );
        for (f, st) in fs.iter().zip(&s) {
            assert!(st.fits(f, 2), "{}", f.name);
        }
        // Four mask pixels counted for one sample of two pixels; a label seen more often than
        // there are samples.
        assert!(!s[0].fits(&fs.0[0], 1));
        assert!(!s[1].fits(&fs.0[1], 1));
        assert!(!FieldStats::default().fits(&fs.0[2], 2));
        let mut a = s[2].clone();
        a.add(&s[2]);
        assert_eq!(a.sum[0], 4.0);
    }
}
