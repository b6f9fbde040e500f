//! An `ObjectStore` for a dataset URL, configured as each cloud's own tools are: from the
//! environment (AWS_* with AWS_ENDPOINT_URL for S3-compatible stores and AWS_PROFILE's files,
//! GOOGLE_APPLICATION_CREDENTIALS / GOOGLE_SERVICE_ACCOUNT, AZURE_STORAGE_*), retrying transient
//! errors with exponential backoff.

use super::redact;
use super::url::{DataUrl, Scheme};
use crate::util::error::{Error, Result};
use object_store::client::ClientConfigKey;
use object_store::{ObjectStore, RetryConfig};
use std::sync::Arc;
use std::time::Duration;

/// How long one request keeps being retried before its error is reported (PREP_STORE_RETRY_SECONDS,
/// default 120).
fn retry() -> RetryConfig {
    let secs = std::env::var("PREP_STORE_RETRY_SECONDS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(120.0);
    RetryConfig {
        max_retries: if secs == 0.0 { 0 } else { 10 },
        retry_timeout: Duration::from_secs_f64(secs),
        ..Default::default()
    }
}

/// rustls's cryptography (ring), installed once per process before the first client is built.
fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

pub(super) fn store(url: &DataUrl) -> Result<Arc<dyn ObjectStore>> {
    install_crypto();
    let failed = |e: object_store::Error| {
        Error::Invalid(format!(
            "{}: cannot use this {} location: {}",
            url.shown,
            url.scheme.name(),
            redact(&e.to_string())
        ))
    };
    // An endpoint given as http:// (a local or private S3-compatible server, the emulators) is
    // allowed; every default endpoint is https.
    let allow_http = (ClientConfigKey::AllowHttp, "true");
    let store: Arc<dyn ObjectStore> = match url.scheme {
        Scheme::S3 => {
            let mut b = object_store::aws::AmazonS3Builder::from_env()
                .with_url(&url.store_url)
                .with_retry(retry());
            if std::env::var("AWS_ALLOW_HTTP").is_err() {
                b = b.with_config(
                    object_store::aws::AmazonS3ConfigKey::Client(allow_http.0),
                    allow_http.1,
                );
            }
            Arc::new(b.build().map_err(failed)?)
        }
        Scheme::Gcs => {
            let b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(&url.store_url)
                .with_retry(retry())
                .with_config(
                    object_store::gcp::GoogleConfigKey::Client(allow_http.0),
                    allow_http.1,
                );
            Arc::new(b.build().map_err(failed)?)
        }
        Scheme::Azure => {
            let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(&url.store_url)
                .with_retry(retry());
            if std::env::var("AZURE_ALLOW_HTTP").is_err() {
                b = b.with_config(
                    object_store::azure::AzureConfigKey::Client(allow_http.0),
                    allow_http.1,
                );
            }
            Arc::new(b.build().map_err(failed)?)
        }
        Scheme::Http => {
            let b = object_store::http::HttpBuilder::new()
                .with_url(&url.store_url)
                .with_retry(retry())
                .with_config(allow_http.0, allow_http.1);
            Arc::new(b.build().map_err(failed)?)
        }
    };
    Ok(store)
}
