//! What a drain does with connections that have a request the server has
//! not read yet. Closing a socket with unread bytes makes the kernel reset
//! it, so a client whose request was already sent would see a reset
//! instead of an answer:
//! - a connection still in the listen backlog (connected, not accepted)
//!   when the signal comes is accepted and served ([`take_backlog`]);
//! - a keep-alive connection between requests stays open for a moment
//!   (`drain_linger_ms`, in `http`), so a request on its way is served,
//!   answered with `connection: close`; one whose next request is in its
//!   socket when that moment ends ([`Socket::request_waiting`]) serves it too.
//!
//! A request sent after that moment still meets a closing connection:
//! HTTP/1.1 clients must expect that of any idle connection.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use tokio::net::{TcpListener, TcpStream};

/// The connections waiting in `listener`'s backlog, accepted without
/// waiting; the listener is closed afterwards (new clients are refused).
pub fn take_backlog(listener: TcpListener) -> Vec<(TcpStream, SocketAddr)> {
    let mut out = Vec::new();
    let listener = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("taking the listen backlog: {e}");
            return out;
        }
    };
    // Still non-blocking (tokio set it): accept until none is waiting.
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                let stream = stream
                    .set_nonblocking(true)
                    .and_then(|()| TcpStream::from_std(stream));
                match stream {
                    Ok(s) => out.push((s, peer)),
                    Err(e) => tracing::warn!(%peer, "a connection of the backlog: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!("taking the listen backlog: {e}");
                break;
            }
        }
    }
    out
}

/// The socket of a connection, kept to look into it when a drain begins.
#[derive(Clone, Copy)]
pub struct Socket(RawFd);

impl Socket {
    pub fn of(stream: &TcpStream) -> Socket {
        Socket(stream.as_raw_fd())
    }

    /// Whether bytes the server has not read wait in the socket (a
    /// request already sent). Only while the connection that owns the
    /// socket is alive.
    pub fn request_waiting(self) -> bool {
        // SAFETY: the caller's connection owns this descriptor and has not
        // closed it (it is still being polled); the duplicate made here is
        // closed before returning and leaves the original untouched.
        let fd = unsafe { BorrowedFd::borrow_raw(self.0) };
        let Ok(dup) = fd.try_clone_to_owned() else {
            return false;
        };
        let socket = std::net::TcpStream::from(dup);
        // The descriptor is non-blocking (tokio's): no data is WouldBlock.
        matches!(socket.peek(&mut [0u8; 1]), Ok(n) if n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[tokio::test]
    async fn a_sent_request_is_seen_waiting_and_the_backlog_is_taken() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut first = std::net::TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let socket = Socket::of(&server);
        assert!(!socket.request_waiting(), "nothing sent yet");
        first.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !socket.request_waiting() {
            assert!(
                std::time::Instant::now() < deadline,
                "the request never showed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Peeking leaves the bytes for the connection, and the original
        // descriptor open.
        let mut buf = [0u8; 64];
        server.readable().await.unwrap();
        let n = server.try_read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n\r\n");

        // Two clients connected but not accepted (connect returns once the
        // kernel has queued them): both taken.
        let _a = std::net::TcpStream::connect(addr).unwrap();
        let _b = std::net::TcpStream::connect(addr).unwrap();
        assert_eq!(take_backlog(listener).len(), 2);
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "the listener is closed"
        );
    }
}
