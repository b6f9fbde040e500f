//! Several GPUs (`prep train --gpus`, launcher variables) as far as a machine without a GPU can
//! check them: the flag's forms, a clear failure at once when there is no GPU, the CPU backend's
//! refusal of a world of several ranks, and `--resume` with another world size. The runs on GPUs
//! are `scripts/gpu-check.sh`'s `dist` stage.

use crate::util::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// Whether this host shows an NVIDIA GPU to its processes.
fn gpu_visible() -> bool {
    Path::new("/dev/nvidiactl").exists() || Path::new("/proc/driver/nvidia/gpus").exists()
}

fn train_args<'a>(ds: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "train", ds, "--epochs", "1", "--batch", "64", "--out", out, "--quiet",
    ];
    a.extend_from_slice(extra);
    a
}

#[test]
fn gpus_flag_forms_are_checked() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let ds = ds.to_str().unwrap();
    let out = t.path().join("r");
    let out = out.to_str().unwrap();
    for (gpus, want) in [
        (
            "0",
            "a count of at least 1 (2), `all`, or GPU indices separated by commas (0,2)",
        ),
        (",", "is not a GPU index"),
        ("0,0", "GPU 0 is named twice"),
        ("two", "a count of at least 1"),
        ("1,b", "`b` is not a GPU index"),
    ] {
        let o = run(&train_args(ds, out, &["--gpus", gpus]), 2);
        let e = stderr(&o);
        assert!(
            e.contains(&format!("--gpus {gpus}")) && e.contains(want),
            "{gpus}: {e}"
        );
    }
    let o = run(&train_args(ds, out, &["--gpus", "2", "--device", "cpu"]), 2);
    assert!(
        stderr(&o).contains("leave out --device cpu"),
        "{}",
        stderr(&o)
    );
    let o = run(
        &train_args(ds, out, &["--rendezvous", "file:/tmp/x.rdv"]),
        2,
    );
    assert!(
        stderr(&o).contains("run under a launcher"),
        "{}",
        stderr(&o)
    );
    // Under a launcher, --gpus would start a world inside a world.
    let o = prep()
        .args(train_args(ds, out, &["--gpus", "2"]))
        .env("WORLD_SIZE", "2")
        .env("RANK", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("already rank 1 of 2"), "{}", stderr(&o));
    assert!(!Path::new(out).exists(), "a usage error writes nothing");
}

/// `prep train` run directly in a Slurm batch script of 2 tasks (SLURM_NTASKS=2, SLURM_PROCID=0,
/// no srun step) is one process: it exits 2 at once pointing at srun instead of waiting for a
/// rank 1 that never starts; `--gpus` there is this node's own launcher. A bad
/// PREP_RENDEZVOUS_TIMEOUT is a usage error too.
#[test]
fn a_slurm_batch_script_without_srun_is_told_to_use_it() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let ds = ds.to_str().unwrap();
    let out = t.path().join("r");
    let out = out.to_str().unwrap();
    let batch = |extra: &[&str]| {
        let mut c = prep();
        c.args(train_args(ds, out, extra))
            .env("SLURM_NTASKS", "2")
            .env("SLURM_PROCID", "0")
            .env("SLURM_LOCALID", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "1");
        // (In case the tests themselves run inside an srun step or under torchrun.)
        for v in ["SLURM_STEP_ID", "SLURM_STEPID", "WORLD_SIZE", "RANK"] {
            c.env_remove(v);
        }
        c
    };
    let t0 = Instant::now();
    let o = batch(&["--device", "cpu"]).output().unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(20), "not at once");
    assert!(
        e.contains("SLURM_NTASKS=2") && e.contains("`srun prep train ...`"),
        "{e}"
    );
    assert!(!Path::new(out).exists(), "a usage error writes nothing");
    // The same variables inside an srun step: rank 0 of 2 (which the CPU backend refuses).
    let o = batch(&["--device", "cpu"])
        .env("SLURM_STEP_ID", "0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("a world of 2 ranks"), "{}", stderr(&o));
    if !gpu_visible() {
        // --gpus is not refused as "already rank 0 of 2": it goes on to look for GPUs.
        let o = batch(&["--gpus", "1"]).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("--gpus 1: no CUDA GPU found"),
            "{}",
            stderr(&o)
        );
    }
    let o = batch(&["--device", "cpu"])
        .env("SLURM_STEP_ID", "0")
        .env("PREP_RENDEZVOUS_TIMEOUT", "0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("PREP_RENDEZVOUS_TIMEOUT=0 is not a number of seconds"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn gpus_without_a_gpu_fail_at_once_naming_why() {
    if gpu_visible() {
        println!(
            "skipped: this host shows a GPU; scripts/gpu-check.sh (stage dist) runs --gpus there"
        );
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let ds = ds.to_str().unwrap();
    for gpus in ["2", "all", "0,1", "1"] {
        let out = t.path().join(format!("r{gpus}"));
        let out = out.to_str().unwrap();
        let t0 = Instant::now();
        let o = run(&train_args(ds, out, &["--gpus", gpus]), 1);
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{gpus}: not at once"
        );
        let e = stderr(&o);
        assert!(
            e.contains(&format!("--gpus {gpus}: no CUDA GPU found (")),
            "{gpus}: {e}"
        );
        assert!(!Path::new(out).exists(), "{gpus}: nothing is written");
    }
}

