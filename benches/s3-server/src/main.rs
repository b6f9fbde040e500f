//! An S3 server for prep's store benchmarks: s3s-fs (the crates.io S3 server prep's tests also
//! use) for every operation, with two changes. A GET reads its byte range with one positioned
//! read instead of s3s-fs's 4 KiB steps through tokio's blocking pool (which caps s3s-fs near
//! 550 MB/s on 16 cores), and `--latency-ms` delays every response, as a remote store's time to
//! first byte, without a proxy copying the bytes. Signatures are checked by s3s as in s3s-fs.
//!
//!   prep-s3-bench-server --port P --access-key K --secret-key S [--latency-ms 20] ROOT

use s3s::dto::*;
use s3s::service::S3ServiceBuilder;
use s3s::{S3Request, S3Response, S3Result, S3};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

struct Bench {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
    latency: Duration,
}

fn internal(e: impl std::fmt::Display) -> s3s::S3Error {
    s3s::S3Error::with_message(s3s::S3ErrorCode::InternalError, e.to_string())
}

// Every operation but GET goes to s3s-fs after the delay (the macro writes the whole impl, as
// async_trait must see the methods it rewrites).
macro_rules! delegate {
    ($($name:ident: $input:ty => $output:ty;)*) => {
        #[async_trait::async_trait]
        impl S3 for Bench {
            $(
            async fn $name(&self, req: S3Request<$input>) -> S3Result<S3Response<$output>> {
                tokio::time::sleep(self.latency).await;
                self.fs.$name(req).await
            }
            )*
            async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
                tokio::time::sleep(self.latency).await;
                self.get(req).await
            }
        }
    };
}

delegate! {
        create_bucket: CreateBucketInput => CreateBucketOutput;
        head_bucket: HeadBucketInput => HeadBucketOutput;
        list_buckets: ListBucketsInput => ListBucketsOutput;
        get_bucket_location: GetBucketLocationInput => GetBucketLocationOutput;
        head_object: HeadObjectInput => HeadObjectOutput;
        put_object: PutObjectInput => PutObjectOutput;
        copy_object: CopyObjectInput => CopyObjectOutput;
        delete_object: DeleteObjectInput => DeleteObjectOutput;
        delete_objects: DeleteObjectsInput => DeleteObjectsOutput;
        list_objects: ListObjectsInput => ListObjectsOutput;
        list_objects_v2: ListObjectsV2Input => ListObjectsV2Output;
        create_multipart_upload: CreateMultipartUploadInput => CreateMultipartUploadOutput;
        upload_part: UploadPartInput => UploadPartOutput;
        list_parts: ListPartsInput => ListPartsOutput;
        complete_multipart_upload: CompleteMultipartUploadInput => CompleteMultipartUploadOutput;
        abort_multipart_upload: AbortMultipartUploadInput => AbortMultipartUploadOutput;
}

impl Bench {
    async fn get(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let (bucket, key, range) = (
            req.input.bucket.clone(),
            req.input.key.clone(),
            req.input.range,
        );
        // s3s-fs answers everything but the body: headers, errors (missing key, bad range), ETag.
        let mut resp = self.fs.get_object(req).await?;
        if bucket.contains("..") || key.split('/').any(|c| c == "..") {
            return Err(internal("path outside the root"));
        }
        let path = self.root.join(&bucket).join(&key);
        let body = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let file = std::fs::File::open(&path)?;
            let len = file.metadata()?.len();
            let span = match range {
                None => 0..len,
                Some(r) => r
                    .check(len)
                    .map_err(|_| std::io::Error::other("range not satisfiable"))?,
            };
            let mut buf = vec![0u8; (span.end - span.start) as usize];
            file.read_exact_at(&mut buf, span.start)?;
            Ok(buf)
        })
        .await
        .map_err(internal)?
        .map_err(internal)?;
        resp.output.body = Some(StreamingBlob::from(s3s::Body::from(bytes::Bytes::from(
            body,
        ))));
        Ok(resp)
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = PathBuf::from(
        args.last()
            .filter(|_| args.len() > 1)
            .expect("usage: ... ROOT"),
    );
    let port: u16 = arg(&args, "--port").map_or(8014, |p| p.parse().expect("--port"));
    let latency = Duration::from_millis(
        arg(&args, "--latency-ms").map_or(0, |v| v.parse().expect("--latency-ms")),
    );
    let fs = s3s_fs::FileSystem::new(&root).expect("root folder");
    let mut b = S3ServiceBuilder::new(Bench { fs, root, latency });
    if let (Some(ak), Some(sk)) = (arg(&args, "--access-key"), arg(&args, "--secret-key")) {
        b.set_auth(s3s::auth::SimpleAuth::from_single(ak, sk));
    }
    let service = b.build();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    let http = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let conn = http
            .serve_connection(hyper_util::rt::TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}
