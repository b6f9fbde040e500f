//! Video files, decoded frame by frame by an external `ffmpeg`.
//!
//! No video codec is linked into `prep`: the `ffmpeg` executable on `PATH` (or the one named by
//! `PREP_FFMPEG`) decodes the file and writes raw RGB frames to a pipe, which this module reads one
//! frame at a time and hands to `emit`. So a long video never sits in memory: the decoder holds at
//! most the one frame it is filling (each emitted frame is moved, not copied, into the image).
//!
//! Steps for one file:
//! 1. find the size of the first video stream, with `ffprobe` next to `ffmpeg` (or, without one,
//!    from what `ffmpeg -i` prints), and check it before allocating anything;
//! 2. run `ffmpeg -nostdin -v error -noautorotate -i FILE -map 0:v:0 -vf SELECT,scale=W:H
//!    [-fps_mode vfr] -f rawvideo -pix_fmt rgb24 -`, where SELECT is `fps=F` (sample at F frames per
//!    second) or `select=not(mod(n\,N))` (every Nth decoded frame). `-noautorotate` keeps the frames
//!    at the stored size the probe reported (rotation metadata is ignored), and the final
//!    `scale=W:H` keeps every frame at that size even if the stream changes size midway;
//! 3. read exactly W*H*3 bytes per frame from ffmpeg's stdout, while a thread drains its stderr;
//! 4. wait for ffmpeg on every path (after killing it when `emit` stops the decode), and turn a
//!    failure, no frames at all, or a cut-off last frame into a `Reject` quoting ffmpeg's message.

use super::{DecodeOptions, Emit, Probe, Reject};
use image::{DynamicImage, RgbImage};
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};

/// Largest width or height accepted (a 16384x16384 RGB frame is 768 MiB).
pub const MAX_SIDE: u32 = 16384;

/// How much of ffmpeg's stderr a rejection quotes (the end, where the reason usually is).
const STDERR_QUOTE_CHARS: usize = 300;
/// How much of ffmpeg's stderr is kept while it runs (a broken file can make it print a line per
/// frame, so only the tail is kept).
const STDERR_KEEP_BYTES: usize = 16 * 1024;

const INSTALL_HINT: &str =
    "install it: `apt-get install ffmpeg`, `brew install ffmpeg`, or set PREP_FFMPEG=/path/to/ffmpeg";

/// The `ffmpeg` executable to use: `PREP_FFMPEG` if set, else the first `ffmpeg` on `PATH`. The
/// error says how to get one.
pub fn ffmpeg() -> Result<PathBuf, Reject> {
    find_ffmpeg(std::env::var_os("PREP_FFMPEG"), std::env::var_os("PATH"))
}

/// `ffmpeg()` with the two environment variables passed in (so tests need not change them).
fn find_ffmpeg(
    prep_ffmpeg: Option<OsString>,
    path_var: Option<OsString>,
) -> Result<PathBuf, Reject> {
    if let Some(p) = prep_ffmpeg.filter(|p| !p.is_empty()) {
        let named = PathBuf::from(&p);
        // A bare name ("ffmpeg-6") is looked up on PATH; anything with a directory is taken as is.
        let found = if named.components().count() == 1 && !named.is_absolute() {
            search_path(&p, path_var.as_deref())
        } else if is_executable(&named) {
            Some(named.clone())
        } else {
            None
        };
        return found.ok_or_else(|| {
            Reject::new(format!(
                "PREP_FFMPEG is set to {}, which is not an executable file (point it at an ffmpeg \
                 executable, or unset it to use the ffmpeg on PATH; to get ffmpeg, {INSTALL_HINT})",
                named.display()
            ))
        });
    }
    let exe = format!("ffmpeg{}", std::env::consts::EXE_SUFFIX);
    search_path(OsStr::new(&exe), path_var.as_deref())
        .ok_or_else(|| Reject::new(format!("ffmpeg was not found on PATH ({INSTALL_HINT})")))
}

fn search_path(name: &OsStr, path_var: Option<&OsStr>) -> Option<PathBuf> {
    let path_var = path_var?;
    std::env::split_paths(path_var)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                m.permissions().mode() & 0o111 != 0
            }
            #[cfg(not(unix))]
            {
                true
            }
        }
        _ => false,
    }
}

