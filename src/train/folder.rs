//! The run folder: the next free runs/NNN, the files a run writes, and starting afresh there.

use super::*;

pub(super) fn next_run_dir() -> Result<PathBuf> {
    let root = Path::new("runs");
    std::fs::create_dir_all(root).at(root)?;
    for i in 1.. {
        let p = root.join(format!("{i:03}"));
        if !p.exists() {
            return Ok(p);
        }
    }
    unreachable!()
}

/// The files a run writes in its folder.
pub const RUN_FILES: [&str; 8] = [
    "config.json",
    checkpoint::FILE,
    "metrics.jsonl",
    "summary.json",
    "curves.png",
    "confusion.png",
    "confusion.csv",
    "cudnn-algos.tsv",
];

/// `train --force`: remove the run files of `dir` (nothing else in it), so that a new run can
/// start there. Refused while another prep writes the folder.
pub fn clear_run(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    let _lock = crate::format::lock::lock_dir(dir)?;
    for f in RUN_FILES {
        match std::fs::remove_file(dir.join(f)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(dir.join(f), e))
            }
            _ => {}
        }
    }
    Ok(())
}

/// What an interrupted run kept, and how to go on.
pub(super) fn interrupted_note(dir: &Path) -> String {
    if dir.join(checkpoint::FILE).exists() {
        format!(
            "its last checkpoint is kept: `prep train --resume {}` continues from it",
            shown_path(&dir)
        )
    } else {
        "it had no checkpoint yet, and nothing is kept: the same command starts again".into()
    }
}
