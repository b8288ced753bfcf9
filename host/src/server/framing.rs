//! JSON bodies for the answers hyper writes on its own. A request hyper
//! cannot parse (a request line that is not HTTP, a bad `Content-Length`,
//! a URI or a head over its limits) never reaches a route: hyper answers
//! 400, 414 or 431 itself, with no body, and closes the connection. Every
//! error of this service is JSON (PROTOCOL section 1), so the connection's
//! writer ([`JsonErrors`]) recognises those answers (one of these statuses
//! with `content-length: 0` and no `x-request-id`, which every answer of
//! ours carries) and writes them with the JSON body instead.

use crate::reply::Reply;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection's stream, whose writes pass through but for hyper's own
/// error answers.
pub struct JsonErrors<S> {
    inner: S,
    /// The client, for the line that says what was refused.
    peer: std::net::IpAddr,
    /// A rewritten answer still to be written, and how much of it was.
    pending: Vec<u8>,
    written: usize,
}

impl<S> JsonErrors<S> {
    pub fn new(inner: S, peer: std::net::IpAddr) -> Self {
        JsonErrors {
            inner,
            peer,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// The JSON answer for hyper's answer with this status.
fn json_answer(status: &[u8]) -> Option<Reply> {
    Some(match status {
        b"400" => Reply::invalid(
            "request",
            "could not be parsed as HTTP/1.1 (request line, header or Content-Length)",
        ),
        b"414" => Reply::error(414, "uri_too_long", "the request URI is too long"),
        b"431" => Reply::error(
            431,
            "headers_too_large",
            "the request head (request line and headers) is too large",
        ),
        _ => return None,
    })
}

/// A request refused before it was parsed is counted as a request no
/// route took (`marketplace_requests_total{family="-"}`) and logged, one
/// line a second at most (it has no method or path to write an access
/// line with; a flood of them would be one line per request).
fn refused(peer: std::net::IpAddr, status: &[u8]) {
    let status: u16 = std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    crate::metrics::metrics()
        .requests
        .get_or_create(&crate::metrics::RequestLabels {
            family: "-".into(),
            route: "-".into(),
            status,
        })
        .inc();
    static LINES: crate::logging::Throttle =
        crate::logging::Throttle::new(std::time::Duration::from_secs(1));
    if let Some(n) = LINES.note() {
        tracing::info!(
            %peer,
            status,
            refused_since_last_line = n,
            "refused a request that could not be parsed (its request line or head)"
        );
    }
}

/// `head` (a whole answer hyper wrote) with a JSON error body, when it is
/// one of hyper's own bodiless error answers.
fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    let rest = head.strip_prefix(b"HTTP/1.1 ")?;
    let body = json_answer(rest.get(..3)?)?.body;
    let end = memchr::memmem::find(head, b"\r\n\r\n")?;
    // Nothing but the head: hyper's answer has no body.
    if end + 4 != head.len() {
        return None;
    }
    let lines = &head[..end + 2];
    // Every answer that went through a route or the host's dispatch
    // carries the request's id; hyper's own answers never do. So a
    // component's bodiless 400, or the answer to a HEAD (no body whatever
    // its status), is left as it is.
    if memchr::memmem::find(lines, b"\r\nx-request-id:").is_some() {
        return None;
    }
    let empty = memchr::memmem::find(lines, b"\r\ncontent-length: 0\r\n")?;
    let mut out = Vec::with_capacity(head.len() + body.len() + 64);
    out.extend_from_slice(&lines[..empty + 2]);
    out.extend_from_slice(b"content-type: application/json\r\ncontent-length: ");
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&lines[empty + b"\r\ncontent-length: 0\r\n".len()..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
    Some(out)
}

impl<S: AsyncWrite + Unpin> JsonErrors<S> {
    /// Write what is pending of a rewritten answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        // Only an answer starting with an error status line is looked at.
        if buf.starts_with(b"HTTP/1.1 4")
            && let Some(answer) = rewrite(buf)
        {
            refused(this.peer, &buf[9..12]);
            this.pending = answer;
            this.written = 0;
            // Taken whole: the rest goes out before anything else.
            let _ = this.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        // hyper's own answers are a head alone, in one buffer.
        let mut written = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(only), None) = (written.next(), written.next())
            && only.starts_with(b"HTTP/1.1 4")
        {
            return Pin::new(this).poll_write(cx, only);
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bodiless_errors_get_a_json_body_and_nothing_else_changes() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Fri, 27 Nov 2026 13:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(rewrite(head).unwrap()).unwrap();
        let (lines, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(lines.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(lines.contains("\r\ncontent-type: application/json\r\n"));
        assert!(lines.contains(&format!("\r\ncontent-length: {}\r\n", body.len())));
        assert!(lines.contains("\r\ndate: Fri, 27 Nov 2026 13:00:00 GMT"));
        assert!(!lines.contains("content-length: 0"));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["code"], "headers_too_large");
        for status in ["400 Bad Request", "414 URI Too Long"] {
            let head = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
            assert!(rewrite(head.as_bytes()).is_some(), "{status}");
        }
        // Our own answers: a body, another status, or more than a head.
        for other in [
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nx",
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 10\r\n\r\n",
            "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nx-request-id: a-1\r\n\r\n",
            "HTTP/1.1 431 Request Header Fields Too Large\r\nx-request-id: b\r\ncontent-length: 0\r\n\r\n",
        ] {
            assert!(rewrite(other.as_bytes()).is_none(), "{other}");
        }
    }
}
