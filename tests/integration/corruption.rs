//! Damage of every kind is found, named, and never panics or allocates absurdly.

use crate::util::*;
use prep::format::shard::format::{HEADER_LEN, TRAILER_LEN};
use prep::format::shard::{Dataset, ShardReader};
use std::path::Path;

/// Which region of a shard file a byte offset lies in: "header", "block N", "footer" or "trailer".
fn region_of(path: &Path, offset: u64) -> String {
    let r = ShardReader::open(path).unwrap();
    if offset < HEADER_LEN as u64 {
        return "header".into();
    }
    if offset >= r.file_len - TRAILER_LEN as u64 {
        return "trailer".into();
    }
    for i in 0..r.num_blocks() {
        let e = r.entry(i);
        if offset >= e.offset && offset < e.offset + e.stored_len {
            return format!("block {i}");
        }
    }
    "footer".into()
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn every_single_byte_flip_is_caught_and_named() {
    let t = tempfile::tempdir().unwrap();
    let d = small_dataset(t.path(), &[]);
    let mut files: Vec<String> = shard_files(&d).into_iter().map(|f| f.0).collect();
    files.push("manifest.json".into());
    let mut rng = Lcg(42);
    let mut checked = 0;
    for round in 0..400 {
        let name = &files[round % files.len()];
        let path = d.join(name);
        let original = std::fs::read(&path).unwrap();
        // Half the flips land in the header/footer/trailer neighbourhood, half anywhere.
        let len = original.len() as u64;
        let pos = match rng.next() % 4 {
            0 => rng.next() % 64.min(len),
            1 => len - 1 - rng.next() % 256.min(len),
            _ => rng.next() % len,
        } as usize;
        let expected_region = if name.ends_with(".shard") {
            Some(region_of(&path, pos as u64))
        } else {
            None
        };
        let mut bad = original.clone();
        bad[pos] ^= 1 << (rng.next() % 8);
        std::fs::write(&path, &bad).unwrap();

        let report = Dataset::open(&d).map(|ds| ds.verify(&|_| {}));
        match (&report, &expected_region) {
            (Err(e), None) => assert!(e.to_string().contains("manifest.json"), "{e}"),
            (Ok(r), Some(region)) => {
                assert!(!r.ok(), "flip at {name}:{pos} ({region}) not detected");
                assert!(r.damage.iter().all(|dm| dm.file == *name), "{:?}", r.damage);
                if region.starts_with("block") {
                    assert!(
                        r.damage.iter().any(|dm| dm.region == *region),
                        "flip in {name} {region} reported as {:?}",
                        r.damage
                    );
                }
            }
            (r, region) => panic!(
                "flip at {name}:{pos}: unexpected result {:?} (region {region:?})",
                r.as_ref().map(|r| &r.damage).map_err(|e| e.to_string())
            ),
        }
        std::fs::write(&path, &original).unwrap();
        checked += 1;
    }
    assert_eq!(checked, 400);
    assert!(Dataset::open(&d).unwrap().verify(&|_| {}).ok());
}

#[test]
fn verify_cli_names_every_damaged_shard_and_block_and_exits_1() {
    let t = tempfile::tempdir().unwrap();
    let d = small_dataset(t.path(), &[]);
    let ds = Dataset::open(&d).unwrap();
    let infos: Vec<_> = ds.shards().map(|(_, s)| s.clone()).collect();
    // Damage block 1 of the first shard and block 2 of the second.
    for (info, block) in [(&infos[0], 1usize), (&infos[1], 2)] {
        let p = d.join(&info.file);
        let e = *ShardReader::open(&p).unwrap().entry(block);
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[(e.offset + e.stored_len / 2) as usize] ^= 0x40;
        std::fs::write(&p, bytes).unwrap();
    }
    let o = run(&["verify", d.to_str().unwrap()], 1);
    let s = stdout(&o);
    assert!(
        s.contains(&format!("DAMAGED {}: block 1:", infos[0].file)),
        "{s}"
    );
    assert!(
        s.contains(&format!("DAMAGED {}: block 2:", infos[1].file)),
        "{s}"
    );
    assert_eq!(
        s.lines().filter(|l| l.starts_with("DAMAGED")).count(),
        2,
        "{s}"
    );
    let o = run(&["verify", d.to_str().unwrap(), "--json"], 1);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["report"]["damage"].as_array().unwrap().len(), 2);

    // A missing shard and a damaged manifest are named too.
    std::fs::remove_file(d.join(&infos[2].file)).unwrap();
    let s = stdout(&run(&["verify", d.to_str().unwrap()], 1));
    assert!(
        s.contains(&format!("DAMAGED {}: file:", infos[2].file)),
        "{s}"
    );
    let m = d.join("manifest.json");
    let mut bytes = std::fs::read(&m).unwrap();
    bytes[10] ^= 0x01;
    std::fs::write(&m, bytes).unwrap();
    let s = stdout(&run(&["verify", d.to_str().unwrap()], 1));
    assert!(s.contains("manifest.json"), "{s}");
}

