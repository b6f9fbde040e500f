//! What the harness itself says to the servers: free ports, a plain HTTP/1.1 request over a std
//! `TcpStream` (readiness probes, bucket creation), and the one SharedKey-signed request Azurite
//! needs to create a container. No HTTP client crate: these requests are few and simple.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A port on 127.0.0.1 that nothing listened on a moment ago (the kernel's pick for port 0).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

pub fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One HTTP/1.1 request to 127.0.0.1:`port` with `Connection: close`; the status code and body.
/// Bounded: connecting takes at most 1 s, and each read or write at most `timeout`.
pub fn request(
    port: u16,
    method: &str,
    target: &str,
    headers: &[(&str, String)],
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr(port), Duration::from_secs(1))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut head =
        format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let _ = s.shutdown(Shutdown::Both);
    let text = String::from_utf8_lossy(&resp);
    let status = text
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {:.200}", text)))?;
    let body = match resp.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => resp[i + 4..].to_vec(),
        None => Vec::new(),
    };
    Ok((status, body))
}

/// Whether an HTTP server answers on `port` (any status: 403 from Azurite counts).
pub fn answers(port: u16, target: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr(port), Duration::from_millis(250)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let req =
        format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut first = [0u8; 5];
    s.read_exact(&mut first).is_ok() && &first == b"HTTP/"
}

/// A request to Azurite signed with the account key (SharedKey), path-style: `target` is
/// `/{account}/{container}[/{blob}]` (percent-encoded) and `query` its parameters; `ms_headers`
/// are extra `x-ms-*` headers. <https://learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key>
pub fn azure_signed(
    port: u16,
    method: &str,
    account: &str,
    key_b64: &str,
    target: &str,
    query: &[(&str, &str)],
    ms_headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let date = http_date(SystemTime::now());
    let mut headers: Vec<(String, String)> = ms_headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect();
    headers.push(("x-ms-date".into(), date));
    headers.push(("x-ms-version".into(), "2021-08-06".into()));
    headers.sort();
    // VERB, Content-Encoding, -Language, -Length (empty when 0), -MD5, -Type, Date,
    // If-Modified-Since, If-Match, If-None-Match, If-Unmodified-Since, Range, then the x-ms-
    // headers and the resource (/account then the path, which starts with the account again).
    let length = if body.is_empty() {
        String::new()
    } else {
        body.len().to_string()
    };
    let mut to_sign = format!("{method}\n\n\n{length}\n\n\n\n\n\n\n\n\n");
    for (k, v) in &headers {
        to_sign.push_str(&format!("{k}:{v}\n"));
    }
    to_sign.push_str(&format!("/{account}{target}"));
    let mut q: Vec<&(&str, &str)> = query.iter().collect();
    q.sort();
    for (k, v) in &q {
        to_sign.push_str(&format!("\n{}:{v}", k.to_ascii_lowercase()));
    }
    let key = base64_decode(key_b64).expect("account key is base64");
    let tag = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key),
        to_sign.as_bytes(),
    );
    headers.push((
        "Authorization".into(),
        format!("SharedKey {account}:{}", base64_encode(tag.as_ref())),
    ));
    let query: Vec<String> = q.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let target = if query.is_empty() {
        target.to_string()
    } else {
        format!("{target}?{}", query.join("&"))
    };
    let headers: Vec<(&str, String)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    request(
        port,
        method,
        &target,
        &headers,
        body,
        Duration::from_secs(30),
    )
}

/// Percent-encode all but unreserved characters (and `/` when `keep_slash`).
pub fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// RFC 1123 date in GMT, e.g. `Thu, 26 Nov 2026 11:59:40 GMT`.
pub fn http_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).expect("after 1970").as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(m - 1) as usize];
    format!(
        "{wd}, {d:02} {mon} {y} {:02}:{:02}:{:02} GMT",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for ch in s.bytes() {
        acc = acc << 6 | B64.iter().position(|&b| b == ch)? as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_wire_base64_and_date() {
        for (raw, enc) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(raw), enc);
            assert_eq!(base64_decode(enc).unwrap(), raw);
        }
        let t = UNIX_EPOCH + Duration::from_secs(1_795_694_380);
        assert_eq!(http_date(t), "Thu, 26 Nov 2026 11:59:40 GMT");
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "Tue, 29 Feb 2000 00:00:00 GMT"
        );
    }
}
