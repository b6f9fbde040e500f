//! The harness's own tests, with object_store as prep uses it: each server's round trip (put, head,
//! ranges, multipart, list, `PutMode::Create`, delete), `from_env` in a child process fed
//! `server.env()`, stop/restart, the proxy's latency and outage, and the skips without servers.
//! (Faults: `faults.rs`.) Outcomes worth knowing print as `servers: ...` lines (see them with `--nocapture`).

use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

use super::{Kind, Proxy, Server};

pub(super) const MIB: usize = 1 << 20;

pub(super) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Bytes that differ at every offset of a few MiB (so a misplaced range shows).
pub(super) fn pattern(len: usize, seed: u32) -> Bytes {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

pub(super) fn started(kind: Kind) -> Option<Server> {
    let server = Server::start(kind)?;
    eprintln!(
        "servers: {kind:?} ({}) answered in {:?}",
        kind.command(),
        server.started_in()
    );
    Some(server)
}

/// What `PutMode::Create` does on an object that exists.
async fn put_create_outcome(store: &dyn ObjectStore, p: &StorePath) -> String {
    let res = store
        .put_opts(
            p,
            PutPayload::from_static(b"second"),
            PutMode::Create.into(),
        )
        .await;
    let now = store.get(p).await.unwrap().bytes().await.unwrap();
    let kept = if now.as_ref() == b"second" {
        "overwritten"
    } else {
        "kept"
    };
    match res {
        Err(object_store::Error::AlreadyExists { .. }) => format!("AlreadyExists (object {kept})"),
        Err(e) => format!("error {e} (object {kept})"),
        Ok(_) => format!("Ok, silently (object {kept})"),
    }
}

fn roundtrip(kind: Kind) {
    let Some(server) = started(kind) else { return };
    let store = server.store();
    rt().block_on(async {
        let five = StorePath::from("selftest/five.bin");
        let data = pattern(5 * MIB, 1);
        store
            .put(&five, data.clone().into())
            .await
            .expect("put 5 MiB");
        assert_eq!(
            store.head(&five).await.expect("head").size,
            data.len() as u64
        );
        for r in [
            0..100u64,
            (MIB as u64 + 3)..(2 * MIB as u64 + 7),
            (5 * MIB as u64 - 10)..(5 * MIB as u64),
        ] {
            let got = store.get_range(&five, r.clone()).await.expect("get_range");
            assert!(
                got == data.slice(r.start as usize..r.end as usize),
                "{kind:?}: range {r:?} differs"
            );
        }
        let mut ranges = store
            .get_ranges(&five, &[10..20, 4_000_000..4_000_100])
            .await
            .expect("get_ranges");
        assert_eq!(ranges.pop().unwrap(), data.slice(4_000_000..4_000_100));

        // Multipart: 2 parts of 6 MiB (S3's minimum part is 5 MiB, the last excepted).
        let twelve = StorePath::from("selftest/twelve.bin");
        let big = pattern(12 * MIB, 2);
        let mut up = store.put_multipart(&twelve).await.expect("put_multipart");
        up.put_part(big.slice(..6 * MIB).into())
            .await
            .expect("part 1");
        up.put_part(big.slice(6 * MIB..).into())
            .await
            .expect("part 2");
        up.complete().await.expect("complete");
        let back = store
            .get(&twelve)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("body");
        assert!(
            back == big,
            "{kind:?}: multipart object differs ({} bytes back)",
            back.len()
        );

        store
            .put(&StorePath::from("other/x"), PutPayload::from_static(b"x"))
            .await
            .expect("put");
        let prefix = StorePath::from("selftest");
        let mut listed: Vec<(String, u64)> = store
            .list(Some(&prefix))
            .map_ok(|m| (m.location.to_string(), m.size))
            .try_collect()
            .await
            .expect("list");
        listed.sort();
        let want = [
            ("selftest/five.bin".to_string(), 5 * MIB as u64),
            ("selftest/twelve.bin".to_string(), 12 * MIB as u64),
        ];
        assert_eq!(listed, want, "{kind:?}: list selftest/");

        let created = StorePath::from("selftest/created");
        store
            .put_opts(
                &created,
                PutPayload::from_static(b"first"),
                PutMode::Create.into(),
            )
            .await
            .expect("create a new one");
        let outcome = put_create_outcome(&*store, &created).await;
        eprintln!("servers: {kind:?}: PutMode::Create on an existing object: {outcome}");
        // What each server does, as measured (helper-servers.md); a change here matters to
        // prep's lease and commit design.
        assert!(
            outcome.starts_with("AlreadyExists (object kept)"),
            "{kind:?}: {outcome}"
        );

        for p in [&five, &twelve, &created, &StorePath::from("other/x")] {
            store.delete(p).await.expect("delete");
        }
        assert!(matches!(
            store.head(&five).await,
            Err(object_store::Error::NotFound { .. })
        ));
    });
}

#[test]
fn s3_roundtrip() {
    roundtrip(Kind::S3)
}
#[test]
fn azure_roundtrip() {
    roundtrip(Kind::Azure)
}
/// fake-gcs-server (1.54) serves object_store's reads (its XML-API GET with ranges, HEAD, and
/// list-type=2 listing, DELETE) but not its writes (XML-API PUT, multipart): the data is put with
/// `server.put` (JSON API), and what object_store's writes get is printed and checked as known.
#[test]
fn gcs_roundtrip() {
    let Some(server) = started(Kind::Gcs) else {
        return;
    };
    let store = server.store();
    let data = pattern(5 * MIB, 1);
    server.put("selftest/five.bin", &data);
    server.put("selftest/sub/one", b"1");
    server.put("other/x", b"x");
    rt().block_on(async {
        let five = StorePath::from("selftest/five.bin");
        assert_eq!(
            store.head(&five).await.expect("head").size,
            data.len() as u64
        );
        for r in [
            0..100u64,
            (MIB as u64 + 3)..(2 * MIB as u64 + 7),
            (5 * MIB as u64 - 10)..(5 * MIB as u64),
        ] {
            let got = store.get_range(&five, r.clone()).await.expect("get_range");
            assert!(
                got == data.slice(r.start as usize..r.end as usize),
                "range {r:?} differs"
            );
        }
        assert!(store.get(&five).await.expect("get").bytes().await.unwrap() == data);
        let mut listed: Vec<(String, u64)> = store
            .list(Some(&StorePath::from("selftest")))
            .map_ok(|m| (m.location.to_string(), m.size))
            .try_collect()
            .await
            .expect("list");
        listed.sort();
        assert_eq!(
            listed,
            [
                ("selftest/five.bin".to_string(), 5 * MIB as u64),
                ("selftest/sub/one".to_string(), 1)
            ]
        );
        let missing = store.get(&StorePath::from("selftest/none")).await;
        assert!(
            matches!(missing, Err(object_store::Error::NotFound { .. })),
            "{missing:?}"
        );

        let put = store
            .put(
                &StorePath::from("selftest/w"),
                PutPayload::from_static(b"w"),
            )
            .await;
        let multipart = store
            .put_multipart(&StorePath::from("selftest/m"))
            .await
            .map(|_| ());
        let create = store
            .put_opts(&five, PutPayload::from_static(b"c"), PutMode::Create.into())
            .await;
        for (op, res) in [
            ("put", put.map(|_| ())),
            ("put_multipart", multipart),
            ("PutMode::Create", create.map(|_| ())),
        ] {
            eprintln!(
                "servers: Gcs: object_store {op}: {}",
                res.as_ref().map_or_else(|e| e.to_string(), |_| "ok".into())
            );
            assert!(
                res.is_err(),
                "fake-gcs-server now takes object_store's {op}: test writes on GCS too"
            );
        }
        assert_eq!(
            store.head(&five).await.expect("still there").size,
            data.len() as u64
        );
        // DELETE (XML API) it does take.
        store.delete(&five).await.expect("delete");
        let gone = store.head(&five).await;
        eprintln!("servers: Gcs: object_store delete: ok; head after it: {gone:?}");
        assert!(
            matches!(gone, Err(object_store::Error::NotFound { .. })),
            "{gone:?}"
        );
    });
}

#[test]
fn http_get_range_head() {
    let Some(server) = started(Kind::Http) else {
        return;
    };
    let data = pattern(3 * MIB + 17, 3);
    server.put("ds/shard-0.bin", &data);
    assert!(server.root().join("ds/shard-0.bin").is_file());
    assert_eq!(
        server.url("ds/shard-0.bin"),
        format!("http://127.0.0.1:{}/ds/shard-0.bin", server.port())
    );
    let store = server.store();
    rt().block_on(async {
        let p = StorePath::from("ds/shard-0.bin");
        assert_eq!(store.head(&p).await.expect("head").size, data.len() as u64);
        assert!(store.get(&p).await.expect("get").bytes().await.unwrap() == data);
        for r in [
            0..1u64,
            1_000_000..2_500_000,
            (data.len() as u64 - 5)..data.len() as u64,
        ] {
            let got = store.get_range(&p, r.clone()).await.expect("get_range");
            assert!(
                got == data.slice(r.start as usize..r.end as usize),
                "range {r:?} differs"
            );
        }
        let missing = store.get(&StorePath::from("ds/none")).await;
        assert!(
            matches!(missing, Err(object_store::Error::NotFound { .. })),
            "{missing:?}"
        );
    });
}

/// Run this test binary again as a child with `env`, to run one test that reads its environment.
fn child(test: &str, env: &[(String, String)]) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        test,
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    for (k, _) in std::env::vars() {
        if ["AWS_", "AZURE_", "AZURITE_", "GOOGLE_", "PREP_"]
            .iter()
            .any(|p| k.starts_with(p))
        {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.output().expect("run the test binary again")
}

/// Build the store exactly as prep does, from the process environment: read the object at
/// PREP_SERVERS_FROM_ENV_URL, and write one at PREP_SERVERS_FROM_ENV_PUT_URL if set. Only
/// meaningful as the child of [`from_env`].
#[test]
#[ignore = "run by the from_env tests, in a child process with a server's environment"]
fn from_env_child() {
    let Ok(url) = std::env::var("PREP_SERVERS_FROM_ENV_URL") else {
        return;
    };
    super::install_crypto();
    let build = |url: &str| -> (Arc<dyn ObjectStore>, StorePath) {
        let (scheme, rest) = url.split_once("://").unwrap();
        let key = StorePath::from(rest.split_once('/').unwrap().1);
        let store: Arc<dyn ObjectStore> = match scheme {
            "s3" => Arc::new(
                object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url)
                    .build()
                    .unwrap(),
            ),
            "az" => Arc::new(
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(url)
                    .build()
                    .unwrap(),
            ),
            "gs" => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(url)
                    .build()
                    .unwrap(),
            ),
            other => panic!("no from_env builder for {other}"),
        };
        (store, key)
    };
    rt().block_on(async {
        let (store, key) = build(&url);
        let back = store.get(&key).await.expect("get").bytes().await.unwrap();
        assert_eq!(back.as_ref(), b"seeded by the harness");
        if let Ok(put_url) = std::env::var("PREP_SERVERS_FROM_ENV_PUT_URL") {
            let (store, key) = build(&put_url);
            store
                .put(&key, PutPayload::from_static(b"from the environment"))
                .await
                .expect("put");
        }
    });
    println!("from_env ok: {url}");
}

