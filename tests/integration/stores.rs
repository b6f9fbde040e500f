//! Datasets in object stores and over HTTP (issue 30), against real servers on 127.0.0.1
//! (`crate::servers`): written there by synth, convert and merge, read back by verify, inspect,
//! train and eval, the same as from a local copy; and what goes wrong: a missing manifest, shard
//! or server, a damaged object, a killed upload, two writers, secrets in URLs.

use crate::servers::{Kind, Proxy, Server};
use crate::util::{prep, small_dataset, stderr, stdout, SMALL_SYNTH};
use object_store::ObjectStoreExt;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

/// The kinds prep's writes are tested against. HTTP is read-only for prep; the GCS emulator at
/// hand (fake-gcs-server) refuses object_store's uploads ("invalid uploadType"), so GCS is tested
/// for reads, its data put in through the emulator's own API.
const WRITABLE: [Kind; 2] = [Kind::S3, Kind::Azure];

/// A distinctive secret: no output may show it.
const SECRET: &str = "pr3pS3cretValue0123456789";

/// Run prep with `env`, a short retry budget (a stopped server fails in seconds), and `args`.
fn run_env(env: &[(String, String)], args: &[&str]) -> Output {
    prep()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("PREP_STORE_RETRY_SECONDS", "3")
        .args(args)
        .output()
        .expect("prep runs")
}

fn expect(o: &Output, code: i32, what: &str) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}\nstdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
}

/// Delete object `key` (`url(key)`) from `server`, through object_store in this process.
fn delete(server: &Server, key: &str) {
    let store = server.store();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(store.delete(&object_store::path::Path::from(key)))
        .unwrap_or_else(|e| panic!("deleting {key}: {e}"));
}

/// Object `key` of `server`, whole.
fn get(server: &Server, key: &str) -> Vec<u8> {
    use object_store::ObjectStoreExt;
    let store = server.store();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        store
            .get(&object_store::path::Path::from(key))
            .await?
            .bytes()
            .await
    })
    .unwrap_or_else(|e| panic!("reading {key}: {e}"))
    .to_vec()
}

/// `expect`, and that stderr says `words`.
fn expect_stderr(o: &Output, code: i32, what: &str, words: &str) {
    expect(o, code, what);
    assert!(stderr(o).contains(words), "{what}: {}", stderr(o));
}

/// Put every file of local dataset folder `dir` at `prefix` on `server` (through its own API).
fn put_dataset(server: &Server, dir: &Path, prefix: &str) {
    for (rel, bytes) in crate::util::files(dir) {
        server.put(&format!("{prefix}/{rel}"), &bytes);
    }
}

