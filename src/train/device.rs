//! Where a run trains: the GPU picked (or the CPU, said so), and the CPU's memory checked first.

use super::recipe::Recipe;
use super::*;

/// GPUs the CUDA driver sees, or why it cannot count them (no driver; a build without CUDA).
///
/// Test-only: `PREP_TEST_FAKE_GPUS=N` says N, so that a machine without a GPU can check what
/// `--gpus` does with them up to the first use of a device (the ranks it starts fail there).
pub fn gpu_count() -> std::result::Result<usize, String> {
    if let Ok(n) = std::env::var("PREP_TEST_FAKE_GPUS") {
        return n
            .parse()
            .map_err(|_| format!("PREP_TEST_FAKE_GPUS={n} is not a count"));
    }
    #[cfg(feature = "cuda")]
    {
        crate::nn::cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err("this build of prep has no CUDA backend (built without the `cuda` feature)".into())
    }
}

/// The backend named by `--device`: `cpu`, `cuda[:N]`, or `auto` (the first GPU when a driver
/// and a device are there, else the CPU with a one-line notice).
pub fn pick_device(device: &str, quiet: bool) -> Result<String> {
    let cuda = |ordinal: usize| -> std::result::Result<String, String> {
        #[cfg(feature = "cuda")]
        {
            crate::nn::cuda::probe(ordinal)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = ordinal;
            Err("this build of prep has no CUDA backend (built without the `cuda` feature)".into())
        }
    };
    match device {
        "cpu" => Ok("cpu".into()),
        "auto" => match cuda(0) {
            Ok(name) => {
                if !quiet {
                    eprintln!("device: cuda:0 ({name})");
                }
                Ok("cuda:0".into())
            }
            Err(why) => {
                if !quiet {
                    eprintln!("device: no usable GPU ({why}); training on the CPU");
                }
                Ok("cpu".into())
            }
        },
        d if d == "cuda" || d.starts_with("cuda:") => {
            let ordinal = match d.strip_prefix("cuda:") {
                None => 0,
                Some(i) => i.parse::<usize>().map_err(|_| {
                    Error::Invalid(format!("--device {d}: expected cuda or cuda:N"))
                })?,
            };
            match cuda(ordinal) {
                Ok(name) => {
                    if !quiet {
                        eprintln!("device: cuda:{ordinal} ({name})");
                    }
                    Ok(format!("cuda:{ordinal}"))
                }
                Err(why) => Err(Error::Device(format!(
                    "--device {d}: {why}; use --device cpu (or auto) to run on the CPU"
                ))),
            }
        }
        d => Err(Error::Invalid(format!(
            "--device {d}: expected auto, cpu or cuda[:N]"
        ))),
    }
}

/// Refuse before the first step a CPU batch whose activations cannot fit in the memory left
/// (the kernel would kill the run without a word), naming a batch that fits, as the GPU does.
pub(super) fn check_cpu_memory(r: &Recipe, sample_bytes: usize) -> Result<()> {
    let Some(avail) = crate::util::mem::available_bytes() else {
        return Ok(());
    };
    // Float32 activations and their gradients (measured: 630 KB a sample for `small` at 1x28x28
    // against 712 KB estimated), the weights, and the batch's input several times over.
    let need = |b: usize| {
        r.model.parameter_bytes()
            + r.model.activation_bytes(b, 4)
            + 4 * (b * sample_bytes.max(1) * 4) as u64
    };
    // A tenth kept for the readers, the allocator and everything else on the machine.
    let budget = avail - avail / 10;
    if need(r.batch) <= budget {
        return Ok(());
    }
    // The need grows with the batch: the largest that fits, by bisection.
    let fits = (need(1) <= budget).then(|| {
        let (mut lo, mut hi) = (1, r.batch);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if need(mid) <= budget {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    });
    Err(Error::Invalid(format!(
        "model `{}` on {}x{}x{} images at batch {} needs about {} of memory on the CPU, more than the {} this machine has free; {}",
        r.model.name,
        r.model.channels,
        r.model.height,
        r.model.width,
        r.batch,
        crate::util::mem::human(need(r.batch)),
        crate::util::mem::human(avail),
        match fits {
            Some(b) => format!("use --batch {b} or less"),
            None => "no batch size fits: use smaller images (prep convert --size)".into(),
        }
    )))
}