/// The `ffprobe` that sits next to `ffmpeg` (`ffmpeg-6` pairs with `ffprobe-6`), if there is one.
fn ffprobe_next_to(ffmpeg: &Path) -> Option<PathBuf> {
    let name = ffmpeg.file_name()?.to_string_lossy();
    let probe = if name.contains("ffmpeg") {
        name.replacen("ffmpeg", "ffprobe", 1)
    } else {
        format!("ffprobe{}", std::env::consts::EXE_SUFFIX)
    };
    let p = ffmpeg.with_file_name(probe);
    is_executable(&p).then_some(p)
}

/// Decode `path`'s first video stream, emitting its frames (every `opts.every`th one, or
/// `opts.fps` per second) as RGB images of the stream's stored size.
pub fn decode(path: &Path, opts: &DecodeOptions, emit: &mut Emit) -> Result<(), Reject> {
    let select = Select::from_options(opts)?;
    let meta =
        std::fs::metadata(path).map_err(|e| Reject::new(format!("cannot read the file: {e}")))?;
    if meta.len() == 0 {
        return Err(Reject::new("empty file (0 bytes), not a video"));
    }
    let ffmpeg = ffmpeg()?;
    let (w, h) = probe_size(&ffmpeg, path)?;
    check_size(w, h)?;
    let frame_bytes = w as usize * h as usize * 3;

    let mut fps_mode = fps_mode_flag(&ffmpeg);
    loop {
        match run_decoder(&ffmpeg, path, &select, fps_mode, w, h, frame_bytes, emit) {
            // An old ffmpeg that does not know -fps_mode fails before decoding anything: say it
            // with -vsync instead (once).
            Err(Failure::UnknownOption) if fps_mode == FpsModeFlag::FpsMode => {
                remember_fps_mode(&ffmpeg, FpsModeFlag::Vsync);
                fps_mode = FpsModeFlag::Vsync;
            }
            Err(Failure::UnknownOption) => {
                return Err(Reject::new(
                    "this ffmpeg accepts neither -fps_mode nor -vsync",
                ))
            }
            Err(Failure::Reject(r)) => return Err(r),
            Ok(()) => return Ok(()),
        }
    }
}

/// Which frames to keep.
#[derive(Debug, Clone, PartialEq)]
enum Select {
    /// Every Nth decoded frame, starting with the first.
    Every(u32),
    /// Resample to this many frames per second.
    Fps(f64),
}

impl Select {
    fn from_options(opts: &DecodeOptions) -> Result<Select, Reject> {
        match opts.fps {
            Some(f) if f.is_finite() && f > 0.0 => Ok(Select::Fps(f)),
            Some(f) => Err(Reject::new(format!(
                "the frame rate must be a positive number, not {f}"
            ))),
            None if opts.every == 0 => Err(Reject::new("--every must be at least 1")),
            None => Ok(Select::Every(opts.every)),
        }
    }

    /// The `-vf` filter chain, ending with a scale to the probed size.
    fn filter(&self, w: u32, h: u32) -> String {
        match self {
            Select::Every(1) => format!("scale={w}:{h}"),
            Select::Every(n) => format!("select=not(mod(n\\,{n})),scale={w}:{h}"),
            Select::Fps(f) => format!("fps={f},scale={w}:{h}"),
        }
    }
}

/// How this ffmpeg spells "variable frame rate output, no duplicated frames": `-fps_mode vfr`
/// since 5.1, `-vsync vfr` before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FpsModeFlag {
    FpsMode,
    Vsync,
}

fn fps_mode_cache() -> &'static Mutex<Vec<(PathBuf, FpsModeFlag)>> {
    static CACHE: OnceLock<Mutex<Vec<(PathBuf, FpsModeFlag)>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Vec::new()))
}

fn remember_fps_mode(ffmpeg: &Path, flag: FpsModeFlag) {
    let mut c = fps_mode_cache().lock().unwrap_or_else(|e| e.into_inner());
    c.retain(|(p, _)| p != ffmpeg);
    c.push((ffmpeg.to_path_buf(), flag));
}

/// Decide from `ffmpeg -version` (once per executable). A version it cannot read (a git build
/// says "N-12345-g...") is taken as new; `decode` falls back to -vsync if that was wrong.
fn fps_mode_flag(ffmpeg: &Path) -> FpsModeFlag {
    if let Some((_, f)) = fps_mode_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(p, _)| p == ffmpeg)
    {
        return *f;
    }
    let out = Command::new(ffmpeg)
        .arg("-version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let flag = match out {
        Ok(o) => match parse_version(&String::from_utf8_lossy(&o.stdout)) {
            Some((major, minor)) if (major, minor) < (5, 1) => FpsModeFlag::Vsync,
            _ => FpsModeFlag::FpsMode,
        },
        Err(_) => FpsModeFlag::FpsMode,
    };
    remember_fps_mode(ffmpeg, flag);
    flag
}

