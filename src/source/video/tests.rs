use super::*;
use crate::source::Frame;

/// The ffmpeg to test with, or None (after saying so) to skip. With PREP_REQUIRE_FFMPEG=1 (as
/// in CI) a missing ffmpeg fails the test instead.
fn ffmpeg_or_skip() -> Option<PathBuf> {
    match ffmpeg() {
        Ok(p) => Some(p),
        Err(e) if std::env::var("PREP_REQUIRE_FFMPEG").as_deref() == Ok("1") => {
            panic!("PREP_REQUIRE_FFMPEG=1 but: {e}")
        }
        Err(_) => {
            println!("skipped: ffmpeg not on PATH");
            None
        }
    }
}

/// Run ffmpeg to make a test clip; panic with its message if it fails.
fn make(ffmpeg: &Path, args: &[&str], out: &Path) {
    let o = Command::new(ffmpeg)
        .args(["-nostdin", "-v", "error", "-y"])
        .args(args)
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "ffmpeg {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// 30 frames of 64x48 at 10 fps, H.264 (or whatever the build's default MP4 encoder is).
fn mp4_clip(ffmpeg: &Path, dir: &Path) -> PathBuf {
    let p = dir.join("clip.mp4");
    make(
        ffmpeg,
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=64x48:rate=10",
            "-t",
            "3",
            "-pix_fmt",
            "yuv420p",
        ],
        &p,
    );
    p
}

fn collect(path: &Path, every: u32, fps: Option<f64>) -> Result<Vec<DynamicImage>, Reject> {
    let opts = DecodeOptions {
        every,
        fps,
        ..DecodeOptions::default()
    };
    let mut frames = Vec::new();
    decode(path, &opts, &mut |f| {
        frames.push(f.expect_image());
        Ok(())
    })?;
    Ok(frames)
}

fn sizes_and_count(frames: &[DynamicImage]) -> (Vec<(u32, u32)>, usize) {
    let mut s: Vec<_> = frames.iter().map(|f| (f.width(), f.height())).collect();
    s.dedup();
    (s, frames.len())
}

#[test]
fn mp4_frame_counts() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let clip = mp4_clip(&ff, t.path());

    let all = collect(&clip, 1, None).unwrap();
    assert_eq!(sizes_and_count(&all), (vec![(64, 48)], 30));
    assert!(all.iter().all(|f| matches!(f, DynamicImage::ImageRgb8(_))));
    // testsrc is a colourful pattern with a moving part, not a flat frame.
    let px = all[0].as_rgb8().unwrap();
    let mut colours: Vec<_> = px.pixels().map(|p| p.0).collect();
    colours.sort();
    colours.dedup();
    assert!(colours.len() > 8, "{} colours", colours.len());
    assert_ne!(all[0].as_bytes(), all[10].as_bytes());

    let third = collect(&clip, 3, None).unwrap();
    assert_eq!(sizes_and_count(&third), (vec![(64, 48)], 10));
    // Every third frame is frame 0, 3, 6, ... of the full decode.
    for (k, f) in third.iter().enumerate() {
        assert_eq!(f.as_bytes(), all[3 * k].as_bytes(), "frame {k}");
    }

    let two_fps = collect(&clip, 1, Some(2.0)).unwrap();
    let (s, n) = sizes_and_count(&two_fps);
    assert_eq!(s, vec![(64, 48)]);
    assert!((5..=7).contains(&n), "{n} frames at 2 fps over 3 s");
    // `fps` wins over `every`.
    assert_eq!(collect(&clip, 3, Some(2.0)).unwrap().len(), n);
}

#[test]
fn avi_and_webm_with_other_codecs() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    // MPEG-4 part 2 is built into every ffmpeg; a size other than the mp4's catches a
    // width/height mix-up.
    let avi = t.path().join("clip.avi");
    make(
        &ff,
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=66x38:rate=10",
            "-t",
            "2",
            "-c:v",
            "mpeg4",
            "-pix_fmt",
            "yuv420p",
        ],
        &avi,
    );
    assert_eq!(
        sizes_and_count(&collect(&avi, 1, None).unwrap()),
        (vec![(66, 38)], 20)
    );
    assert_eq!(collect(&avi, 2, None).unwrap().len(), 10);
    assert_eq!(collect(&avi, 7, None).unwrap().len(), 3);

    // VP9 needs libvpx, which not every build has.
    let webm = t.path().join("clip.webm");
    let made = Command::new(&ff)
        .args([
            "-nostdin",
            "-v",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=40x30:rate=10",
            "-t",
            "2",
        ])
        .args(["-c:v", "libvpx-vp9", "-pix_fmt", "yuv420p"])
        .arg(&webm)
        .output()
        .unwrap();
    if made.status.success() {
        assert_eq!(
            sizes_and_count(&collect(&webm, 1, None).unwrap()),
            (vec![(40, 30)], 20)
        );
        assert_eq!(collect(&webm, 4, None).unwrap().len(), 5);
    } else {
        println!("webm part skipped: this ffmpeg cannot encode VP9");
    }
}