fn open_err(bytes: &[u8]) -> String {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("x.shard");
    std::fs::write(&p, bytes).unwrap();
    ShardReader::open(&p)
        .expect_err("must be rejected")
        .to_string()
}

#[test]
fn truncated_wrong_magic_and_absurd_sizes_are_clear_errors() {
    let t = tempfile::tempdir().unwrap();
    let d = small_dataset(t.path(), &[]);
    let name = &shard_files(&d)[0].0;
    let good = std::fs::read(d.join(name)).unwrap();

    assert!(open_err(&[]).contains("truncated"), "{}", open_err(&[]));
    for cut in [1, 50, 64, 100, good.len() / 2, good.len() - 1] {
        let e = open_err(&good[..cut]);
        assert!(e.contains("x.shard"), "{e}");
    }
    let mut bad = good.clone();
    bad[0..8].copy_from_slice(b"NOTASHRD");
    assert!(open_err(&bad).contains("wrong magic"));
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 8..].copy_from_slice(b"XXXXXXXX");
    assert!(open_err(&bad).contains("end magic"));

    // Absurd sizes with a valid header checksum: the caps refuse them before any allocation.
    let reseal = |mut h: Vec<u8>| {
        let sum = twox_hash::XxHash3_64::oneshot(&h[..56]);
        h[56..64].copy_from_slice(&sum.to_le_bytes());
        h
    };
    let with_header = |h: Vec<u8>| [h.as_slice(), &good[64..]].concat();
    let mut h = good[..64].to_vec();
    h[40..44].copy_from_slice(&u32::MAX.to_le_bytes()); // blocks
    assert!(open_err(&with_header(reseal(h))).contains("exceeds the cap"));
    let mut h = good[..64].to_vec();
    h[16..20].copy_from_slice(&100_000u32.to_le_bytes()); // channels
    h[20..24].copy_from_slice(&100_000u32.to_le_bytes());
    let e = open_err(&with_header(reseal(h)));
    assert!(e.contains("larger than 1 GiB") || e.contains("cap"), "{e}");
    let mut h = good[..64].to_vec();
    h[32..40].copy_from_slice(&u64::MAX.to_le_bytes()); // samples
    let e = open_err(&with_header(reseal(h)));
    assert!(e.contains("footer") || e.contains("samples"), "{e}");
    // A footer offset near u64::MAX must not overflow.
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 32..n - 24].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
    assert!(open_err(&bad).contains("trailer"));
}

/// Random damage anywhere never panics: the reader returns an error or (for a flip that hits
/// nothing checked before reading) the block read fails.
#[test]
fn random_mutations_never_panic() {
    let t = tempfile::tempdir().unwrap();
    let d = small_dataset(t.path(), &[]);
    let good = shard_files(&d).remove(0).1;
    let p = t.path().join("m.shard");
    let mut rng = Lcg(7);
    for _ in 0..300 {
        let mut bad = good.clone();
        match rng.next() % 3 {
            0 => {
                for _ in 0..1 + rng.next() % 8 {
                    let i = (rng.next() as usize) % bad.len();
                    bad[i] = rng.next() as u8;
                }
            }
            1 => bad.truncate((rng.next() as usize) % bad.len()),
            _ => {
                let i = (rng.next() as usize) % bad.len();
                let garbage: Vec<u8> = (0..rng.next() % 200).map(|_| rng.next() as u8).collect();
                bad.splice(i..i, garbage);
            }
        }
        std::fs::write(&p, &bad).unwrap();
        if let Ok(r) = ShardReader::open(&p) {
            for i in 0..r.num_blocks() {
                let _ = r.read_block(i);
            }
        }
    }
}

/// Inputs the fuzzers (and review) found: each must give an error, not a panic or a huge
/// allocation.
#[test]
fn fuzz_regressions_are_rejected_cleanly() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions"));
    let mut seen = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        match p.extension().and_then(|x| x.to_str()) {
            Some("shard") => {
                let res = ShardReader::open(&p).and_then(|r| {
                    (0..r.num_blocks()).try_for_each(|i| r.read_block(i).map(|_| ()))
                });
                assert!(res.is_err(), "{} was accepted", p.display());
                seen += 1;
            }
            Some("json") => {
                // Accepted or not, reading it and its accessors must not panic.
                if let Ok(m) =
                    prep::format::shard::Manifest::from_bytes(&p, &std::fs::read(&p).unwrap())
                {
                    let _ = m.raw_bytes();
                }
                seen += 1;
            }
            _ => {}
        }
    }
    assert!(
        seen >= 3,
        "expected the committed reproducers in {}",
        dir.display()
    );
}