/// (major, minor) from "ffmpeg version 5.1.9-0+deb12u1 Copyright ..." or "ffmpeg version n6.0".
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.lines().next()?.split_whitespace().nth(2)?;
    let v = v.strip_prefix('n').unwrap_or(v);
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

/// A file as ffmpeg and ffprobe are given it: through the `file:` protocol, so that a name is
/// only ever a file name, whatever it holds (`-x.mp4` is no option, `pipe:1.mp4` or
/// `concat:a|b` no other protocol).
fn ffmpeg_input(path: &Path) -> std::ffi::OsString {
    let mut s = std::ffi::OsString::from("file:");
    s.push(path);
    s
}

/// Width and height of the first video stream.
fn probe_size(ffmpeg: &Path, path: &Path) -> Result<(u32, u32), Reject> {
    if let Some(ffprobe) = ffprobe_next_to(ffmpeg) {
        let out = Command::new(&ffprobe)
            .args([
                "-v",
                "error",
                "-select_streams",
                "v:0",
                "-show_entries",
                "stream=width,height",
            ])
            .args(["-of", "csv=p=0"])
            .arg(ffmpeg_input(path))
            .stdin(Stdio::null())
            .output();
        // An ffprobe that does not run at all is no reason to give up: ask ffmpeg instead.
        if let Ok(out) = out {
            let stderr = clean_stderr(&String::from_utf8_lossy(&out.stderr), path);
            if !out.status.success() {
                return Err(Reject::new(if stderr.is_empty() {
                    format!("ffprobe could not read the file ({})", out.status)
                } else {
                    format!("ffprobe could not read the file: {stderr}")
                }));
            }
            return match parse_probe_csv(&String::from_utf8_lossy(&out.stdout)) {
                Some(wh) => Ok(wh),
                None if stderr.is_empty() => Err(Reject::new("no video stream in the file")),
                None => Err(Reject::new(format!(
                    "no video stream in the file: {stderr}"
                ))),
            };
        }
    }
    // `ffmpeg -i FILE` with no output describes the input on stderr and exits with status 1.
    let out = Command::new(ffmpeg)
        .args(["-nostdin", "-hide_banner", "-i"])
        .arg(ffmpeg_input(path))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Reject::new(format!("could not run {}: {e}", ffmpeg.display())))?;
    let text = String::from_utf8_lossy(&out.stderr);
    match parse_ffmpeg_info(&text) {
        Some(wh) => Ok(wh),
        None if text.contains("Stream #") => Err(Reject::new("no video stream in the file")),
        None => Err(Reject::new(format!(
            "ffmpeg could not read the file: {}",
            clean_stderr(&text, path)
        ))),
    }
}

/// Size and colour of the first video stream from ffprobe's (or `ffmpeg -i`'s) description of it,
/// without decoding a frame: a grey pixel format (gray*, ya*, mono*) gives grey frames, any other
/// colour ones, and so does a format that cannot be read (the decoder always outputs RGB).
pub fn probe(path: &Path) -> Result<Probe, Reject> {
    let ffmpeg = ffmpeg()?;
    let probe = |w: u32, h: u32, fmt: Option<&str>| {
        check_size(w, h)?;
        Ok(Probe {
            colour: !fmt.is_some_and(is_grey_pix_fmt),
            size: Some((h, w)),
            channels: None,
        })
    };
    if let Some(ffprobe) = ffprobe_next_to(&ffmpeg) {
        let out = Command::new(&ffprobe)
            .args(["-v", "error", "-select_streams", "v:0", "-show_entries"])
            .args([
                "stream=width,height,pix_fmt",
                "-of",
                "default=noprint_wrappers=1",
            ])
            .arg(ffmpeg_input(path))
            .stdin(Stdio::null())
            .output();
        if let Ok(out) = out {
            let text = String::from_utf8_lossy(&out.stdout);
            return match parse_probe_keys(&text) {
                Some((w, h, fmt)) if out.status.success() => probe(w, h, fmt.as_deref()),
                _ => Err(Reject::new("ffprobe found no video stream it can read")),
            };
        }
    }
    let out = Command::new(&ffmpeg)
        .args(["-nostdin", "-hide_banner", "-i"])
        .arg(ffmpeg_input(path))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Reject::new(format!("could not run {}: {e}", ffmpeg.display())))?;
    let text = String::from_utf8_lossy(&out.stderr);
    let (w, h) =
        parse_ffmpeg_info(&text).ok_or_else(|| Reject::new("ffmpeg found no video stream"))?;
    probe(w, h, parse_ffmpeg_pix_fmt(&text).as_deref())
}

