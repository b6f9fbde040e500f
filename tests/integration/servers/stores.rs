//! object_store clients of the servers in this process, built as prep builds them from the
//! environment: each env name lowercased is the builder's config key (what `from_env` does).

use std::sync::Arc;
use std::time::Duration;

use object_store::{BackoffConfig, ObjectStore, RetryConfig};

use super::{Kind, Proxy, Server, AZURITE_ACCOUNT, BUCKET};

/// Install rustls's ring provider as the process default, as prep does at start: object_store's
/// reqwest client has no provider of its own. Idempotent.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Small retries, so a test of a server that is down ends in seconds (object_store's default
/// retries 10 times within 3 minutes): 2 retries, 50 ms then 100 ms apart, 3 s in all.
pub fn quick_retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
            base: 2.0,
        },
        max_retries: 2,
        retry_timeout: Duration::from_secs(3),
    }
}

impl Server {
    /// An object_store client of this server's [`BUCKET`] in this process; path `p` is `url(p)`.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.store_with(None, None)
    }

    /// The same through `proxy`, and/or with `retry` instead of object_store's default (10 retries
    /// within 3 minutes: far too long for a test of a server that is down).
    pub fn store_with(
        &self,
        proxy: Option<&Proxy>,
        retry: Option<RetryConfig>,
    ) -> Arc<dyn ObjectStore> {
        install_crypto();
        let port = match proxy {
            Some(p) => {
                self.check_proxy(p);
                p.port()
            }
            None => self.port,
        };
        let retry = retry.unwrap_or_default();
        let env = self.env_at(port);
        // The builders' own keys: an env name lowercased, as `from_env` parses it.
        let keys = |skip: &[&str]| {
            env.iter()
                .filter(|(k, _)| !skip.contains(&k.as_str()))
                .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                .collect::<Vec<_>>()
        };
        let store: Arc<dyn ObjectStore> = match self.kind {
            Kind::S3 => {
                let mut b = object_store::aws::AmazonS3Builder::new();
                for (k, v) in keys(&[]) {
                    b = b.with_config(k.parse().expect("an AmazonS3ConfigKey"), v);
                }
                Arc::new(
                    b.with_bucket_name(BUCKET)
                        .with_retry(retry)
                        .build()
                        .expect("S3 store"),
                )
            }
            Kind::Azure => {
                // AZURITE_BLOB_STORAGE_URL is read from the process environment by build(), not a
                // config key: in-process, the same server is the account endpoint instead.
                let mut b = object_store::azure::MicrosoftAzureBuilder::new();
                for (k, v) in keys(&["AZURE_STORAGE_USE_EMULATOR", "AZURITE_BLOB_STORAGE_URL"]) {
                    b = b.with_config(k.parse().expect("an AzureConfigKey"), v);
                }
                b = b
                    .with_endpoint(format!("http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"))
                    .with_allow_http(true);
                Arc::new(
                    b.with_container_name(BUCKET)
                        .with_retry(retry)
                        .build()
                        .expect("Azure store"),
                )
            }
            Kind::Gcs => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::new();
                for (k, v) in keys(&[]) {
                    b = b.with_config(k.parse().expect("a GoogleConfigKey"), v);
                }
                Arc::new(
                    b.with_bucket_name(BUCKET)
                        .with_retry(retry)
                        .build()
                        .expect("GCS store"),
                )
            }
            Kind::Http => Arc::new(
                object_store::http::HttpBuilder::new()
                    .with_url(format!("http://127.0.0.1:{port}"))
                    .with_config(object_store::ClientConfigKey::AllowHttp, "true")
                    .with_retry(retry)
                    .build()
                    .expect("HTTP store"),
            ),
        };
        store
    }
}
