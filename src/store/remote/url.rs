//! Dataset URLs: which store a location names, and how it is shown. A URL's user name, password
//! and query (a signed URL's signature, a SAS token) are secrets: they never reach a message.

use crate::util::error::{Error, Result};
use std::path::Path;

/// The kinds of store a dataset URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    S3,
    Gcs,
    Azure,
    Http,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::S3 => "S3",
            Scheme::Gcs => "Google Cloud Storage",
            Scheme::Azure => "Azure Blob Storage",
            Scheme::Http => "HTTP",
        }
    }
}

/// A dataset's place in a store: `s3://bucket/prefix`, `gs://bucket/prefix`,
/// `az://container/prefix`, `http(s)://host/prefix`.
#[derive(Debug, Clone)]
pub struct DataUrl {
    pub scheme: Scheme,
    /// The URL the store's builder is given (no query, no user information).
    pub(super) store_url: String,
    /// The dataset's folder within the store ("" at its root), without slashes at either end.
    pub prefix: String,
    /// The URL as messages show it.
    pub shown: String,
}

/// Whether `p` is written as a URL (`scheme://...`) rather than a local path. A relative path
/// whose first component ends in ':' followed by "//" cannot be meant as a folder.
pub fn is_url(p: &Path) -> bool {
    p.to_str().is_some_and(looks_like_url)
}

fn looks_like_url(s: &str) -> bool {
    match s.split_once("://") {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        }
        None => false,
    }
}

/// Parse a dataset URL; a scheme prep does not read, or a URL carrying secrets it cannot keep out
/// of its records, is refused naming what is accepted.
pub fn parse(s: &str) -> Result<DataUrl> {
    let bad = |why: String| Error::Invalid(format!("{}: {why}", redact(s)));
    let u = url::Url::parse(s).map_err(|e| bad(format!("not a URL prep can read ({e})")))?;
    let scheme = match u.scheme() {
        "s3" | "s3a" => Scheme::S3,
        "gs" => Scheme::Gcs,
        "az" | "azure" | "abfs" | "abfss" => Scheme::Azure,
        "http" | "https" => Scheme::Http,
        "file" => {
            return Err(bad(
                "give a local dataset as a plain path, not a file:// URL".into(),
            ))
        }
        other => {
            return Err(bad(format!(
                "`{other}://` is not a store prep knows; datasets live at a local path or at \
                 s3://, gs://, az:// or http(s):// URLs"
            )))
        }
    };
    if u.query().is_some() || u.fragment().is_some() {
        return Err(bad(
            "a URL with a query (a signed URL or token) is not taken: it would be recorded and \
             shown; give credentials through the store's environment variables instead"
                .into(),
        ));
    }
    if !u.username().is_empty() || u.password().is_some() {
        if scheme != Scheme::Azure || u.password().is_some() {
            return Err(bad(
                "a URL with a user name or password is not taken; give credentials through the \
                 store's environment variables"
                    .into(),
            ));
        }
    }
    let host = u.host_str().unwrap_or_default();
    if host.is_empty() {
        return Err(bad(format!(
            "names no {}",
            if scheme == Scheme::Http {
                "host"
            } else {
                "bucket"
            }
        )));
    }
    let prefix = u.path().trim_matches('/').to_string();
    // Looked for in what was written: the URL parser resolves them away.
    if s.split(['/', '?', '#']).any(|c| c == "." || c == "..") {
        return Err(bad("a path with . or .. components is not taken".into()));
    }
    let mut root = u.clone();
    root.set_path("");
    // The store is the bucket (for HTTP the server and its port); the dataset a path below it.
    let store_url = root.as_str().trim_end_matches('/').to_string();
    Ok(DataUrl {
        scheme,
        store_url,
        shown: format!(
            "{}{}{}",
            root.as_str().trim_end_matches('/'),
            if prefix.is_empty() { "" } else { "/" },
            prefix
        ),
        prefix,
    })
}

