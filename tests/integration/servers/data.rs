//! Data on the servers through their own APIs, without object_store (which creates no buckets,
//! and whose GCS writes fake-gcs-server does not take) and without an async runtime.

use std::fs;
use std::time::Duration;

use super::{wire, Kind, Server, AZURITE_ACCOUNT, AZURITE_KEY, BUCKET};

impl Server {
    /// Put test data at `path` (as `url(path)` names it) through the server's own API, without
    /// object_store and without an async runtime: moto takes unsigned PUTs, Azurite a signed Put
    /// Blob, fake-gcs-server a JSON-API media upload (it does not take object_store's XML-API
    /// PUT), and for HTTP the file is written under [`Server::root`].
    pub fn put(&self, path: &str, data: &[u8]) {
        let path = path.trim_start_matches('/');
        let t = Duration::from_secs(30);
        let res = match self.kind {
            Kind::S3 => wire::request(
                self.port,
                "PUT",
                &format!("/{BUCKET}/{}", wire::encode(path, true)),
                &[],
                data,
                t,
            ),
            Kind::Azure => wire::azure_signed(
                self.port,
                "PUT",
                AZURITE_ACCOUNT,
                AZURITE_KEY,
                &format!("/{AZURITE_ACCOUNT}/{BUCKET}/{}", wire::encode(path, true)),
                &[],
                &[("x-ms-blob-type", "BlockBlob")],
                data,
            ),
            Kind::Gcs => wire::request(
                self.port,
                "POST",
                &format!(
                    "/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={}",
                    wire::encode(path, false)
                ),
                &[("Content-Type", "application/octet-stream".into())],
                data,
                t,
            ),
            Kind::Http => {
                let file = self.root().join(path);
                fs::create_dir_all(file.parent().unwrap()).expect("create folders under root");
                fs::write(&file, data).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
                return;
            }
        };
        match res {
            Ok((200..=299, _)) => {}
            Ok((status, body)) => {
                panic!(
                    "{}: putting {path} answered {status}: {}",
                    self.kind.command(),
                    String::from_utf8_lossy(&body)
                )
            }
            Err(e) => panic!("{}: putting {path} failed: {e}", self.kind.command()),
        }
    }

    /// Create [`BUCKET`] through the server's own API (object_store creates no buckets). An
    /// existing one (after a restart) is fine.
    pub(super) fn create_bucket(&self) {
        let t = Duration::from_secs(10);
        let res = match self.kind {
            Kind::S3 => wire::request(self.port, "PUT", &format!("/{BUCKET}"), &[], b"", t),
            Kind::Azure => wire::azure_signed(
                self.port,
                "PUT",
                AZURITE_ACCOUNT,
                AZURITE_KEY,
                &format!("/{AZURITE_ACCOUNT}/{BUCKET}"),
                &[("restype", "container")],
                &[],
                b"",
            ),
            Kind::Gcs => wire::request(
                self.port,
                "POST",
                "/storage/v1/b?project=prep-test",
                &[("Content-Type", "application/json".into())],
                format!(r#"{{"name": "{BUCKET}"}}"#).as_bytes(),
                t,
            ),
            Kind::Http => return,
        };
        match res {
            Ok((200..=299 | 409, _)) => {}
            Ok((status, body)) => panic!(
                "{}: creating bucket {BUCKET} answered {status}: {}",
                self.kind.command(),
                String::from_utf8_lossy(&body)
            ),
            Err(e) => panic!(
                "{}: creating bucket {BUCKET} failed: {e}\n{}",
                self.kind.command(),
                self.log_tail(20)
            ),
        }
    }
}