/// A world of two ranks on the CPU is refused (data-parallel training is the CUDA backend's),
/// leaving nothing behind; `--resume` with another world size names both sizes.
#[test]
fn the_cpu_refuses_a_world_and_resume_needs_the_same_world_size() {
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let ds = ds.to_str().unwrap();
    let world = |rank: &str| {
        [
            ("WORLD_SIZE", "2".to_string()),
            ("RANK", rank.to_string()),
            ("MASTER_ADDR", "127.0.0.1".to_string()),
            ("MASTER_PORT", prep::dist::free_port().unwrap().to_string()),
        ]
    };
    let out = t.path().join("w");
    let o = prep()
        .args(train_args(ds, out.to_str().unwrap(), &["--device", "cpu"]))
        .envs(world("0"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the CPU backend trains in one process; a world of 2 ranks"),
        "{}",
        stderr(&o)
    );
    assert!(!out.join("config.json").exists());

    let one = t.path().join("one");
    let one = one.to_str().unwrap();
    run(&train_args(ds, one, &["--device", "cpu"]), 0);
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(Path::new(one).join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["world"], 1, "the world size is recorded");
    let before = std::fs::read(Path::new(one).join("checkpoint.safetensors")).unwrap();
    for rank in ["0", "1"] {
        let o = prep()
            .args(["train", "--resume", one, "--device", "cpu", "--quiet"])
            .envs(world(rank))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("was trained by 1 rank(s) (GPUs), this one has 2"),
            "rank {rank}: {e}"
        );
    }
    assert_eq!(
        std::fs::read(Path::new(one).join("checkpoint.safetensors")).unwrap(),
        before,
        "the run is left as it was"
    );
}

/// `prep plan --gpus N`: the same memory per GPU as one GPU, and the all-reduce cost with the
/// bandwidths it assumes.
#[test]
fn plan_gives_per_gpu_memory_and_the_all_reduce_cost() {
    let base = [
        "plan", "--train", "1000000", "--model", "resnet18", "--json",
    ];
    let one: serde_json::Value = serde_json::from_slice(&run(&base, 0).stdout).unwrap();
    assert!(one.get("scaling").is_none());
    let mut a = base.to_vec();
    a.extend(["--gpus", "4"]);
    let four: serde_json::Value = serde_json::from_slice(&run(&a, 0).stdout).unwrap();
    assert_eq!(one["gpu_memory"], four["gpu_memory"], "memory is per GPU");
    let s = &four["scaling"];
    // ResNet-18 for 10 classes: about 11.2 million float32 gradients.
    let g = s["gradient_bytes"].as_u64().unwrap();
    assert!((44_000_000..46_000_000).contains(&g), "{g}");
    let nv = s["allreduce_seconds_nvlink"].as_f64().unwrap();
    let want = 1.5 * g as f64 / prep::train::plan::NVLINK_BUS_BYTES_PER_SEC;
    assert!((nv - want).abs() < 1e-9, "{nv} {want}");
    assert!(s["allreduce_seconds_pcie"].as_f64().unwrap() > nv);
    a.pop();
    a.pop();
    a.retain(|x| *x != "--json");
    a.extend(["--gpus", "2"]);
    let text = stdout(&run(&a, 0));
    for w in [
        "per GPU",
        "assumed 300 GB/s",
        "assumed 20 GB/s",
        "at most 2x",
    ] {
        assert!(text.contains(w), "missing {w}:\n{text}");
    }
    run(&["plan", "--train", "10", "--gpus", "0"], 2);
}

/// The launcher of `--gpus`, on GPUs that only the count says are there (PREP_TEST_FAKE_GPUS):
/// it starts one rank per GPU listed, each on its own GPU with the launcher's flags settled, and
/// when a rank fails (here at its first use of the device) it stops the others and exits 1
/// naming the rank.
#[test]
fn the_launcher_starts_a_rank_per_gpu_and_reports_the_first_failure() {
    if gpu_visible() {
        println!("skipped: this host has a GPU, which a rank given GPU 0 would train on");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let ds = small_dataset(t.path(), &[]);
    let ds = ds.to_str().unwrap();
    let out = t.path().join("r");
    let out = out.to_str().unwrap();
    let o = prep()
        .args(train_args(ds, out, &["--gpus", "0,2"]))
        .env("PREP_TEST_FAKE_GPUS", "3")
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    // The launcher names the rank that failed first and its GPU; that rank's own error names the
    // device it was given (the other rank may be stopped before it says anything).
    let last = e.lines().last().unwrap();
    let named = [(0, 0), (1, 2)]
        .into_iter()
        .find(|(r, g)| last.starts_with(&format!("error: rank {r} (GPU {g}) failed")));
    let (rank, gpu) = named.unwrap_or_else(|| panic!("{e}"));
    assert!(
        last.ends_with("failed (exit status: 1); the other ranks were stopped"),
        "{e}"
    );
    assert!(
        e.lines().any(
            |l| l.starts_with(&format!("error: rank {rank} of 2: training on "))
                && l.contains(&format!("--device cuda:{gpu}: "))
        ),
        "{e}"
    );
    assert!(
        !e.contains("--device cuda:1"),
        "GPU 1 was not asked for: {e}"
    );
    assert!(!Path::new(out).join("config.json").exists());
    // More GPUs than the count, and an index past it, name what exists.
    for (gpus, want) in [
        ("4", "--gpus 4: this host has 3 GPUs (indices 0 to 2)"),
        ("1,3", "--gpus 1,3: there is no GPU 3; this host has 3 GPUs"),
    ] {
        let o = prep()
            .args(train_args(ds, out, &["--gpus", gpus]))
            .env("PREP_TEST_FAKE_GPUS", "3")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(want), "{}", stderr(&o));
    }
}