/// The first video stream's average frame rate (ffprobe's `avg_frame_rate`, e.g. "30000/1001"),
/// for the time of a frame; None without ffprobe or a rate it can give.
pub fn frame_rate(path: &Path) -> Option<f64> {
    let ffprobe = ffprobe_next_to(&ffmpeg().ok()?)?;
    let out = Command::new(&ffprobe)
        .args(["-v", "error", "-select_streams", "v:0", "-show_entries"])
        .args([
            "stream=avg_frame_rate",
            "-of",
            "default=noprint_wrappers=1:nokey=1",
        ])
        .arg(ffmpeg_input(path))
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (n, d) = text.trim().split_once('/').unwrap_or((text.trim(), "1"));
    let r = n.parse::<f64>().ok()? / d.parse::<f64>().ok()?;
    (r.is_finite() && r > 0.0).then_some(r)
}

/// Which decoded frame the `k`-th emitted one is, and its time in seconds where it is known:
/// `--fps F` gives `k / F`; `--every N` frame `k * N` at the stream's average rate.
pub fn frame_at(k: usize, opts: &DecodeOptions, rate: Option<f64>) -> (Option<u64>, Option<f64>) {
    match Select::from_options(opts) {
        Ok(Select::Fps(f)) => (None, Some(k as f64 / f)),
        Ok(Select::Every(n)) => {
            let frame = k as u64 * n as u64;
            (Some(frame), rate.map(|r| frame as f64 / r))
        }
        Err(_) => (None, None),
    }
}

fn is_grey_pix_fmt(f: &str) -> bool {
    f.starts_with("gray") || f.starts_with("ya") || f.starts_with("mono")
}

/// "width=64", "height=48", "pix_fmt=gray" lines (ffprobe's default=noprint_wrappers=1 output).
fn parse_probe_keys(text: &str) -> Option<(u32, u32, Option<String>)> {
    let (mut w, mut h, mut fmt) = (None, None, None);
    for line in text.lines() {
        match line.trim().split_once('=') {
            Some(("width", v)) => w = v.parse().ok(),
            Some(("height", v)) => h = v.parse().ok(),
            Some(("pix_fmt", v)) if !v.is_empty() && v != "unknown" => fmt = Some(v.to_string()),
            _ => {}
        }
    }
    Some((w?, h?, fmt))
}

