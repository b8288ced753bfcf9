//! Closing a connection without losing its last answer.
//!
//! A socket closed while bytes the server never read wait in it (a body
//! the server refused before reading it: 413, 503 busy) is reset, not
//! closed, and a reset can destroy the answer on its way: a client still
//! sending its body sees its write fail and never reads the 413. That is
//! what a reverse proxy meets (nginx sends the whole body, then reads the
//! answer; a failed write is its 502, and a failed upstream for all its
//! other clients). So a connection the server ends before its client did
//! is drained first, as web servers do ("lingering close"): its write side
//! is shut (the client reads the answer and the end), and what the client
//! still sends is read and dropped until it closes, with bounds: at most
//! [`QUIET`] without a byte, [`LONGEST`] in all, [`MOST_BYTES`], and
//! [`MOST_AT_ONCE`] sockets draining at once (past that, closed as before).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Longest wait for the next byte of a draining socket.
pub const QUIET: Duration = Duration::from_secs(1);
/// Longest a socket drains.
pub const LONGEST: Duration = Duration::from_secs(5);
/// Most bytes read from a draining socket.
pub const MOST_BYTES: usize = 64 << 20;
/// Most sockets draining at once.
pub const MOST_AT_ONCE: usize = 512;

static DRAINING: AtomicUsize = AtomicUsize::new(0);

/// A connection's socket, drained when dropped before its client closed
/// its side.
pub struct Lingering {
    stream: Option<TcpStream>,
    /// The client closed its side (a read found the end).
    ended: bool,
}

impl Lingering {
    pub fn new(stream: TcpStream) -> Lingering {
        Lingering {
            stream: Some(stream),
            ended: false,
        }
    }

    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.stream.as_mut().expect("taken only when dropped"))
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = this.stream().poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(())))
            && buf.filled().len() == before
            && buf.remaining() > 0
        {
            this.ended = true;
        }
        read
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().stream().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().stream().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().stream().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().stream().poll_shutdown(cx)
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        if self.ended {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(place) = Draining::take() else {
            return;
        };
        runtime.spawn(async move {
            drain(stream).await;
            drop(place);
        });
    }
}

/// One of the [`MOST_AT_ONCE`] places, given back when dropped (also when
/// its task is dropped unpolled, as a runtime shutting down does).
struct Draining;

impl Draining {
    fn take() -> Option<Draining> {
        if DRAINING.fetch_add(1, Ordering::Relaxed) >= MOST_AT_ONCE {
            DRAINING.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Draining)
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        DRAINING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Shut the write side, then read and drop what comes until the client
/// closes or a bound is reached.
async fn drain(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let until = tokio::time::Instant::now() + LONGEST;
    let mut buf = vec![0u8; 16 << 10];
    let mut read = 0;
    while read < MOST_BYTES {
        let quiet = (tokio::time::Instant::now() + QUIET).min(until);
        match tokio::time::timeout_at(quiet, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => read += n,
            _ => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// The server answers before reading a body and drops its side; the
    /// client, still sending, writes it all and then reads the answer and
    /// a clean end (without the drain: a reset).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_still_sending_reads_the_answer_and_a_clean_end() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.write_all(b"POST / HTTP/1.1\r\ncontent-length: 4194304\r\n\r\n")
                .unwrap();
            // The answer first, as a proxy would see it once it sent all.
            let mut answer = [0u8; 12];
            c.read_exact(&mut answer).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            c.write_all(&vec![b'x'; 4 << 20])?;
            c.shutdown(std::net::Shutdown::Write)?;
            let mut rest = Vec::new();
            c.read_to_end(&mut rest)?;
            Ok::<_, io::Error>(answer)
        });
        let (stream, _) = listener.accept().await.unwrap();
        let mut conn = Lingering::new(stream);
        let mut head = [0u8; 16];
        conn.read_exact(&mut head).await.unwrap();
        conn.write_all(b"HTTP/1.1 413 x").await.unwrap();
        conn.shutdown().await.unwrap();
        drop(conn);
        let answer = tokio::task::spawn_blocking(move || client.join().unwrap())
            .await
            .unwrap()
            .expect("the client wrote its body and read a clean end");
        assert_eq!(&answer, b"HTTP/1.1 413");
    }

    #[tokio::test]
    async fn a_client_that_closed_first_is_not_drained() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let c = std::net::TcpStream::connect(addr).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        drop(c);
        let mut conn = Lingering::new(stream);
        let mut buf = [0u8; 8];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 0);
        assert!(conn.ended);
    }
}
