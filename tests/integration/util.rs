use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn prep() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_prep"));
    c.env_remove("RUST_BACKTRACE");
    c
}

/// Run prep with `args`; panic with its output unless it exits with `code`.
pub fn run(args: &[&str], code: i32) -> Output {
    let out = prep().args(args).output().expect("prep runs");
    assert_eq!(
        out.status.code(),
        Some(code),
        "prep {args:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `prep synth` arguments of [`small_dataset`] (3x12x12, several shards and several blocks per
/// shard), without `--out`.
pub const SMALL_SYNTH: [&str; 13] = [
    "synth",
    "--train",
    "3000",
    "--test",
    "500",
    "--shape",
    "3x12x12",
    "--classes",
    "5",
    "--block-samples",
    "256",
    "--shard-blocks",
    "4",
];

/// A small synthetic dataset with several shards and several blocks per shard.
pub fn small_dataset(dir: &Path, extra: &[&str]) -> PathBuf {
    let out = dir.join("ds");
    let o = out.to_str().unwrap();
    let mut args = SMALL_SYNTH.to_vec();
    args.extend_from_slice(&["--out", o, "--quiet"]);
    if !extra.contains(&"--seed") {
        args.extend_from_slice(&["--seed", "3"]);
    }
    args.extend_from_slice(extra);
    run(&args, 0);
    out
}

/// Every file under `dir` (relative path, bytes), sorted.
pub fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    fn walk(root: &Path, p: &Path, v: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(p).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, v);
            } else {
                v.push((
                    p.strip_prefix(root).unwrap().to_string_lossy().into_owned(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    walk(dir, dir, &mut v);
    v.sort();
    v
}

/// The shard files of a dataset, without the manifest (whose provenance names the output path).
pub fn shard_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    files(dir)
        .into_iter()
        .filter(|(n, _)| n.ends_with(".shard"))
        .collect()
}

/// A .npy (format 1.0) header for an array of `descr` and `shape`, padded to 64 bytes as numpy
/// pads it.
pub fn npy_header(descr: &str, fortran: bool, shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_s = if shape.len() == 1 {
        format!("({},)", shape[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let order = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape_s}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes
}

/// Write a C-order .npy file holding `data` as it is.
pub fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) {
    let mut bytes = npy_header(descr, false, shape);
    bytes.extend_from_slice(data);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}