/// The pixel format from `ffmpeg -i`'s "Video: CODEC (...), yuv420p(tv, bt709), 64x48, ..." line:
/// the second field of its comma-separated list, commas inside brackets not counting.
fn parse_ffmpeg_pix_fmt(text: &str) -> Option<String> {
    let line = text
        .lines()
        .find(|l| l.contains("Stream #") && l.contains("Video:"))?;
    let rest = &line[line.find("Video:")? + "Video:".len()..];
    let mut depth = 0i32;
    let mut fields = Vec::new();
    let mut start = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                fields.push(&rest[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    fields.push(&rest[start..]);
    let f = fields.get(1)?.trim();
    let f = f.split('(').next()?.trim();
    (!f.is_empty()).then(|| f.to_string())
}

/// "64,48" (ffprobe's csv=p=0 output; a trailing comma or more lines may follow).
fn parse_probe_csv(text: &str) -> Option<(u32, u32)> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut nums = line.split(',').map(str::trim).filter(|s| !s.is_empty());
    let w = nums.next()?.parse().ok()?;
    let h = nums.next()?.parse().ok()?;
    Some((w, h))
}

/// The size from the first "Stream #0:0...: Video: h264 (High) (avc1 / 0x31637661), yuv420p,
/// 64x48 [SAR 1:1 DAR 4:3], ..." line that `ffmpeg -i` prints.
fn parse_ffmpeg_info(text: &str) -> Option<(u32, u32)> {
    let line = text
        .lines()
        .find(|l| l.contains("Stream #") && l.contains("Video:"))?;
    let rest = &line[line.find("Video:")? + "Video:".len()..];
    rest.split(|c: char| c.is_whitespace() || ",[]()".contains(c))
        .find_map(|tok| {
            let (a, b) = tok.split_once('x')?;
            // Codec tags such as 0x31637661 start with 0, sizes do not.
            if a.is_empty()
                || b.is_empty()
                || a.starts_with('0')
                || !a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
            {
                return None;
            }
            Some((a.parse().ok()?, b.parse().ok()?))
        })
}

fn check_size(w: u32, h: u32) -> Result<(), Reject> {
    if (1..=MAX_SIDE).contains(&w) && (1..=MAX_SIDE).contains(&h) {
        Ok(())
    } else {
        Err(Reject::new(format!(
            "video frames are {w}x{h}; width and height must each be 1 to {MAX_SIDE}"
        )))
    }
}

/// ffmpeg's message, without the file's path (the caller names the file), trimmed, and cut to its
/// last `STDERR_QUOTE_CHARS` characters.
fn clean_stderr(text: &str, path: &Path) -> String {
    let p = path.display().to_string();
    let text = text
        .replace(&format!("file:{p}"), &p)
        .replace(&format!("{p}: "), "")
        .replace(&p, "the file");
    // One line: "[mov,mp4,m4a,3gp,3g2,mj2 @ 0x55d0c1a2b800] moov atom not found" loses the
    // address, and lines are joined with "; ".
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(
            |l| match (l.strip_prefix('['), l.find(" @ 0x"), l.find("] ")) {
                (Some(_), Some(at), Some(end)) if at < end => {
                    format!("{}: {}", &l[1..at], &l[end + 2..])
                }
                _ => l.to_string(),
            },
        )
        .collect();
    let text = lines.join("; ");
    let text = text.trim();
    let n = text.chars().count();
    if n <= STDERR_QUOTE_CHARS {
        return text.to_string();
    }
    let start = text
        .char_indices()
        .nth(n - STDERR_QUOTE_CHARS)
        .map_or(0, |(i, _)| i);
    format!("...{}", text[start..].trim_start())
}

enum Failure {
    /// ffmpeg did not know the frame-rate-mode option.
    UnknownOption,
    Reject(Reject),
}

impl From<Reject> for Failure {
    fn from(r: Reject) -> Self {
        Failure::Reject(r)
    }
}

/// Kills (if still running) and waits for the child when dropped, so that no path out of
/// `run_decoder` (an error, `emit` stopping, a panic in `emit`) leaves a running process or a
/// zombie behind.
struct Reaper {
    child: Child,
    status: Option<ExitStatus>,
}

impl Reaper {
    fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let s = self.child.wait()?;
        self.status = Some(s);
        Ok(s)
    }

    fn kill_and_wait(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.wait();
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Close our end of stdout first, so a child blocked writing a frame sees a broken pipe.
        drop(self.child.stdout.take());
        self.kill_and_wait();
    }
}

/// Run ffmpeg once on `path`, emitting its frames; `Failure::UnknownOption` where it does not know
/// the frame-rate-mode flag.
#[allow(clippy::too_many_arguments)]
fn run_decoder(
    ffmpeg: &Path,
    path: &Path,
    select: &Select,
    fps_mode: FpsModeFlag,
    w: u32,
    h: u32,
    frame_bytes: usize,
    emit: &mut Emit,
) -> Result<(), Failure> {
    let mut cmd = decoder_command(ffmpeg, path, select, fps_mode, w, h);
    let child = cmd
        .spawn()
        .map_err(|e| Reject::new(format!("could not run {}: {e}", ffmpeg.display())))?;
    let mut child = Reaper {
        child,
        status: None,
    };
    let stderr_thread = drain_stderr(child.child.stderr.take().expect("stderr is piped"));

    let out = child.child.stdout.take().expect("stdout is piped");
    let (frames, partial) = match read_frames(out, w, h, frame_bytes, emit) {
        Ok(r) => r,
        Err(e) => {
            child.kill_and_wait();
            let _ = stderr_thread.join();
            return Err(e);
        }
    };

    let status = child.wait();
    let stderr = stderr_text(stderr_thread, path);
    let status = status.map_err(|e| Reject::new(format!("could not wait for ffmpeg: {e}")))?;
    check_decoder_end(status, &stderr, frames, partial, frame_bytes, w, h)
}