/// `s` with every URL's user information and query replaced, for messages: object stores' errors
/// name the request URL, which for a presigned or SAS URL carries its signature.
pub fn redact(s: &str) -> String {
    use std::sync::OnceLock;
    static RE: OnceLock<regex::Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?:[^/@\s]*@)?(?P<rest>[^\s?#]*)(?:[?#][^\s]*)?")
            .expect("a valid pattern")
    });
    let out = re.replace_all(s, |c: &regex::Captures| {
        let q = if c.get(0).is_some_and(|m| m.as_str().contains(['?', '#'])) {
            "?..."
        } else {
            ""
        };
        let user = if c.get(0).is_some_and(|m| {
            m.as_str()[c["scheme"].len()..]
                .split('/')
                .next()
                .unwrap_or("")
                .contains('@')
        }) {
            "...@"
        } else {
            ""
        };
        format!("{}{user}{}{q}", &c["scheme"], &c["rest"])
    });
    secrets_removed(&out)
}

/// `s` with the values of the credential variables of the environment replaced by "***": a
/// store's error may echo what it was given.
fn secrets_removed(s: &str) -> String {
    let mut out = s.to_string();
    for (k, v) in std::env::vars() {
        if v.len() >= 8 && is_secret_var(&k) && out.contains(&v) {
            out = out.replace(&v, "***");
        }
    }
    out
}

/// Whether environment variable `k` holds a credential.
pub fn is_secret_var(k: &str) -> bool {
    let k = k.to_ascii_uppercase();
    [
        "SECRET",
        "TOKEN",
        "KEY",
        "PASSWORD",
        "CREDENTIAL",
        "SAS",
        "SIGNATURE",
    ]
    .iter()
    .any(|w| k.contains(w))
        && !k.ends_with("_ID")
        && !k.ends_with("_PATH")
        && !k.ends_with("_FILE")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_store_and_folder() {
        let u = parse("s3://bucket/a/b/").unwrap();
        assert_eq!((u.scheme, u.prefix.as_str()), (Scheme::S3, "a/b"));
        assert_eq!(u.shown, "s3://bucket/a/b");
        assert_eq!(u.store_url, "s3://bucket");
        let u = parse("gs://b").unwrap();
        assert_eq!(
            (u.scheme, u.prefix.as_str(), u.shown.as_str()),
            (Scheme::Gcs, "", "gs://b")
        );
        let u = parse("az://container/ds").unwrap();
        assert_eq!((u.scheme, u.prefix.as_str()), (Scheme::Azure, "ds"));
        let u = parse("http://127.0.0.1:8080/data/ds").unwrap();
        assert_eq!(u.scheme, Scheme::Http);
        assert_eq!(u.store_url, "http://127.0.0.1:8080");
        assert_eq!(u.prefix, "data/ds");
    }

    #[test]
    fn unknown_schemes_and_secrets_in_urls_are_refused_without_showing_them() {
        for (s, want) in [
            ("ftp://host/ds", "not a store prep knows"),
            ("s3:/bucket", "names no bucket"),
            ("not a url", "not a URL"),
            (
                "https://host/ds?X-Amz-Signature=abcdef123456",
                "with a query",
            ),
            ("https://user:hunter2pass@host/ds", "user name or password"),
            ("s3://bucket/a/../b", ". or .."),
            ("file:///tmp/x", "plain path"),
        ] {
            let e = parse(s).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(want), "{s}: {e}");
            assert!(
                !e.contains("abcdef123456") && !e.contains("hunter2pass"),
                "{e}"
            );
        }
    }

    #[test]
    fn redaction_removes_queries_and_user_information() {
        let s = "error GET https://u:p4ssw0rd@h.example/b/k?X-Amz-Signature=deadbeef, retry";
        let r = redact(s);
        // The query runs to the next white space, punctuation after it included.
        assert_eq!(r, "error GET https://...@h.example/b/k?... retry");
        assert_eq!(redact("s3://bucket/x y"), "s3://bucket/x y");
    }

    #[test]
    fn paths_that_are_urls_are_told_from_folders() {
        assert!(is_url(Path::new("s3://b/x")));
        assert!(is_url(Path::new("http://h/x")));
        assert!(!is_url(Path::new("data/s3/x")));
        assert!(!is_url(Path::new("./s3:/x")));
        assert!(!is_url(Path::new("/abs/path")));
    }
}
