use super::outln;
use super::UsageError;
use crate::cli::TrainArgs;
use anyhow::Context;
use prep::dist;
use prep::train::{gpu_count, train, Recipe, TrainOptions};
use prep::util::error::shown_path;
use prep::util::mem::human;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

pub fn run(a: TrainArgs, quiet: bool) -> anyhow::Result<ExitCode> {
    let world = world_of(&a)?;
    check_paths(&a, world.is_some() || a.rank_of_gpus)?;
    let epochs = epochs_to_train(&a, &world)?;
    let device = match placement(&a, &world)? {
        Placement::Device(d) => d,
        Placement::Launch(gpus) => return launch(&gpus, quiet),
    };
    // Only rank 0 shows progress and the summary; every rank reports its own errors.
    let quiet = quiet || world.as_ref().is_some_and(|w| w.rank != 0);
    let opts = train_options(&a, epochs, device, quiet, &world);
    let what = error_context(&a, &world);
    clear_if_forced(&a, &world)?;
    if let Some(dir) = &a.cache {
        // Ranks of one host share the folder: each keeps to its part of the bytes.
        let ranks = world.as_ref().map_or(1, |w| w.size as u64);
        prep::store::cache::configure(dir, a.cache_bytes / ranks.max(1))?;
    }
    let t = train(&opts).context(what)?;
    prep::train::timing::mark("train returned");
    if let Some(s) = &t.summary {
        print_summary(&a, &t, s, quiet)?;
        if s.device.starts_with("cuda") {
            exit_without_teardown();
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// This process's place in a data-parallel world, if it is a rank of one.
fn world_of(a: &TrainArgs) -> anyhow::Result<Option<dist::World>> {
    let env = |k: &str| std::env::var(k).ok();
    // In a Slurm batch script of several tasks (outside srun), the allocation's variables describe
    // no world of this process; `--gpus N` there starts this node's ranks itself.
    let world = if a.gpus.is_some() && dist::in_slurm_allocation_shell(&env) {
        None
    } else {
        dist::from_env(&env, a.rendezvous.as_ref()).map_err(UsageError)?
    };
    // Test-only: `PREP_TEST_WORLD_OF_ONE=1` makes a run of one process a world of one rank, so
    // that the path of several (NCCL's communicator and all-reduces, within recorded steps) runs
    // on a machine with one GPU (scripts/gpu-check.sh, stage dist).
    let world = match world {
        None if a.gpus.is_none() && env("PREP_TEST_WORLD_OF_ONE").as_deref() == Some("1") => {
            Some(dist::World::of_one().map_err(anyhow::Error::msg)?)
        }
        w => w,
    };
    Ok(world)
}

/// Refuse a run folder given as the dataset, or a dataset given to `--resume`. A rank of a run
/// (`ranked`) does not probe the run folder's lock: its rank 0 holds it by then.
fn check_paths(a: &TrainArgs, ranked: bool) -> anyhow::Result<()> {
    if let Some(d) = &a.data {
        super::paths::expect_dataset(d, "train takes a dataset; a run folder goes to --resume")?;
    }
    if let Some(r) = &a.resume {
        super::paths::expect_run(
            r,
            "--resume takes the run folder that prep train --out wrote",
            !ranked,
        )?;
    }
    Ok(())
}

/// The epochs to train: `--epochs`, or a resumed run's own when not given; flags that differ from
/// the resumed run's are refused.
fn epochs_to_train(a: &TrainArgs, world: &Option<dist::World>) -> anyhow::Result<usize> {
    // --resume keeps the run's settings: a flag given with another value is refused by name.
    let mut epochs = a.epochs;
    if let Some(dir) = &a.resume {
        // A run another prep is writing is refused as the library refuses it (its config may
        // not be written yet); a config that cannot be read is left for the library to report.
        // Not in the ranks of a run: their rank 0 holds the folder as its writer by then, and
        // takes the lock itself (a launcher checks before it starts them).
        if dir.is_dir() && !a.rank_of_gpus && world.is_none() {
            prep::format::lock::check_not_written(dir)
                .with_context(|| format!("resuming {}", shown_path(dir)))?;
        }
        if let Ok(r) = prep::train::read_recipe(dir) {
            let launched = a.gpus.is_some() || a.rank_of_gpus || world.is_some();
            let differ = resume_conflicts(a, &r, launched);
            if !differ.is_empty() {
                return Err(UsageError(format!(
                    "{}; a resumed run keeps its settings ({}), and only --epochs N above its {} extends it",
                    differ.join("; "),
                    shown_path(&dir.join("config.json")),
                    r.epochs
                ))
                .into());
            }
            // Not given: the run's own (the default of a new run would extend it).
            if !a.given.iter().any(|g| g == "epochs") {
                epochs = r.epochs;
            }
        }
    }
    Ok(epochs)
}

/// Where this process trains: on one device, or by starting a rank on each of several GPUs.
enum Placement {
    Device(String),
    Launch(Vec<usize>),
}

/// Settle the device from `--device`, `--gpus` and the world, refusing combinations that clash.
fn placement(a: &TrainArgs, world: &Option<dist::World>) -> anyhow::Result<Placement> {
    let mut device = a.device.clone();
    match (&a.gpus, world) {
        (Some(g), _) if a.device != "auto" => {
            return Err(UsageError(format!(
                "--gpus {g} picks the GPUs itself: leave out --device {}",
                a.device
            ))
            .into())
        }
        (Some(g), Some(w)) => {
            return Err(UsageError(format!(
                "--gpus {g} starts its own processes, but this one is already rank {} of {} ({} variables are set): leave out --gpus",
                w.rank, w.size, w.launcher
            ))
            .into())
        }
        (Some(_), None) if a.rendezvous.is_some() => {
            return Err(UsageError(
                "--rendezvous is for ranks that a launcher started (torchrun, srun); --gpus sets up its own".into(),
            )
            .into())
        }
        (Some(g), None) => {
            let gpus = g.resolve(gpu_count()).map_err(anyhow::Error::msg)?;
            if gpus.len() > 1 {
                return Ok(Placement::Launch(gpus));
            }
            device = format!("cuda:{}", gpus[0]);
        }
        (None, Some(w)) => {
            // A launcher's rank uses the GPU of its local rank unless told otherwise.
            if device == "auto" {
                device = format!("cuda:{}", w.local_rank);
            }
        }
        (None, None) if a.rank_of_gpus => {
            return Err(UsageError(
                "--rank-of-gpus is set by `prep train --gpus N` on the processes it starts, with their WORLD_SIZE/RANK; it is not for use by hand".into(),
            )
            .into())
        }
        (None, None) if a.rendezvous.is_some() => {
            return Err(UsageError(
                "--rendezvous joins a world of several processes, and none is set: run under a launcher (WORLD_SIZE and RANK, or srun's SLURM_NTASKS and SLURM_PROCID), or use --gpus N on one host".into(),
            )
            .into())
        }
        (None, None) => {}
    }
    Ok(Placement::Device(device))
}

/// The library's options for this command.
fn train_options(
    a: &TrainArgs,
    epochs: usize,
    device: String,
    quiet: bool,
    world: &Option<dist::World>,
) -> TrainOptions {
    // --lr, --momentum, --label-smoothing and --weight-decay are range-checked by clap (cli.rs).
    TrainOptions {
        data: a.data.clone().unwrap_or_default(),
        shape: a.shape.clone(),
        out: a.out.clone(),
        resume: a.resume.clone(),
        model: a.model.clone(),
        width: a.width,
        task: a.task.clone(),
        loss: a.loss.clone(),
        epochs,
        batch: a.batch as usize,
        lr: a.lr,
        momentum: a.momentum,
        weight_decay: a.weight_decay,
        label_smoothing: a.label_smoothing,
        seed: a.seed,
        augment: !a.no_augment,
        checkpoint_every: a.checkpoint_every,
        device,
        memory: a.memory.clone(),
        precision: a.precision.clone(),
        skip_damaged: a.skip_damaged,
        quiet,
        stop_after: a.stop_after,
        world: world.clone(),
        sync_bn: a.sync_bn,
    }
}

/// What an error of this run says it was doing ("rank 1 of 2: training on DATA").
fn error_context(a: &TrainArgs, world: &Option<dist::World>) -> String {
    let what = match (&a.resume, &a.data) {
        (Some(r), _) => format!("resuming {}", shown_path(&r)),
        (None, Some(d)) => format!("training on {}", shown_path(&d)),
        _ => "training".into(),
    };
    // Every rank of a world reports its own errors: say whose.
    match world {
        Some(w) => format!("rank {} of {}: {what}", w.rank, w.size),
        None => what,
    }
}

/// With `--force`, clear the `--out` folder first (rank 0 only).
fn clear_if_forced(a: &TrainArgs, world: &Option<dist::World>) -> anyhow::Result<()> {
    if a.force && world.as_ref().is_none_or(|w| w.rank == 0) {
        if let Some(out) = &a.out {
            prep::train::clear_run(out)
                .with_context(|| format!("clearing {} (--force)", shown_path(out)))?;
        }
    }
    Ok(())
}

/// Print the run's summary: as JSON with `--json`, else one line unless quiet.
fn print_summary(
    a: &TrainArgs,
    t: &prep::train::Trained,
    s: &prep::train::Summary,
    quiet: bool,
) -> anyhow::Result<()> {
    if a.json {
        outln!("{}", serde_json::to_string_pretty(s)?);
    } else if !quiet {
        let acc = match (&s.test_score_name, s.test_score) {
            _ if s.test_loss.is_nan() => "no test split".to_string(),
            (Some(name), Some(v)) => format!("test {name} {v:.4}"),
            _ => format!("test accuracy {:.4}", s.test_accuracy),
        };
        outln!(
            "{}: {acc} after {} epochs on {} data, {:.0} samples/s on {}, {:.1} s, peak RSS {}",
            shown_path(&t.dir),
            s.epochs,
            s.layout.name(),
            s.samples_per_sec,
            s.device,
            s.seconds,
            human(s.peak_rss_bytes)
        );
    }
    Ok(())
}

/// End the process at once, successfully, skipping the CUDA libraries' teardown.
fn exit_without_teardown() -> ! {
    // Everything is written and closed. The CUDA libraries' exit handlers and the
    // context's teardown took 0.17 s of a 2.4 s run on an H100 (issue 24); the driver
    // frees the GPU at process exit in any case.
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    prep::train::timing::mark("exit");
    unsafe { libc::_exit(0) };
}

/// The flags given with `--resume` whose values differ from the run's recipe, each as "--flag V
/// differs from the run's W". `launched`: the process is a rank of several (its `--device` is
/// set for it). Flags the recipe does not record (`--memory`, `--json`) are free.
fn resume_conflicts(a: &TrainArgs, r: &Recipe, launched: bool) -> Vec<String> {
    let given = |id: &str| a.given.iter().any(|g| g == id);
    let mut out = Vec::new();
    let differ = |out: &mut Vec<String>, flag: &str, ours: String, theirs: String| {
        out.push(format!("--{flag} {ours} differs from the run's {theirs}"));
    };
    if let Some(m) = a.model.as_ref().filter(|m| **m != r.model.name) {
        differ(&mut out, "model", m.clone(), r.model.name.clone());
    }
    if given("epochs") && a.epochs < r.epochs {
        out.push(format!(
            "--epochs {} is fewer than the run's {}",
            a.epochs, r.epochs
        ));
    }
    if given("batch") && a.batch as usize != r.batch {
        differ(&mut out, "batch", a.batch.to_string(), r.batch.to_string());
    }
    for (flag, id, ours, theirs) in [
        ("lr", "lr", a.lr.unwrap_or(r.lr), r.lr),
        ("momentum", "momentum", a.momentum, r.momentum),
        (
            "weight-decay",
            "weight_decay",
            a.weight_decay,
            r.weight_decay,
        ),
        (
            "label-smoothing",
            "label_smoothing",
            a.label_smoothing,
            r.label_smoothing,
        ),
    ] {
        if given(id) && ours != theirs {
            differ(&mut out, flag, ours.to_string(), theirs.to_string());
        }
    }
    if given("seed") && a.seed != r.seed {
        differ(&mut out, "seed", a.seed.to_string(), r.seed.to_string());
    }
    if given("no_augment") && (r.flip || r.crop_pad > 0) {
        out.push("--no-augment differs from the run's augmentation (random crop and flip)".into());
    }
    if given("checkpoint_every") && a.checkpoint_every != r.checkpoint_every {
        differ(
            &mut out,
            "checkpoint-every",
            a.checkpoint_every.to_string(),
            r.checkpoint_every.to_string(),
        );
    }
    if given("skip_damaged") && !r.skip_damaged {
        out.push("--skip-damaged differs from the run's (damaged blocks stop it)".into());
    }
    if given("precision") && a.precision != r.precision {
        differ(
            &mut out,
            "precision",
            a.precision.clone(),
            r.precision.clone(),
        );
    }
    // The GPU a run of one process uses may change (where it runs, not how); CPU and GPU may not.
    let cuda = |d: &str| d == "cuda" || d.starts_with("cuda:");
    if given("device")
        && !launched
        && a.device != "auto"
        && a.device != r.device
        && !(cuda(&a.device) && cuda(&r.device))
    {
        differ(&mut out, "device", a.device.clone(), r.device.clone());
    }
    out
}

/// The arguments of a rank that `--gpus` starts: this command's, without the flags that the
/// launcher settles for each rank (`--gpus`, `--device`, `--rendezvous`).
fn rank_args(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    const SETTLED: [&str; 3] = ["--gpus", "--device", "--rendezvous"];
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        let s = a.to_string_lossy();
        if SETTLED.contains(&s.as_ref()) {
            skip_value = true;
            continue;
        }
        if SETTLED.iter().any(|f| s.starts_with(&format!("{f}="))) {
            continue;
        }
        out.push(a);
    }
    out
}

/// `--gpus` with two or more GPUs: one process of this executable per GPU, each one rank of a
/// torchrun-style world on this host (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a
/// free MASTER_PORT), NCCL's NVLink multicast off unless the user set NCCL_NVLS_ENABLE. Waits for
/// all; the first that fails ends the others, and the error names it.
fn launch(gpus: &[usize], quiet: bool) -> anyhow::Result<ExitCode> {
    let exe =
        std::env::current_exe().context("finding prep's own executable to start the ranks")?;
    let args = rank_args(std::env::args_os().skip(1));
    let port = dist::free_port().map_err(anyhow::Error::msg)?;
    let list: Vec<String> = gpus.iter().map(|g| g.to_string()).collect();
    if !quiet {
        eprintln!(
            "starting {} ranks on GPUs {} (rendezvous 127.0.0.1:{port})",
            gpus.len(),
            list.join(",")
        );
    }
    let nvls = std::env::var_os("NCCL_NVLS_ENABLE").is_none();
    let mut ranks: Vec<(usize, usize, Child)> = Vec::new();
    for (rank, &gpu) in gpus.iter().enumerate() {
        let mut c = Command::new(&exe);
        c.args(&args)
            .arg("--device")
            .arg(format!("cuda:{gpu}"))
            .arg("--rank-of-gpus")
            .env("WORLD_SIZE", gpus.len().to_string())
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        if nvls {
            c.env("NCCL_NVLS_ENABLE", "0");
        }
        // A process group of their own: a Ctrl-C at the terminal reaches this process alone,
        // which passes it on once (a second signal would end a rank before its checkpoint).
        c.process_group(0);
        match c.spawn() {
            Ok(child) => ranks.push((rank, gpu, child)),
            Err(e) => {
                stop_all(&mut ranks);
                return Err(anyhow::anyhow!(
                    "starting rank {rank} ({}): {e}",
                    shown_path(&exe)
                ));
            }
        }
    }
    let mut forwarded = false;
    loop {
        // A signal to this process (SIGTERM from a scheduler, say) goes to every rank, which
        // then stops as one run does: with a checkpoint.
        if let (Some(sig), false) = (prep::util::interrupt::requested(), forwarded) {
            for (_, _, c) in &ranks {
                unsafe {
                    libc::kill(c.id() as libc::pid_t, sig);
                }
            }
            forwarded = true;
        }
        let mut running = 0;
        let mut failed = None;
        for (rank, gpu, c) in &mut ranks {
            match c.try_wait().context("waiting for the ranks")? {
                None => running += 1,
                Some(st) if !st.success() => {
                    failed = Some((*rank, *gpu, st));
                    break;
                }
                Some(_) => {}
            }
        }
        if let (Some(_), Some(sig)) = (failed, prep::util::interrupt::requested()) {
            // Every rank was told to stop: let each finish (rank 0 saves a checkpoint).
            for (_, _, c) in &mut ranks {
                let _ = c.wait();
            }
            return Ok(ExitCode::from(prep::util::interrupt::exit_status(sig) as u8));
        }
        if let Some((rank, gpu, st)) = failed {
            stop_all(&mut ranks);
            let msg =
                format!("rank {rank} (GPU {gpu}) failed ({st}); the other ranks were stopped");
            // A rank refused its arguments or data (exit 2; every rank sees the same): so does
            // the run, for scripts that tell a usage error from a failure.
            return Err(if st.code() == Some(2) {
                anyhow::Error::new(UsageError(msg))
            } else {
                anyhow::anyhow!(msg)
            });
        }
        if running == 0 {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// End the ranks still running (SIGKILL: they may be inside a collective that never returns).
fn stop_all(ranks: &mut [(usize, usize, Child)]) {
    for (_, _, c) in ranks.iter_mut() {
        if let Ok(None) = c.try_wait() {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_the_arguments_without_the_launchers_flags() {
        let args = [
            "train",
            "data",
            "--gpus",
            "0,2",
            "--device=auto",
            "--epochs",
            "3",
            "--gpus=2",
            "--rendezvous",
            "tcp:a:1",
            "--device",
            "auto",
            "-o",
            "runs/x",
        ];
        let got = rank_args(args.iter().map(OsString::from));
        assert_eq!(
            got,
            ["train", "data", "--epochs", "3", "-o", "runs/x"]
                .iter()
                .map(OsString::from)
                .collect::<Vec<_>>()
        );
    }
}