/// Odd sizes with a lossless RGB codec: no row padding, exact pixels.
#[test]
fn odd_size_lossless_pixels() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let mkv = t.path().join("clip.mkv");
    make(
        &ff,
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=33x17:rate=5",
            "-t",
            "1",
            "-c:v",
            "ffv1",
            "-pix_fmt",
            "bgr0",
        ],
        &mkv,
    );
    let png = t.path().join("first.png");
    make(
        &ff,
        &[
            "-i",
            mkv.to_str().unwrap(),
            "-frames:v",
            "1",
            "-pix_fmt",
            "rgb24",
        ],
        &png,
    );
    let frames = collect(&mkv, 1, None).unwrap();
    assert_eq!(sizes_and_count(&frames), (vec![(33, 17)], 5));
    let want = image::open(&png).unwrap().to_rgb8();
    assert_eq!(frames[0].as_rgb8().unwrap(), &want);
}

/// Rotation metadata is ignored: frames come out at the stored size, which the probe reports.
#[test]
fn rotated_clip_keeps_stored_size() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let src = mp4_clip(&ff, t.path());
    let rotated = t.path().join("rotated.mp4");
    make(
        &ff,
        &[
            "-i",
            src.to_str().unwrap(),
            "-c",
            "copy",
            "-metadata:s:v:0",
            "rotate=90",
        ],
        &rotated,
    );
    let frames = collect(&rotated, 1, None).unwrap();
    assert_eq!(sizes_and_count(&frames), (vec![(64, 48)], 30));
    // Same stream copied: the same pixels, not turned (a turned 48x64 frame has as many bytes).
    let plain = collect(&src, 1, None).unwrap();
    assert!(frames
        .iter()
        .zip(&plain)
        .all(|(a, b)| a.as_bytes() == b.as_bytes()));
}

/// The spelling for ffmpeg before 5.1 (`-vsync vfr`) selects the same frames, where this ffmpeg
/// still accepts it.
#[test]
fn vsync_spelling() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let clip = mp4_clip(&ff, t.path());
    let mut n = 0;
    match run_decoder(
        &ff,
        &clip,
        &Select::Every(3),
        FpsModeFlag::Vsync,
        64,
        48,
        64 * 48 * 3,
        &mut |_| {
            n += 1;
            Ok(())
        },
    ) {
        Ok(()) => assert_eq!(n, 10),
        Err(Failure::UnknownOption) => println!("this ffmpeg no longer knows -vsync"),
        Err(Failure::Reject(r)) => panic!("{r}"),
    }
}

#[test]
fn emit_error_stops_the_decode() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let clip = mp4_clip(&ff, t.path());
    let mut calls = 0;
    let r = decode(&clip, &DecodeOptions::default(), &mut |_| {
        calls += 1;
        if calls == 3 {
            Err(Reject::new("enough"))
        } else {
            Ok(())
        }
    });
    assert_eq!(r, Err(Reject::new("enough")));
    assert_eq!(calls, 3);
}

