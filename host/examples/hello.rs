//! The baseline of `tests/bench/external.rs`: a plain hyper 1 HTTP/1.1
//! server (keep-alive, tokio multi-thread runtime with the default worker
//! count, as `marketplace serve` uses) answering every request with the
//! same JSON the host's `GET /_testing/native` answers. Nothing else: no
//! routing, logging, metrics or limits.
//!
//! `cargo build --release -p marketplace --example hello`, then
//! `target/release/examples/hello [ADDR]` (default `127.0.0.1:0`); it prints
//! `hello listening on http://ADDR` once it accepts connections. With
//! `HELLO_BODY=<file>` it answers that file's bytes instead (what an answer
//! of that size costs to send, e.g. a saved search page).

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::io::Write;

async fn hello(body: Bytes) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut resp = Response::new(Full::new(body));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let body = match std::env::var_os("HELLO_BODY") {
        Some(path) => Bytes::from(std::fs::read(&path).map_err(|e| {
            std::io::Error::new(e.kind(), format!("HELLO_BODY {}: {e}", path.display()))
        })?),
        None => Bytes::from_static(br#"{"ok":true}"#),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        println!("hello listening on http://{}", listener.local_addr()?);
        std::io::stdout().flush()?;
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let body = body.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_: Request<Incoming>| hello(body.clone()));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}