fn from_env(kind: Kind, via_proxy: bool) {
    let Some(server) = started(kind) else { return };
    let proxy = via_proxy.then(|| Proxy::start(server.port()));
    server.put("selftest/seed.txt", b"seeded by the harness");
    let (mut env, url, put_url) = match &proxy {
        Some(p) => (
            server.env_via(p),
            server.url_via(p, "selftest/seed.txt"),
            server.url_via(p, "selftest/from-env.txt"),
        ),
        None => (
            server.env(),
            server.url("selftest/seed.txt"),
            server.url("selftest/from-env.txt"),
        ),
    };
    env.push(("PREP_SERVERS_FROM_ENV_URL".into(), url));
    let writes = kind != Kind::Gcs; // fake-gcs-server takes none of object_store's writes
    if writes {
        env.push(("PREP_SERVERS_FROM_ENV_PUT_URL".into(), put_url));
    }
    let out = child("servers::selftest::from_env_child", &env);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("from_env ok"),
        "{kind:?} from_env with {env:?}:\n{text}"
    );
    if let Some(p) = &proxy {
        let stats = p.stats();
        assert!(
            stats.connections >= 1 && stats.bytes_to_client > 0,
            "{stats:?}"
        );
    }
    if writes {
        // The child's object, through the in-process store: both recipes reach the same bucket.
        let back = rt().block_on(async {
            let got = server
                .store()
                .get(&StorePath::from("selftest/from-env.txt"))
                .await;
            got.unwrap().bytes().await.unwrap()
        });
        assert_eq!(back.as_ref(), b"from the environment");
    }
}

#[test]
fn s3_from_env() {
    from_env(Kind::S3, false)
}
#[test]
fn azure_from_env() {
    from_env(Kind::Azure, false)
}
#[test]
fn gcs_from_env() {
    from_env(Kind::Gcs, false)
}
#[test]
fn s3_from_env_via_proxy() {
    from_env(Kind::S3, true)
}
#[test]
fn azure_from_env_via_proxy() {
    from_env(Kind::Azure, true)
}
#[test]
fn gcs_from_env_via_proxy() {
    from_env(Kind::Gcs, true)
}
