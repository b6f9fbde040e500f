//! The harness's fault tests: stop and restart each server, the proxy's latency, cut and outage
//! seen through object_store, and the skips when the servers are not installed.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::selftest::{pattern, rt, started, MIB};
use super::{quick_retry, Kind, Proxy, Server};

/// stop: requests fail fast (connection refused); restart: same port, and the data dir kept.
fn stop_restart(kind: Kind) {
    let Some(mut server) = started(kind) else {
        return;
    };
    let port = server.port();
    let p = StorePath::from("ds/kept.bin");
    server.put("ds/kept.bin", b"kept");
    let store = server.store_with(None, Some(quick_retry()));
    let rt = rt();
    server.stop();
    assert!(!server.is_running());
    let t = Instant::now();
    let err = rt
        .block_on(store.get(&p))
        .map(|_| ())
        .expect_err("a stopped server answers nothing");
    eprintln!(
        "servers: {kind:?} stopped: get failed in {:?}: {err}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(15));
    server.restart();
    assert_eq!(server.port(), port);
    eprintln!("servers: {kind:?} restarted in {:?}", server.started_in());
    let got = rt.block_on(async { store.get(&p).await?.bytes().await });
    match kind {
        // moto keeps its objects in memory only: a restart empties it (the bucket is created again).
        Kind::S3 => assert!(
            matches!(got, Err(object_store::Error::NotFound { .. })),
            "{got:?}"
        ),
        _ => assert_eq!(got.expect("the object is still there").as_ref(), b"kept"),
    }
}

#[test]
fn s3_stop_restart() {
    stop_restart(Kind::S3)
}
#[test]
fn azure_stop_restart() {
    stop_restart(Kind::Azure)
}
#[test]
fn gcs_stop_restart() {
    stop_restart(Kind::Gcs)
}
#[test]
fn http_stop_restart() {
    stop_restart(Kind::Http)
}

/// 20 concurrent range reads through a proxy adding 30 ms per request: their latencies overlap.
fn proxy_latency(kind: Kind) {
    let Some(server) = started(kind) else { return };
    let data = pattern(4 * MIB, 4);
    let p = StorePath::from("ds/lat.bin");
    let rt = rt();
    server.put("ds/lat.bin", &data);
    let proxy = Proxy::start(server.port());
    let store = server.store_with(Some(&proxy), None);
    let burst = |store: &Arc<dyn ObjectStore>| {
        rt.block_on(async {
            let t = Instant::now();
            let reads = (0..20u64).map(|i| {
                let (store, p) = (store.clone(), p.clone());
                async move {
                    store
                        .get_range(&p, i * 100_000..i * 100_000 + 64 * 1024)
                        .await
                }
            });
            let got = futures::future::try_join_all(reads)
                .await
                .expect("20 get_range");
            for (i, g) in got.iter().enumerate() {
                assert!(g == &data.slice(i * 100_000..i * 100_000 + 64 * 1024));
            }
            t.elapsed()
        })
    };
    burst(&store); // warm: connections open, DNS-free already
    let base = burst(&store);
    let latency = Duration::from_millis(30);
    proxy.set_latency(latency);
    let one = rt.block_on(async {
        let t = Instant::now();
        store.get_range(&p, 0..10).await.unwrap();
        t.elapsed()
    });
    let slow = burst(&store);
    let stats = proxy.stats();
    eprintln!(
        "servers: {kind:?} via proxy: 20 concurrent get_range in {base:?} without latency, {slow:?} with 30 ms a request \
         (20 x 30 ms = 600 ms); one get_range {one:?}; {stats:?}"
    );
    assert!(
        one >= latency,
        "one request took {one:?}, less than the added {latency:?}"
    );
    assert!(
        slow < base + 10 * latency,
        "{slow:?} (base {base:?}): the 20 requests' latencies did not overlap"
    );
    assert!(stats.connections >= 1 && stats.bytes_to_client >= 40 * 64 * 1024);
}

#[test]
fn proxy_latency_http() {
    proxy_latency(Kind::Http)
}
#[test]
fn proxy_latency_s3() {
    proxy_latency(Kind::S3)
}

/// set_down: a get fails within a bounded time, with small retries; set_down(false): back.
#[test]
fn proxy_down_s3() {
    let Some(server) = started(Kind::S3) else {
        return;
    };
    let proxy = Proxy::start(server.port());
    let store = server.store_with(Some(&proxy), Some(quick_retry()));
    let p = StorePath::from("ds/down.bin");
    let rt = rt();
    rt.block_on(store.put(&p, PutPayload::from_static(b"up")))
        .expect("put through the proxy");
    proxy.set_down(true);
    let t = Instant::now();
    let err = rt
        .block_on(store.get(&p))
        .map(|_| ())
        .expect_err("get while the proxy is down");
    let took = t.elapsed();
    eprintln!("servers: S3 via proxy set_down(true): get failed in {took:?} (max_retries 2, retry_timeout 3 s): {err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(proxy.stats().refused >= 1);
    proxy.set_down(false);
    let back = rt
        .block_on(async { store.get(&p).await?.bytes().await })
        .expect("get after set_down(false)");
    assert_eq!(back.as_ref(), b"up");
}

/// Without the servers on PATH the tests skip (and pass); with PREP_REQUIRE_SERVERS=1 they fail.
#[test]
fn skip_without_servers() {
    if std::env::var_os("PREP_SERVERS_CHILD").is_some() {
        return;
    }
    let run = |filter: &str, exact: bool, require: bool| {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.arg(filter).args(["--nocapture", "--test-threads", "2"]);
        if exact {
            cmd.arg("--exact");
        }
        cmd.env("PATH", "/nonexistent")
            .env("PREP_SERVERS_CHILD", "1")
            .env_remove("PREP_REQUIRE_SERVERS");
        if require {
            cmd.env("PREP_REQUIRE_SERVERS", "1");
        }
        let out = cmd.output().expect("run the test binary again");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = run("servers::", false, false);
    assert!(
        ok,
        "without servers the self-tests must skip and pass:\n{text}"
    );
    for kind in Kind::ALL {
        let line = format!(
            "skipped: {} is not installed (scripts/test-servers.sh install)",
            kind.command()
        );
        assert!(text.contains(&line), "no '{line}' in:\n{text}");
    }
    let (ok, text) = run("servers::selftest::s3_roundtrip", true, true);
    assert!(
        !ok && text.contains("PREP_REQUIRE_SERVERS=1 but moto_server is not installed"),
        "{text}"
    );
}

/// Start each server 3 times and print the times (`cargo test --test integration
/// servers::faults::start_times -- --ignored --nocapture`).
#[test]
#[ignore = "a measurement"]
fn start_times() {
    for kind in Kind::ALL {
        let mut times = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let Some(s) = Server::start(kind) else { break };
            times.push((s.started_in(), t.elapsed()));
        }
        eprintln!("servers: {kind:?} start (answers, with bucket and temp dir): {times:?}");
    }
}

/// A download cut mid-body (`cut`: the connection closes, new ones go through) and one whose proxy
/// goes down mid-body (`set_down`): what object_store's get stream does with each.
#[test]
fn proxy_cut_mid_get_http() {
    let Some(server) = started(Kind::Http) else {
        return;
    };
    let data = pattern(32 * MIB, 5);
    server.put("ds/big.bin", &data);
    let proxy = Proxy::start(server.port());
    let store = server.store_with(Some(&proxy), Some(quick_retry()));
    let p = StorePath::from("ds/big.bin");
    let rt = rt();
    for down in [false, true] {
        let t = Instant::now();
        let res: object_store::Result<Vec<u8>> = rt.block_on(async {
            let mut stream = store.get(&p).await?.into_stream();
            let mut body = stream.try_next().await?.expect("a first chunk").to_vec();
            if down {
                proxy.set_down(true);
            } else {
                proxy.cut();
            }
            while let Some(chunk) = stream.try_next().await? {
                body.extend_from_slice(&chunk);
            }
            Ok(body)
        });
        proxy.set_down(false);
        let what = if down { "set_down(true)" } else { "cut()" };
        match &res {
            Ok(body) => eprintln!(
                "servers: Http via proxy, {what} mid-get of 32 MiB: Ok after {:?}, {} bytes, equal: {}; {:?}",
                t.elapsed(),
                body.len(),
                body.as_slice() == data.as_ref(),
                proxy.stats()
            ),
            Err(e) => eprintln!("servers: Http via proxy, {what} mid-get of 32 MiB: failed after {:?}: {e}", t.elapsed()),
        }
        if let Ok(body) = &res {
            assert!(
                body.as_slice() == data.as_ref(),
                "a resumed body must be the object"
            );
        }
        if down {
            assert!(
                res.is_err(),
                "the proxy is down: the rest of the body cannot come"
            );
        }
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}
