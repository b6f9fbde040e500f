//! Checkpoints in safetensors: every tensor of the model and optimiser (f32), plus a JSON
//! `prep` metadata entry with the run's cursor and the partial epoch's running figures, so a
//! killed run resumes exactly where its last checkpoint was taken.

use crate::error::{Error, IoContext, Result};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
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
    pub train_seconds: f64,
}

pub fn save(path: &Path, tensors: &[(String, Vec<f32>)], cursor: &Cursor) -> Result<()> {
    let bytes: Vec<(String, Vec<u8>, usize)> = tensors
        .iter()
        .map(|(n, v)| {
            (
                n.clone(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                v.len(),
            )
        })
        .collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, b, len)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, vec![*len], b).expect("sizes match"),
            )
        })
        .collect();
    let mut meta = HashMap::new();
    meta.insert(
        "prep".to_string(),
        serde_json::to_string(cursor).expect("serialises"),
    );
    let data = safetensors::serialize(views, Some(meta))
        .map_err(|e| Error::Invalid(format!("checkpoint: {e}")))?;
    crate::shard::manifest::write_atomic(path, &data)
}

pub fn load(path: &Path) -> Result<(Vec<(String, Vec<f32>)>, Cursor)> {
    let data = std::fs::read(path).at(path)?;
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