/// The ffmpeg command that writes the selected frames, scaled to `w` x `h`, as raw RGB to stdout.
fn decoder_command(
    ffmpeg: &Path,
    path: &Path,
    select: &Select,
    fps_mode: FpsModeFlag,
    w: u32,
    h: u32,
) -> Command {
    let mut cmd = Command::new(ffmpeg);
    cmd.args(["-nostdin", "-v", "error", "-noautorotate", "-i"])
        .arg(ffmpeg_input(path))
        .args(["-map", "0:v:0", "-vf"])
        .arg(select.filter(w, h));
    if let Select::Every(_) = select {
        // Without this, rawvideo output is constant-rate and ffmpeg would fill the frames `select`
        // dropped with duplicates.
        match fps_mode {
            FpsModeFlag::FpsMode => cmd.args(["-fps_mode", "vfr"]),
            FpsModeFlag::Vsync => cmd.args(["-vsync", "vfr"]),
        };
    }
    cmd.args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A thread that reads ffmpeg's stderr to its end and returns its tail.
fn drain_stderr(mut err_pipe: ChildStderr) -> std::thread::JoinHandle<Vec<u8>> {
    // Drain stderr on its own thread, keeping only its tail, so ffmpeg never blocks on a full
    // stderr pipe while we wait on stdout.
    std::thread::spawn(move || {
        let mut kept: Vec<u8> = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match err_pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    kept.extend_from_slice(&chunk[..n]);
                    if kept.len() > 2 * STDERR_KEEP_BYTES {
                        kept.drain(..kept.len() - STDERR_KEEP_BYTES);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        kept
    })
}

/// The stderr tail the thread kept, cleaned for quoting.
fn stderr_text(t: std::thread::JoinHandle<Vec<u8>>, path: &Path) -> String {
    let bytes = t.join().unwrap_or_default();
    clean_stderr(&String::from_utf8_lossy(&bytes), path)
}

/// Emit each whole frame ffmpeg writes until its output ends: the frames emitted and the bytes
/// of a cut-off last frame. An interrupt, an error from `emit` or a failed read stops it; `out`
/// is closed on return, before ffmpeg is waited for.
fn read_frames(
    mut out: ChildStdout,
    w: u32,
    h: u32,
    frame_bytes: usize,
    emit: &mut Emit,
) -> Result<(u64, usize), Failure> {
    let mut frames = 0u64;
    loop {
        // A long video must not hold up a job that was asked to stop (`crate::util::interrupt`):
        // ffmpeg is ended with it.
        if crate::util::interrupt::requested().is_some() {
            return Err(Reject::new("interrupted").into());
        }
        // Read straight into the frame's own buffer, of exactly one frame's capacity, which then
        // becomes the image: one frame in flight, no copy.
        let mut buf = Vec::with_capacity(frame_bytes);
        if let Err(e) = (&mut out).take(frame_bytes as u64).read_to_end(&mut buf) {
            return Err(Reject::new(format!("could not read ffmpeg's output: {e}")).into());
        }
        if buf.len() < frame_bytes {
            return Ok((frames, buf.len()));
        }
        let img = RgbImage::from_raw(w, h, buf).expect("buffer holds exactly one frame");
        frames += 1;
        emit(DynamicImage::ImageRgb8(img).into())?;
    }
}

/// How ffmpeg's run ended, once it has exited: a failure (an unknown frame-rate-mode option
/// told apart), a cut-off last frame, or no frames at all, each quoting ffmpeg's message.
fn check_decoder_end(
    status: ExitStatus,
    stderr: &str,
    frames: u64,
    partial: usize,
    frame_bytes: usize,
    w: u32,
    h: u32,
) -> Result<(), Failure> {
    if !status.success() {
        if frames == 0
            && (stderr.contains("Unrecognized option") || stderr.contains("Option not found"))
            && (stderr.contains("fps_mode") || stderr.contains("vsync"))
        {
            return Err(Failure::UnknownOption);
        }
        return Err(Reject::new(if stderr.is_empty() {
            format!("ffmpeg could not decode the video ({status})")
        } else {
            format!("ffmpeg could not decode: {stderr}")
        })
        .into());
    }
    if partial > 0 {
        return Err(Reject::new(format!(
            "ffmpeg's output ended inside a frame ({partial} of {frame_bytes} bytes of frame {} of \
             {w}x{h}){}",
            frames + 1,
            if stderr.is_empty() { String::new() } else { format!(": {stderr}") }
        ))
        .into());
    }
    if frames == 0 {
        return Err(Reject::new(if stderr.is_empty() {
            "ffmpeg decoded no frames".to_string()
        } else {
            format!("ffmpeg decoded no frames: {stderr}")
        })
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