/// Train one CPU epoch on `data` into `out` (seed fixed), returning summary.json.
fn train(env: &[(String, String)], data: &str, out: &Path) -> serde_json::Value {
    let o = run_env(
        env,
        &[
            "train",
            data,
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--batch",
            "64",
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
    );
    expect(&o, 0, &format!("train {data}"));
    serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn a_dataset_written_to_each_store_reads_back_and_trains_as_its_local_copy() {
    let t = tempfile::tempdir().unwrap();
    let local = small_dataset(t.path(), &[]);
    let base = train(&[], local.to_str().unwrap(), &t.path().join("run-local"));
    for kind in WRITABLE {
        let Some(server) = Server::start(kind) else {
            continue;
        };
        let env = server.env();
        let url = server.url("ds");
        let mut args = SMALL_SYNTH.to_vec();
        args.extend_from_slice(&["--seed", "3", "--out", &url]);
        let o = run_env(&env, &args);
        expect(&o, 0, &format!("synth to {url}"));
        assert!(stdout(&o).contains("uploaded"), "{}", stdout(&o));
        let o = run_env(&env, &["verify", &url]);
        expect(&o, 0, &format!("verify {url}"));
        assert!(stdout(&o).contains("3,500 samples"), "{}", stdout(&o));
        let o = run_env(&env, &["inspect", &url, "--json"]);
        expect(&o, 0, &format!("inspect {url}"));
        let remote = train(&env, &url, &t.path().join(format!("run-{kind:?}")));
        for k in ["test_accuracy", "test_loss", "samples"] {
            assert_eq!(remote[k], base[k], "{kind:?}: {k}");
        }
        // The same batches: the per-epoch metrics (losses and accuracies) agree exactly.
        let m = |d: &str| {
            let s = std::fs::read_to_string(t.path().join(d).join("metrics.jsonl")).unwrap();
            s.lines()
                .map(|l| {
                    let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                    for k in [
                        "seconds",
                        "samples_per_sec",
                        "host_rss_bytes",
                        "store",
                        "rss_bytes",
                        "peak_rss_bytes",
                    ] {
                        v.as_object_mut().unwrap().remove(k);
                    }
                    v
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(m(&format!("run-{kind:?}")), m("run-local"), "{kind:?}");
        // eval of the local run on the store's copy gives the run's figure.
        let o = run_env(
            &env,
            &["eval", t.path().join("run-local").to_str().unwrap(), &url],
        );
        expect(&o, 0, "eval");
        assert!(
            stdout(&o).contains("equal to summary.json"),
            "{}",
            stdout(&o)
        );
        // The lease is gone once the writer is done.
        let rt = tokio::runtime::Runtime::new().unwrap();
        let lease = object_store::path::Path::from("ds/.prep-lease.json");
        assert!(
            rt.block_on(server.store().head(&lease)).is_err(),
            "{kind:?}: the lease outlived its writer"
        );
        // The same command again: nothing to do, as locally; other parameters: refused, named.
        let o = run_env(&env, &args);
        expect(&o, 0, &format!("synth to {url} again"));
        assert!(
            stdout(&o).contains("already holds this dataset (3,500 samples"),
            "{}",
            stdout(&o)
        );
        let o = run_env(
            &env,
            &["synth", "--train", "10", "--test", "0", "--out", &url],
        );
        expect_stderr(
            &o,
            2,
            "a second synth to the same URL",
            "already holds a different dataset (",
        );
        assert!(
            stderr(&o).contains("seed: 3 there, 0 asked"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn merge_and_convert_write_to_a_store() {
    let Some(server) = Server::start(Kind::Azure) else {
        return;
    };
    let env = server.env();
    let t = tempfile::tempdir().unwrap();
    let part = |i: &str| {
        let out = t.path().join(format!("part{i}"));
        let mut args = SMALL_SYNTH.to_vec();
        args.extend_from_slice(&["--part", i, "--out", out.to_str().unwrap(), "--quiet"]);
        expect(&run_env(&[], &args), 0, "synth --part");
        out
    };
    let (p0, p1) = (part("0/2"), part("1/2"));
    let merged = server.url("merged");
    let o = run_env(
        &env,
        &["merge", &merged, p0.to_str().unwrap(), p1.to_str().unwrap()],
    );
    expect(&o, 0, "merge into a store");
    let o = run_env(&env, &["verify", &merged]);
    expect(&o, 0, "verify the merged dataset");
    assert!(stdout(&o).contains("3,500 samples"), "{}", stdout(&o));
    // A dataset converted again (shards in, shards out) into the store.
    let local = small_dataset(t.path(), &[]);
    let converted = server.url("converted");
    let o = run_env(
        &env,
        &[
            "convert",
            local.to_str().unwrap(),
            "--out",
            &converted,
            "--quiet",
        ],
    );
    expect(&o, 0, "convert into a store");
    expect(
        &run_env(&env, &["verify", &converted]),
        0,
        "verify the converted dataset",
    );
}

#[test]
fn a_dataset_in_google_cloud_storage_reads_as_its_local_copy() {
    let Some(server) = Server::start(Kind::Gcs) else {
        return;
    };
    let env = server.env();
    let t = tempfile::tempdir().unwrap();
    let local = small_dataset(t.path(), &[]);
    put_dataset(&server, &local, "ds");
    let url = server.url("ds");
    let o = run_env(&env, &["verify", &url]);
    expect(&o, 0, "verify gs://");
    let o = run_env(&env, &["inspect", &url]);
    expect(&o, 0, "inspect gs://");
    let base = train(&[], local.to_str().unwrap(), &t.path().join("run-local"));
    let remote = train(&env, &url, &t.path().join("run-gcs"));
    assert_eq!(remote["test_accuracy"], base["test_accuracy"]);
}

#[test]
fn a_dataset_served_over_http_reads_as_its_local_copy() {
    let Some(server) = Server::start(Kind::Http) else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let local = small_dataset(t.path(), &[]);
    put_dataset(&server, &local, "data/ds");
    let url = server.url("data/ds");
    let o = run_env(&[], &["verify", &url]);
    expect(&o, 0, "verify over HTTP");
    let base = train(&[], local.to_str().unwrap(), &t.path().join("run-local"));
    let remote = train(&[], &url, &t.path().join("run-http"));
    assert_eq!(remote["test_accuracy"], base["test_accuracy"]);
    // HTTP is read-only for prep.
    let o = run_env(
        &[],
        &[
            "synth",
            "--train",
            "10",
            "--test",
            "0",
            "--out",
            &server.url("new"),
        ],
    );
    expect_stderr(&o, 2, "synth to http", "cannot write them there");
}

#[test]
fn the_cache_holds_at_most_its_bytes_and_later_epochs_read_from_it() {
    let Some(server) = Server::start(Kind::Http) else {
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let local = small_dataset(t.path(), &[]);
    put_dataset(&server, &local, "ds");
    let url = server.url("ds");
    let stored: u64 = crate::util::shard_files(&local)
        .iter()
        .map(|(_, b)| b.len() as u64)
        .sum();
    let epochs = |run: &str, cap: u64| {
        let cache = t.path().join(format!("cache-{run}"));
        let out = t.path().join(run);
        let o = prep()
            .args([
                "train", &url, "--device", "cpu", "--epochs", "3", "--batch", "64", "--quiet",
            ])
            .args([
                "--out",
                out.to_str().unwrap(),
                "--cache",
                cache.to_str().unwrap(),
            ])
            .args(["--cache-bytes", &cap.to_string()])
            .output()
            .unwrap();
        expect(&o, 0, "train with a cache");
        let held: u64 = crate::util::files(&cache)
            .iter()
            .map(|(_, b)| b.len() as u64)
            .sum();
        assert!(held <= cap, "the cache holds {held} bytes, over its {cap}");
        let m: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        m.iter().map(|e| e["store"].clone()).collect::<Vec<_>>()
    };
    // Room for all of it: the second and third epochs make no request.
    let all = epochs("all", stored * 2);
    assert!(all[0]["requests"].as_u64().unwrap() > 0, "{all:?}");
    for e in &all[1..] {
        assert_eq!(e["requests"], 0, "{all:?}");
        assert!(e["cache_hits"].as_u64().unwrap() > 0, "{all:?}");
    }
    // Room for about half: later epochs still ask the store for the rest.
    let half = epochs("half", stored / 2);
    for e in &half[1..] {
        let (r, h) = (
            e["requests"].as_u64().unwrap(),
            e["cache_hits"].as_u64().unwrap(),
        );
        assert!(r > 0 && h > 0, "{half:?}");
    }
}

#[test]
fn faults_in_a_store_end_with_errors_that_name_the_object() {
    let Some(server) = Server::start(Kind::S3) else {
        return;
    };
    let env = server.env();
    let t = tempfile::tempdir().unwrap();
    let local = small_dataset(t.path(), &[]);

    // An upload that stopped before its manifest: no dataset there.
    for (rel, bytes) in crate::util::shard_files(&local) {
        server.put(&format!("partial/{rel}"), &bytes);
    }
    let o = run_env(&env, &["verify", &server.url("partial")]);
    expect_stderr(
        &o,
        2,
        "verify of a dataset without its manifest",
        "no dataset there",
    );
    assert!(!stdout(&o).contains("DAMAGED"), "{}", stdout(&o));
    let o = run_env(
        &env,
        &[
            "train",
            &server.url("partial"),
            "--device",
            "cpu",
            "--out",
            t.path().join("r0").to_str().unwrap(),
        ],
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("no dataset there"), "{}", stderr(&o));

    // A missing shard: inspect and train name it.
    put_dataset(&server, &local, "missing");
    let gone = "missing/train/train-00001.shard";
    delete(&server, gone);
    let o = run_env(&env, &["inspect", &server.url("missing")]);
    expect_stderr(
        &o,
        1,
        "inspect with a shard missing",
        "train-00001.shard is missing",
    );
    let o = run_env(
        &env,
        &[
            "train",
            &server.url("missing"),
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--out",
            t.path().join("r1").to_str().unwrap(),
        ],
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("train-00001.shard"), "{}", stderr(&o));

    // A damaged byte in a block: the same report as for the local copy.
    let shard = local.join("train/train-00000.shard");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[300] ^= 0x40;
    std::fs::write(&shard, &bytes).unwrap();
    put_dataset(&server, &local, "damaged");
    let remote = run_env(&env, &["verify", &server.url("damaged")]);
    let here = run_env(&env, &["verify", local.to_str().unwrap()]);
    expect(&remote, 1, "verify of a damaged object");
    let damaged = |o: &Output| {
        stdout(o)
            .lines()
            .filter(|l| l.starts_with("DAMAGED"))
            .map(|l| l.rsplit(": ").take(2).collect::<Vec<_>>().join(" | "))
            .collect::<Vec<_>>()
    };
    assert!(!damaged(&remote).is_empty());
    assert_eq!(damaged(&remote), damaged(&here));
}

#[test]
fn a_server_stopped_mid_epoch_ends_the_run_with_an_error_naming_an_object() {
    let Some(mut server) = Server::start(Kind::Azure) else {
        return;
    };
    let env = server.env();
    let t = tempfile::tempdir().unwrap();
    let local = small_dataset(t.path(), &[]);
    put_dataset(&server, &local, "ds");
    let url = server.url("ds");
    let child = prep()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("PREP_STORE_RETRY_SECONDS", "3")
        .args([
            "train", &url, "--device", "cpu", "--epochs", "50", "--batch", "32", "--memory",
            "stream",
        ])
        .args(["--out", t.path().join("run").to_str().unwrap(), "--quiet"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first epoch has been written, the server goes away.
    let t0 = Instant::now();
    while !t.path().join("run/metrics.jsonl").exists() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop();
    let stopped = Instant::now();
    let out = child.wait_with_output().unwrap();
    let took = stopped.elapsed();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&url) && err.contains(".shard"), "{err}");
    assert!(
        took < Duration::from_secs(30),
        "ended {took:?} after the server stopped"
    );
}

#[test]
fn a_killed_upload_resumes_keeping_the_shards_already_there() {
    let Some(server) = Server::start(Kind::S3) else {
        return;
    };
    let proxy = Proxy::start(server.port());
    let env = server.env_via(&proxy);
    let url = server.url_via(&proxy, "ds");
    let t = tempfile::tempdir().unwrap();
    let staging = t.path().join("staging");
    let mut args = SMALL_SYNTH.to_vec();
    args.extend_from_slice(&["--seed", "3", "--out", &url]);
    // The connection is cut once part of the dataset has gone up.
    let child = prep()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("PREP_STORE_RETRY_SECONDS", "1")
        .env("PREP_STAGING", &staging)
        .args(&args)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while proxy.stats().bytes_to_server < 400_000 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    proxy.set_down(true);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let o = run_env(&env, &["verify", &url]);
    expect(&o, 1, "verify while the store cannot be reached");
    proxy.set_down(false);
    let o = prep()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("PREP_STAGING", &staging)
        .args(&args)
        .output()
        .unwrap();
    expect(&o, 0, "the same synth again");
    assert!(
        stdout(&o).contains("in the store already"),
        "{}",
        stdout(&o)
    );
    let o = run_env(&env, &["verify", &url]);
    expect(&o, 0, "verify after the resumed upload");
}

#[test]
fn synth_to_a_store_keeps_a_few_shards_in_staging_not_the_dataset() {
    let Some(server) = Server::start(Kind::S3) else {
        return;
    };
    // 50 ms a request: uploading is slower than generating, so without shards going up as they
    // are finished the staging folder would fill with all 40 of them.
    let proxy = Proxy::start(server.port());
    proxy.set_latency(Duration::from_millis(50));
    let env = server.env_via(&proxy);
    let url = server.url_via(&proxy, "ds");
    let t = tempfile::tempdir().unwrap();
    let staging = t.path().join("staging");
    let mut child = prep()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("PREP_STAGING", &staging)
        .args([
            "synth",
            "--train",
            "5120",
            "--test",
            "0",
            "--shape",
            "1x16x16",
            "--block-samples",
            "64",
            "--shard-blocks",
            "2",
            "--out",
            &url,
            "--quiet",
        ])
        .spawn()
        .unwrap();
    let shard_files = || {
        walkdir(&staging)
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "shard"))
            .count()
    };
    let mut most = 0;
    while child.try_wait().unwrap().is_none() {
        most = most.max(shard_files());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(child.wait().unwrap().success());
    // 4 uploading, 4 waiting, one being written, one just finished.
    assert!(
        most > 0 && most <= 10,
        "at most {most} shard files in staging at once"
    );
    let o = run_env(&env, &["verify", &url]);
    expect(&o, 0, "verify");
    assert!(stdout(&o).contains("40 shards"), "{}", stdout(&o));
}

/// Every file under `dir` (none if it is not there).
fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walkdir(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn writing_into_a_bucket_that_does_not_exist_says_so() {
    for kind in WRITABLE {
        let Some(server) = Server::start(kind) else {
            continue;
        };
        let url = format!("{}://no-such-bucket/ds", kind.scheme());
        let mut args = SMALL_SYNTH.to_vec();
        args.extend_from_slice(&["--out", &url]);
        let o = run_env(&server.env(), &args);
        expect_stderr(&o, 2, &format!("synth into {url}"), "no such bucket");
    }
}

#[test]
fn one_writer_at_a_time_holds_a_store_folder() {
    let Some(server) = Server::start(Kind::S3) else {
        return;
    };
    let env = server.env();
    server.put(
        "busy/.prep-lease.json",
        br#"{"host":"elsewhere","pid":42,"since_unix":0}"#,
    );
    let o = run_env(
        &env,
        &[
            "synth",
            "--train",
            "10",
            "--test",
            "0",
            "--out",
            &server.url("busy"),
        ],
    );
    expect(&o, 1, "synth into a leased folder");
    let e = stderr(&o);
    assert!(
        e.contains("being written by another prep") && e.contains("process 42 on host elsewhere"),
        "{e}"
    );
}

#[test]
fn no_secret_reaches_any_output_or_record() {
    let Some(server) = Server::start(Kind::S3) else {
        return;
    };
    let mut env = server.env();
    for (k, v) in env.iter_mut() {
        if k == "AWS_SECRET_ACCESS_KEY" {
            *v = SECRET.into();
        }
    }
    let t = tempfile::tempdir().unwrap();
    let url = server.url("ds");
    let mut outputs = Vec::new();
    let mut args = SMALL_SYNTH.to_vec();
    args.extend_from_slice(&["--out", &url]);
    outputs.push(run_env(&env, &args));
    outputs.push(run_env(&env, &["verify", &url]));
    outputs.push(run_env(&env, &["inspect", &url, "--json"]));
    outputs.push(run_env(&env, &["verify", &server.url("nothing")]));
    let signed = format!("{url}?X-Amz-Signature={SECRET}");
    outputs.push(run_env(&env, &["verify", &signed]));
    let with_user = url.replacen("://", &format!("://user:{SECRET}@"), 1);
    outputs.push(run_env(&env, &["verify", &with_user]));
    // A server that is not there: the error names the request, not the credentials.
    let mut down = env.clone();
    for (k, v) in down.iter_mut() {
        if k == "AWS_ENDPOINT_URL" {
            // A port just closed: nothing listens there.
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            *v = format!("http://127.0.0.1:{port}");
        }
    }
    outputs.push(run_env(&down, &["verify", &url]));
    outputs.push(run_env(
        &env,
        &[
            "train",
            &url,
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--out",
            t.path().join("run").to_str().unwrap(),
        ],
    ));
    for o in &outputs {
        let all = format!("{}{}", stdout(o), stderr(o));
        assert!(!all.contains(SECRET), "a secret in output:\n{all}");
    }
    // Nor in what was written: the run folder, the manifest in the store.
    for (name, bytes) in crate::util::files(&t.path().join("run")) {
        assert!(!String::from_utf8_lossy(&bytes).contains(SECRET), "{name}");
    }
    assert!(!String::from_utf8_lossy(&get(&server, "ds/manifest.json")).contains(SECRET));
}

#[test]
fn a_url_with_a_slash_missing_is_not_taken_for_a_folder() {
    let t = tempfile::tempdir().unwrap();
    let o = prep()
        .current_dir(t.path())
        .args([
            "synth",
            "--train",
            "10",
            "--test",
            "0",
            "--out",
            "s3:/bucket/ds",
        ])
        .output()
        .unwrap();
    expect_stderr(&o, 2, "synth --out s3:/bucket/ds", "two slashes");
    assert!(!t.path().join("s3:").exists());
    let o = prep().args(["verify", "ftp://host/ds"]).output().unwrap();
    expect_stderr(&o, 2, "verify ftp://", "not a store prep knows");
}