#[test]
fn bad_files_are_rejects() {
    let Some(ff) = ffmpeg_or_skip() else { return };
    let t = tempfile::tempdir().unwrap();
    let opts = DecodeOptions::default();
    let mut never = |_: Frame| -> Result<(), Reject> { panic!("no frame expected") };

    let empty = t.path().join("empty.mp4");
    std::fs::write(&empty, b"").unwrap();
    let r = decode(&empty, &opts, &mut never).unwrap_err();
    assert!(r.0.contains("empty"), "{r}");

    let text = t.path().join("notes.mp4");
    std::fs::write(
        &text,
        "these are not the frames you are looking for\n".repeat(50),
    )
    .unwrap();
    let r = decode(&text, &opts, &mut never).unwrap_err();
    println!("text file: {r}");
    assert!(
        !r.0.is_empty() && !r.0.contains(text.to_str().unwrap()),
        "{r}"
    );

    let missing = t.path().join("missing.mp4");
    assert!(decode(&missing, &opts, &mut never).is_err());

    // Audio only: no video stream.
    let audio = t.path().join("audio.mp4");
    make(
        &ff,
        &[
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:duration=1",
            "-c:a",
            "aac",
        ],
        &audio,
    );
    let r = decode(&audio, &opts, &mut never).unwrap_err();
    assert!(r.0.contains("no video stream"), "{r}");

    // A clip cut in half: whatever ffmpeg makes of it, no panic; frames only if it succeeds.
    let clip = mp4_clip(&ff, t.path());
    let bytes = std::fs::read(&clip).unwrap();
    let cut = t.path().join("cut.mp4");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let _ = collect(&cut, 1, None);

    // The same checks through the `ffmpeg -i` fallback (no ffprobe).
    assert_eq!(probe_size(&ff, &clip).unwrap(), (64, 48));
    let no_probe_dir = t.path().join("bin");
    std::fs::create_dir(&no_probe_dir).unwrap();
    let lone = no_probe_dir.join("ffmpeg");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&ff, &lone).unwrap();
    #[cfg(unix)]
    {
        assert!(ffprobe_next_to(&lone).is_none());
        assert_eq!(probe_size(&lone, &clip).unwrap(), (64, 48));
        assert!(probe_size(&lone, &text).is_err());
        let r = probe_size(&lone, &audio).unwrap_err();
        assert!(r.0.contains("no video stream"), "{r}");
    }
}

#[test]
fn bad_options_are_rejects() {
    let t = tempfile::tempdir().unwrap();
    let f = t.path().join("x.mp4");
    std::fs::write(&f, b"x").unwrap();
    let mut never = |_: Frame| -> Result<(), Reject> { panic!("no frame expected") };
    let every0 = DecodeOptions {
        every: 0,
        ..DecodeOptions::default()
    };
    assert!(decode(&f, &every0, &mut never).is_err());
    for fps in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let o = DecodeOptions {
            fps: Some(fps),
            ..DecodeOptions::default()
        };
        assert!(decode(&f, &o, &mut never).is_err(), "{fps}");
    }
}

#[test]
fn lookup_messages() {
    let t = tempfile::tempdir().unwrap();
    let nowhere = t.path().join("no/such/ffmpeg");
    let r = find_ffmpeg(Some(nowhere.clone().into()), std::env::var_os("PATH")).unwrap_err();
    assert!(
        r.0.contains("PREP_FFMPEG") && r.0.contains(nowhere.to_str().unwrap()),
        "{r}"
    );
    assert!(
        r.0.contains("apt-get install ffmpeg") && r.0.contains("brew install ffmpeg"),
        "{r}"
    );

    let empty_dir = t.path().to_path_buf();
    let r = find_ffmpeg(None, Some(empty_dir.clone().into())).unwrap_err();
    assert!(r.0.contains("ffmpeg was not found on PATH"), "{r}");
    assert!(
        r.0.contains("apt-get install ffmpeg") && r.0.contains("PREP_FFMPEG="),
        "{r}"
    );
    assert!(find_ffmpeg(None, None).is_err());
    // An empty PREP_FFMPEG counts as unset.
    assert!(find_ffmpeg(Some("".into()), Some(empty_dir.into()))
        .unwrap_err()
        .0
        .contains("not found on PATH"));

    // A file that is there but not executable is not an ffmpeg.
    #[cfg(unix)]
    {
        let dir = t.path().join("bin");
        std::fs::create_dir(&dir).unwrap();
        let fake = dir.join("ffmpeg");
        std::fs::write(&fake, b"#!/bin/sh\n").unwrap();
        assert!(find_ffmpeg(None, Some(dir.clone().into())).is_err());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_ffmpeg(None, Some(dir.clone().into())).unwrap(), fake);
        assert_eq!(find_ffmpeg(Some(fake.clone().into()), None).unwrap(), fake);
        // A bare name is looked up on PATH.
        assert_eq!(
            find_ffmpeg(Some("ffmpeg".into()), Some(dir.into())).unwrap(),
            fake
        );
    }
}

