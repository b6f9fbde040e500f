//! `prep plan`: what a dataset of a given size will cost on disk, in host RAM and GPU memory for
//! each training input mode, and in generation time, before anything is written.
//!
//! The figures are estimates from the formats' exact sizes and from rates measured for
//! BENCHMARKS.md; the constants below say where each comes from.

use crate::format::shard::{default_block_samples, Dtype, SampleSpec, Shape};
use crate::nn::ModelConfig;
use serde::Serialize;

/// Shard size / raw size measured for `prep synth` output at the default zstd level 1
/// (BENCHMARKS.md: 25.1 GiB for 28.7 GiB decoded); real data compresses differently.
pub const SYNTH_ZSTD_RATIO: f64 = 0.875;
/// `prep synth` pixel throughput per core, bytes/s, measured on the 2-core CI-size machine
/// (BENCHMARKS.md: 3x32x32 samples).
pub const SYNTH_BYTES_PER_SEC_PER_CORE: f64 = 240e6;
/// Prefetch depth of the training input ring (batches in flight).
pub const PREFETCH_BATCHES: u64 = 4;

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub train: u64,
    pub test: u64,
    pub shape: Vec<u32>,
    pub dtype: String,
    pub batch: u64,
    pub cores: usize,
    pub disk: Vec<Row>,
    pub host_ram: Vec<Row>,
    pub gpu_memory: Vec<Row>,
    pub generation_seconds: f64,
    /// `--gpus N` with N of 2 or more: what the all-reduce of each step costs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaling: Option<Scaling>,
    pub notes: Vec<String>,
}

/// Bus bandwidth NCCL's all-reduce reaches between GPUs of one host over NVLink (H100/H200
/// class), bytes/s: an assumption, stated in the output (nccl-tests all_reduce_perf busbw).
pub const NVLINK_BUS_BYTES_PER_SEC: f64 = 300e9;
/// The same over PCIe Gen4/5 without NVLink: an assumption, stated in the output.
pub const PCIE_BUS_BYTES_PER_SEC: f64 = 20e9;

/// The cost of data-parallel training on `gpus` GPUs. prep averages the gradients (float32) in
/// one NCCL call group after the backward pass, not overlapped with it, so a step takes the
/// one-GPU step time plus the all-reduce: speed-up = N * t_step / (t_step + t_allreduce), at
/// most N. The step time is not known here (it is in `prep train`'s samples/s on one GPU).
#[derive(Debug, Clone, Serialize)]
pub struct Scaling {
    pub gpus: u64,
    /// Bytes of the gradients averaged at every step.
    pub gradient_bytes: u64,
    /// Ring all-reduce time per step, seconds: 2 (N-1)/N of the gradient bytes at the bus
    /// bandwidth, over NVLink and over PCIe.
    pub allreduce_seconds_nvlink: f64,
    pub allreduce_seconds_pcie: f64,
    /// The one-GPU step time above which the speed-up is at least 0.95 N (19 all-reduces).
    pub step_seconds_for_95_percent_nvlink: f64,
    pub step_seconds_for_95_percent_pcie: f64,
}

