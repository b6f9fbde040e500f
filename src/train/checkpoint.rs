//! Checkpoints in safetensors: every tensor of the model and optimiser (f32), plus a JSON
//! `prep` metadata entry with the run's cursor and the partial epoch's running figures, so a
//! killed run resumes exactly where its last checkpoint was taken.

use crate::store::output::{OutFile, Temp};
use crate::util::error::{Error, IoContext, Result};
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::Path;

pub const FILE: &str = "checkpoint.safetensors";

/// Where training stands.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cursor {
    /// Epoch in progress (0-based); `epochs` when training is finished.
    pub epoch: usize,
    /// Batches of that epoch already trained on.
    pub batch: usize,
    /// Optimiser steps so far.
    pub step: usize,
    /// Running figures of the epoch in progress.
    pub loss_sum: f64,
    pub correct: u64,
    pub seen: u64,
    /// Pixels inside the images of the masks trained on (a mask task's accuracy counts the
    /// crop's padding out); 0 in checkpoints written before it was kept.
    #[serde(default)]
    pub pixels: u64,
    pub train_seconds: f64,
}

/// Written straight from the tensors to a temporary file, then renamed: no serialised copy of
/// the model in memory (for resnet18 that copy and the byte conversion were 280 MB of peak RSS).
/// The layout is safetensors' own (`serialize_to_file`: tensors by name, the header padded to 8
/// bytes), written here so that it goes through `crate::store::output` like every other file.
pub fn save(path: &Path, tensors: &[(String, Vec<f32>)], cursor: &Cursor) -> Result<()> {
    let mut sorted: Vec<&(String, Vec<f32>)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut infos = Vec::with_capacity(sorted.len());
    let mut offset = 0;
    for (name, v) in &sorted {
        let n = std::mem::size_of_val(v.as_slice());
        let info = TensorInfo {
            dtype: Dtype::F32,
            shape: vec![v.len()],
            data_offsets: (offset, offset + n),
        };
        infos.push((name.clone(), info));
        offset += n;
    }
    let mut meta = HashMap::new();
    meta.insert(
        "prep".to_string(),
        serde_json::to_string(cursor).expect("serialises"),
    );
    let header =
        Metadata::new(Some(meta), infos).map_err(|e| Error::Invalid(format!("checkpoint: {e}")))?;
    let mut header = serde_json::to_vec(&header).expect("serialises");
    header.resize(header.len().next_multiple_of(8), b' ');
    let tmp = Temp::of(path);
    let mut f = BufWriter::new(OutFile::create(tmp.path()).at(path)?);
    f.write_all(&(header.len() as u64).to_le_bytes()).at(path)?;
    f.write_all(&header).at(path)?;
    for (_, v) in sorted {
        f.write_all(le_bytes(v)).at(path)?;
    }
    let f = f
        .into_inner()
        .map_err(|e| Error::io(path, e.into_error()))?;
    f.file().sync_all().at(path)?;
    drop(f);
    tmp.rename_to(path)
}

/// The little-endian bytes of `v`, without a copy (safetensors stores little-endian).
fn le_bytes(v: &[f32]) -> &[u8] {
    #[cfg(target_endian = "little")]
    // SAFETY: any f32 is four initialised bytes, and u8 has no alignment requirement.
    unsafe {
        std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v))
    }
    #[cfg(not(target_endian = "little"))]
    compile_error!("checkpoints are written from little-endian memory")
}

pub fn load(path: &Path) -> Result<(Vec<(String, Vec<f32>)>, Cursor)> {
    // Far beyond any model here (resnet18: 45 MB); what is larger is no checkpoint of prep's.
    let data = crate::store::local::read_capped(path, 4 << 30, "a checkpoint")?;
    let bad = |what: String| Error::manifest(path, what);
    let (_, meta) = SafeTensors::read_metadata(&data)
        .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
    let cursor: Cursor = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("prep"))
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| bad("no prep training cursor in the metadata".into()))?;
    let st =
        SafeTensors::deserialize(&data).map_err(|e| bad(format!("not a safetensors file: {e}")))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(bad(format!(
                "tensor {name} is {:?}, expected F32",
                view.dtype()
            )));
        }
        let v = view
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        out.push((name, v));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((out, cursor))
}