#[test]
fn parsers() {
    assert_eq!(parse_probe_csv("64,48\n"), Some((64, 48)));
    assert_eq!(parse_probe_csv("\n1920,1080,\n\n-90\n"), Some((1920, 1080)));
    assert_eq!(parse_probe_csv(""), None);
    assert_eq!(parse_probe_csv("N/A,N/A"), None);

    let info = "Input #0, mov,mp4,m4a,3gp,3g2,mj2, from 'a.mp4':\n  Duration: 00:00:03.00\n  \
        Stream #0:0[0x1](und): Video: h264 (High) (avc1 / 0x31637661), yuv420p(progressive), \
        64x48 [SAR 1:1 DAR 4:3], 8 kb/s, 10 fps, 10 tbr, 10240 tbn (default)\n\
        At least one output file must be specified\n";
    assert_eq!(parse_ffmpeg_info(info), Some((64, 48)));
    let old = "    Stream #0:1(eng): Audio: aac, 44100 Hz\n    Stream #0:0: Video: mpeg4 (Simple Profile) \
        (FMP4 / 0x34504D46), yuv420p, 66x38 [SAR 1:1 DAR 33:19], 10 fps\n";
    assert_eq!(parse_ffmpeg_info(old), Some((66, 38)));
    assert_eq!(parse_ffmpeg_info("  Stream #0:0: Audio: aac\n"), None);
    assert_eq!(parse_ffmpeg_pix_fmt(info).as_deref(), Some("yuv420p"));
    assert_eq!(parse_ffmpeg_pix_fmt(old).as_deref(), Some("yuv420p"));
    let grey =
        "  Stream #0:0: Video: ffv1 (FFV1 / 0x31564646), gray(pc, progressive), 64x48, 10 fps\n";
    assert_eq!(parse_ffmpeg_pix_fmt(grey).as_deref(), Some("gray"));
    assert_eq!(
        parse_probe_keys("width=64\nheight=48\npix_fmt=gray16le\n"),
        Some((64, 48, Some("gray16le".into())))
    );
    assert_eq!(
        parse_probe_keys("width=64\nheight=48\n"),
        Some((64, 48, None))
    );
    assert_eq!(parse_probe_keys(""), None);
    assert!(is_grey_pix_fmt("gray") && is_grey_pix_fmt("ya8") && is_grey_pix_fmt("monob"));
    assert!(!is_grey_pix_fmt("yuv420p") && !is_grey_pix_fmt("rgb24"));

    assert_eq!(
        parse_version("ffmpeg version 5.1.9-0+deb12u1 Copyright (c) 2000-2026"),
        Some((5, 1))
    );
    assert_eq!(
        parse_version("ffmpeg version n4.4.2 Copyright"),
        Some((4, 4))
    );
    assert_eq!(parse_version("ffmpeg version 7.0 Copyright"), Some((7, 0)));
    assert_eq!(
        parse_version("ffmpeg version N-112345-gabc Copyright"),
        None
    );

    assert!(check_size(1, 1).is_ok());
    assert!(check_size(16384, 16384).is_ok());
    assert!(check_size(0, 48).is_err());
    assert!(check_size(64, 16385).is_err());

    let p = Path::new("/tmp/x/a.mp4");
    assert_eq!(
        clean_stderr(
            "  /tmp/x/a.mp4: Invalid data found when processing input\n",
            p
        ),
        "Invalid data found when processing input"
    );
    assert_eq!(
        clean_stderr("[mov,mp4,m4a,3gp,3g2,mj2 @ 0x558374187800] moov atom not found\n/tmp/x/a.mp4: Invalid data found when processing input\n", p),
        "mov,mp4,m4a,3gp,3g2,mj2: moov atom not found; Invalid data found when processing input"
    );
    let long = "x".repeat(1000) + "END";
    let c = clean_stderr(&long, p);
    assert!(c.ends_with("END") && c.chars().count() <= STDERR_QUOTE_CHARS + 3);

    assert_eq!(Select::Every(1).filter(64, 48), "scale=64:48");
    assert_eq!(
        Select::Every(3).filter(64, 48),
        "select=not(mod(n\\,3)),scale=64:48"
    );
    assert_eq!(Select::Fps(2.0).filter(64, 48), "fps=2,scale=64:48");
    assert_eq!(Select::Fps(29.97).filter(64, 48), "fps=29.97,scale=64:48");
}