/// The all-reduce cost of `model` on `gpus` GPUs (`None` for one GPU).
pub fn scaling(model: &ModelConfig, gpus: u64) -> Option<Scaling> {
    if gpus < 2 {
        return None;
    }
    // parameter_bytes counts weights, gradients and momentum, each float32.
    let gradient_bytes = model.parameter_bytes() / 3;
    let moved = 2.0 * (gpus - 1) as f64 / gpus as f64 * gradient_bytes as f64;
    let (nv, pcie) = (
        moved / NVLINK_BUS_BYTES_PER_SEC,
        moved / PCIE_BUS_BYTES_PER_SEC,
    );
    Some(Scaling {
        gpus,
        gradient_bytes,
        allreduce_seconds_nvlink: nv,
        allreduce_seconds_pcie: pcie,
        step_seconds_for_95_percent_nvlink: 19.0 * nv,
        step_seconds_for_95_percent_pcie: 19.0 * pcie,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub what: String,
    pub bytes: u64,
}

fn row(what: &str, bytes: u64) -> Row {
    Row {
        what: what.into(),
        bytes,
    }
}

/// GPU memory the CUDA driver, cuDNN and cuBLAS themselves hold once loaded, measured on an H200
/// (stream mode, 3x32x32, batch 512: 1009 MiB of GPU memory in all).
pub const CUDA_LIBRARY_BYTES: u64 = 390 << 20;
/// The most workspace one cuDNN convolution may take (src/nn/cuda/dnn.rs).
pub const CONV_WORKSPACE_BYTES: u64 = 256 << 20;

/// GPU memory a training step of `model` takes whatever the input mode: the CUDA libraries, the
/// convolution workspace, weights with their gradients and momentum, activations in bfloat16.
pub fn gpu_model_bytes(model: &ModelConfig, batch: u64) -> u64 {
    CUDA_LIBRARY_BYTES
        + CONV_WORKSPACE_BYTES
        + model.parameter_bytes()
        + model.activation_bytes(batch as usize, 2)
}

#[allow(clippy::too_many_arguments)]
pub fn plan(
    train: u64,
    test: u64,
    shape: Shape,
    dtype: Dtype,
    batch: u64,
    cores: usize,
    model: &ModelConfig,
    gpus: u64,
) -> Plan {
    let spec = SampleSpec {
        shape: shape.clone(),
        dtype,
    };
    let sb = spec.bytes() as u64;
    let n = train + test;
    let raw = n * sb;
    let labels = n * 4;
    let features = shape.elems() as u64;
    let block = default_block_samples(sb as usize) as u64 * (sb + 4);
    let cores = cores.max(1);
    // Blocks decoded ahead (each with its compressed copy while it decodes) and the shuffle
    // window; the ring holds PREFETCH_BATCHES.
    let ring = PREFETCH_BATCHES * batch * sb;
    let ahead = crate::train::input::lookahead_blocks(block as usize, cores) as u64;
    let decode = (2 * ahead + crate::train::input::WINDOW_BLOCKS as u64) * block;
    let base_host = 64 << 20;
    // What the CUDA driver, cuDNN and cuBLAS themselves hold once loaded, measured on an H200
    // (stream mode, 3x32x32, batch 512: 1009 MiB of GPU memory and 850-875 MiB RSS in all).
    let cuda_host = 620 << 20;
    let act = model.activation_bytes(batch as usize, 2);
    let gpu_fixed = gpu_model_bytes(model, batch);
    Plan {
        train,
        test,
        shape: shape.0.clone(),
        dtype: dtype.to_string(),
        batch,
        cores,
        disk: vec![
            row(&format!("raw pixels ({dtype}) + labels"), raw + labels),
            row(
                "shards, zstd (synthetic data ratio)",
                ((raw + labels) as f64 * SYNTH_ZSTD_RATIO) as u64,
            ),
            row("shards, --codec none", raw + labels + n.div_ceil(1024) * 40),
            row("colmajor (float32)", n * features * 4 + labels),
        ],
        host_ram: vec![
            row(
                "--memory device (upload, then nothing)",
                base_host + cuda_host + decode,
            ),
            row(
                "--memory stream (pinned ring + decoders)",
                base_host + cuda_host + ring + decode,
            ),
            row(
                "--memory managed (decoders; ring is managed)",
                base_host + cuda_host + decode,
            ),
            row(
                "colmajor reader (page cache, not RSS-bound)",
                base_host + ring,
            ),
        ],
        gpu_memory: vec![
            row(
                "--memory device (whole dataset resident)",
                raw + labels + gpu_fixed + ring,
            ),
            row("--memory stream (ring of device buffers)", ring + gpu_fixed),
            row(
                "--memory managed (managed ring, prefetched)",
                ring + gpu_fixed,
            ),
        ],
        generation_seconds: raw as f64 / (SYNTH_BYTES_PER_SEC_PER_CORE * cores as f64),
        scaling: scaling(model, gpus),
        notes: vec![
            format!(
                "model `{}`, batch {batch}, mixed precision: activations and their gradients ~{}, weights with gradients and momentum {}",
                model.name,
                crate::util::mem::human(act),
                crate::util::mem::human(model.parameter_bytes())
            ),
            "GPU memory in stream and managed modes does not grow with the dataset".into(),
            "GPU figures include ~390 MiB, and host figures ~620 MiB, held by the CUDA driver, cuDNN and cuBLAS".into(),
            "generation time is for `prep synth` on this many cores".into(),
        ],
    }
}
