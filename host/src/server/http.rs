//! HTTP: hyper server, routing to families or native handlers, request
//! limits, JSON errors and one log line per request.

use crate::app::App;
use crate::money::payments::PaymentHeaders;
use crate::reply::Reply;
use crate::runtime::bindings::endpoint::marketplace::plugin::types as wit;
use crate::runtime::routes::{self, Handler, Match, Route};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Request headers that carry payment secrets: read by the host, never
/// passed to plugins and never logged.
const PAYMENT_HEADERS: &[&str] = &["x-cash-secret", "x-webcash-secret", "x-bitcoin-secret"];

/// Serve HTTP on `listener` until `shutdown` resolves.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let gate = Arc::new(Semaphore::new(app.config.max_instances as usize));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let gate = gate.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(app.clone(), gate.clone(), req));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
}

async fn handle(
    app: Arc<App>,
    gate: Arc<Semaphore>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let start = Instant::now();
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let (reply, route) = dispatch(&app, &gate, req).await;
    let family = route.as_deref().map_or("-", Route::owner);
    tracing::info!(
        target: "request",
        method = %method,
        path = %path,
        family = %family,
        status = reply.status,
        micros = start.elapsed().as_micros() as u64,
    );
    Ok(to_hyper(reply, method == "HEAD"))
}

pub(crate) fn to_hyper(reply: Reply, head: bool) -> Response<Full<Bytes>> {
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
    let mut has_type = false;
    for (name, value) in &reply.headers {
        has_type |= name.eq_ignore_ascii_case("content-type");
        builder = builder.header(name.as_str(), value.as_str());
    }
    if !has_type {
        builder = builder.header("content-type", "application/json");
    }
    let body = if head {
        Bytes::new()
    } else {
        Bytes::from(reply.body)
    };
    builder.body(Full::new(body)).unwrap_or_else(|e| {
        tracing::error!("invalid response from handler: {e}");
        let mut resp = Response::new(Full::new(Bytes::from_static(
            br#"{"code":"internal","message":"internal error"}"#,
        )));
        *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        resp.headers_mut().insert(
            "content-type",
            hyper::header::HeaderValue::from_static("application/json"),
        );
        resp
    })
}

/// Route one request; returns the reply and the family (or host handler) that served it.
async fn dispatch(
    app: &Arc<App>,
    gate: &Arc<Semaphore>,
    req: Request<Incoming>,
) -> (Reply, Option<Arc<Route>>) {
    let method = req.method().as_str().to_ascii_uppercase();
    let path = routes::canonical_path(req.uri().path());
    let (route, params) = match app.runtime.find(&method, &path) {
        Match::Found { route, params } => (route, params),
        Match::NotFound => {
            return (
                Reply::error(
                    404,
                    "not_found",
                    format!("no route for {method} {}", req.uri().path()),
                ),
                None,
            );
        }
        Match::MethodNotAllowed(allowed) => {
            let allow = allowed.join(", ");
            let mut reply = Reply::json(
                405,
                &json!({
                    "code": "method_not_allowed",
                    "message": format!("{method} is not allowed on {}; allowed: {allow}", req.uri().path()),
                    "allowed_methods": allowed,
                }),
            );
            reply.headers.push(("allow".into(), allow));
            return (reply, None);
        }
    };
    let served_by = Some(route.clone());

    // 413 is decided from a declared length before the body is read; a
    // chunked body is cut off at the same limit while reading.
    let max = route.max_body.unwrap_or(app.config.max_body_bytes);
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return (too_large(max), served_by);
    }
    let query = req
        .uri()
        .query()
        .map(routes::parse_query)
        .unwrap_or_default();
    let mut headers = Vec::new();
    let mut payment = PaymentHeaders::default();
    for (name, value) in req.headers() {
        let name = name.as_str();
        let Ok(value) = value.to_str() else { continue };
        match name {
            "x-cash-secret" => payment.cash = Some(value.trim().to_string()),
            "x-webcash-secret" => {
                payment.cash.get_or_insert_with(|| value.trim().to_string());
            }
            "x-bitcoin-secret" => payment.bitcoin = Some(value.trim().to_string()),
            _ if PAYMENT_HEADERS.contains(&name) => {}
            _ => headers.push((name.to_string(), value.to_string())),
        }
    }
    let body = match Limited::new(req.into_body(), max).collect().await {
        Ok(collected) => collected.to_bytes().to_vec(),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return (too_large(max), served_by);
            }
            return (
                Reply::error(400, "invalid_request", format!("could not read body: {e}")),
                served_by,
            );
        }
    };

    let reply = match &route.handler {
        Handler::Host(name) => {
            let (app2, name) = (app.clone(), *name);
            match tokio::task::spawn_blocking(move || {
                crate::runtime::native::handle(&app2.runtime, name, &body)
            })
            .await
            {
                Ok(reply) => reply,
                Err(e) => {
                    tracing::error!("host handler {name} failed: {e}");
                    Reply::error(500, "internal", "internal error")
                }
            }
        }
        Handler::Family(family) => {
            let request = wit::Request {
                method: if method == "HEAD" {
                    "GET".into()
                } else {
                    method.clone()
                },
                route: route.pattern.clone(),
                path,
                params,
                query,
                headers,
                body,
            };
            // Queue for a pool slot rather than failing when all are busy.
            let Ok(_permit) = gate.clone().acquire_owned().await else {
                return (
                    Reply::error(503, "plugin_unavailable", "shutting down"),
                    served_by,
                );
            };
            let app2 = app.clone();
            let family_name = family.clone();
            let writes = route.writes;
            match tokio::task::spawn_blocking(move || {
                app2.runtime.handle(&family_name, request, payment, writes)
            })
            .await
            {
                Ok(reply) => reply,
                Err(e) => {
                    tracing::error!(family = %family, "plugin task failed: {e}");
                    Reply::error(500, "internal", "internal error")
                }
            }
        }
    };
    (reply, served_by)
}

fn too_large(max: usize) -> Reply {
    Reply::json(
        413,
        &json!({
            "code": "payload_too_large",
            "message": format!("request body exceeds {max} bytes"),
            "max_bytes": max,
        }),
    )
}
