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
//! [`MOST_AT_ONCE`] sockets draining at once, at most [`MOST_PER_ADDRESS`]
//! of them from one client address (past that, closed as before: one
//! stranger trickling bytes into many refused connections cannot take
//! every place). A trusted proxy's connections carry many clients, so
//! they count only against the whole.
//!
//! The other way round, a client that reads nothing of its answer for
//! the connection's write timeout (the header timeout) has its connection
//! reset, not drained nor closed: it would keep the answer's bytes for as
//! long as it liked (see `super::answers`), in the kernel's queue of a
//! closed socket too. And a connection that ends (drained, or its client
//! closed its side) while the kernel still holds answer bytes for it is
//! closed once its client has read them, or reset ([`settle`]; a draining
//! place is held meanwhile, the drain's time and then at most
//! [`SETTLE_MOST`] write timeouts; with no place left, reset at once).

use super::connections::State;
use super::shares::Shares;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
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
pub const MOST_AT_ONCE: u64 = 512;
/// Most sockets of one client address draining at once.
pub const MOST_PER_ADDRESS: u64 = 64;

static PLACES: Shares = Shares::new(MOST_AT_ONCE, MOST_PER_ADDRESS);

/// A connection's socket, drained when dropped before its client closed
/// its side.
pub struct Lingering {
    stream: Option<TcpStream>,
    /// The address its drain counts against (`None`: a trusted proxy's).
    peer: Option<IpAddr>,
    /// The client closed its side (a read found the end), or read nothing
    /// for `write_timeout`: not drained.
    ended: bool,
    /// Its client read nothing of the answer for `write_timeout`: reset
    /// when dropped.
    cut_off: bool,
    /// Longest a write may wait for the client to read.
    write_timeout: Duration,
    /// Since a write found no room: ends at `write_timeout`, with the
    /// bytes the kernel still held to send then.
    stalled: Option<(Pin<Box<tokio::time::Sleep>>, Option<u32>)>,
    /// Told of every write that went through (the header timeout counts
    /// from the last, see [`State::head_due`]).
    state: Option<Arc<State>>,
}

/// Bytes the kernel holds to send on `stream` (sent but not acknowledged,
/// or not sent yet), if it says.
fn unsent(stream: &TcpStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ on a socket this stream owns writes one int.
    let ok = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut queued) } == 0;
    ok.then(|| u32::try_from(queued).ok()).flatten()
}

impl Lingering {
    /// `peer` is the address the drain counts against, `None` for a
    /// trusted proxy's connection; `state`, the connection's, is told of
    /// its writes.
    pub fn new(
        stream: TcpStream,
        peer: Option<IpAddr>,
        write_timeout: Duration,
        state: Option<Arc<State>>,
    ) -> Lingering {
        Lingering {
            stream: Some(stream),
            peer,
            ended: false,
            cut_off: false,
            write_timeout,
            stalled: None,
            state,
        }
    }

    /// A write's outcome `written`, failed once writes have found no room
    /// for `write_timeout`.
    fn watch_write(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if !written.is_pending() {
            let waited = self.stalled.take().is_some();
            if let Some(state) = &self.state {
                if waited {
                    state.write_waits(false);
                }
                if let Poll::Ready(Ok(1..)) = written {
                    state.wrote();
                }
            }
            return written;
        }
        if self.stalled.is_none()
            && let Some(state) = &self.state
        {
            state.write_waits(true);
        }
        let timeout = self.write_timeout;
        loop {
            let queued = self.stream.as_ref().and_then(unsent);
            let (sleep, at_start) = self
                .stalled
                .get_or_insert_with(|| (Box::pin(tokio::time::sleep(timeout)), queued));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The kernel's queue shrank meanwhile: the client reads, only
            // more slowly than the queue lets a write through (a few MB
            // over a slow link, woken when half of it is read). Its time
            // starts again.
            if let (Some(now), Some(then)) = (queued, *at_start)
                && now < then
            {
                self.stalled = None;
                continue;
            }
            break;
        }
        self.ended = true;
        // Reset when dropped, not closed (see [`settle`]).
        self.cut_off = true;
        tracing::debug!(peer = ?self.peer, "connection reset: its client read nothing of the answer for {timeout:?}");
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client read nothing of the answer in time",
        )))
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
        let this = self.get_mut();
        let written = this.stream().poll_write(cx, buf);
        this.watch_write(cx, written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = this.stream().poll_write_vectored(cx, bufs);
        this.watch_write(cx, written)
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
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.cut_off {
            reset(stream);
            return;
        }
        let queued = queued(&stream);
        // The client closed its side: nothing to drain, and with nothing
        // queued for it, nothing to wait for.
        if self.ended && !queued {
            return;
        }
        let Some(place) = Draining::take(&PLACES, self.peer) else {
            if !self.ended {
                crate::metrics::metrics().connections_not_drained.inc();
                tracing::debug!(peer = ?self.peer, "connection closed without draining: no place left");
            }
            // Closed with bytes queued, it would stay with the kernel (see
            // [`settle`]): past the places, reset.
            if queued {
                reset(stream);
            }
            return;
        };
        let (drain_first, within) = (!self.ended, self.write_timeout);
        runtime.spawn(async move {
            let stream = if drain_first {
                drain(stream).await
            } else {
                stream
            };
            settle(stream, within).await;
            drop(place);
        });
    }
}

/// How often [`settle`] looks whether the kernel has sent the answer.
const SETTLE_POLL: Duration = Duration::from_millis(100);

/// Most write timeouts [`settle`] waits in all, however steadily its
/// client reads (a place is held meanwhile).
const SETTLE_MOST: u32 = 6;

/// Whether the kernel holds bytes to send on `stream`.
fn queued(stream: &TcpStream) -> bool {
    unsent(stream).is_some_and(|n| n > 0)
}

/// Close `stream` once the kernel has sent what it holds for it (its
/// client read it), or reset it once its client has read nothing of it
/// for `within` (the rule of a write, [`Lingering::watch_write`]), or after
/// [`SETTLE_MOST`] times `within` in all; at once when the client reset
/// it or went away. A socket closed with unsent bytes stays with the
/// kernel, orphaned (no longer counted against its address), for as long
/// as its client keeps its end open and reads nothing: one address
/// repeating that grew the kernel's TCP memory by hundreds of MB (an
/// outside audit). A reset drops the queue with the socket.
async fn settle(stream: TcpStream, within: Duration) {
    let start = tokio::time::Instant::now();
    let (mut last, mut progress) = (None, start);
    loop {
        let Some(now) = unsent(&stream).filter(|&n| n > 0) else {
            return;
        };
        // (A client that reset: the queue's count stays, nothing is sent.)
        if stream.take_error().ok().flatten().is_some() {
            return;
        }
        if last.is_some_and(|then| now < then) {
            progress = tokio::time::Instant::now();
        }
        last = Some(now);
        if progress.elapsed() >= within || start.elapsed() >= within * SETTLE_MOST {
            tracing::debug!(
                "connection reset: its client read nothing of the rest of its answer in time"
            );
            reset(stream);
            return;
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// Close `stream` with a reset: what the kernel holds for it is dropped.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
}

/// One draining place, given back when dropped (also when its task is
/// dropped unpolled, as a runtime shutting down does).
struct Draining {
    places: &'static Shares,
    peer: Option<IpAddr>,
}

impl Draining {
    /// A place of `places` for a socket of `peer` (`None`: a trusted
    /// proxy's, counted only in all).
    fn take(places: &'static Shares, peer: Option<IpAddr>) -> Option<Draining> {
        if !places.take(peer, 1) {
            return None;
        }
        crate::metrics::metrics().connections_draining.inc();
        Some(Draining { places, peer })
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        self.places.give(self.peer, 1);
        crate::metrics::metrics().connections_draining.dec();
    }
}

/// Shut the write side, then read and drop what comes until the client
/// closes or a bound is reached; the socket, to close.
async fn drain(mut stream: TcpStream) -> TcpStream {
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
    stream
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
        let mut conn = Lingering::new(stream, Some(addr.ip()), Duration::from_secs(10), None);
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
        let mut conn = Lingering::new(stream, Some(addr.ip()), Duration::from_secs(10), None);
        let mut buf = [0u8; 8];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 0);
        assert!(conn.ended);
    }

    #[test]
    fn one_address_takes_its_share_and_a_proxy_only_the_whole() {
        static P: Shares = Shares::new(5, 2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let a1 = Draining::take(&P, Some(a)).unwrap();
        let _a2 = Draining::take(&P, Some(a)).unwrap();
        assert!(
            Draining::take(&P, Some(a)).is_none(),
            "a third of one address"
        );
        let _b1 = Draining::take(&P, Some(b)).unwrap();
        let _p1 = Draining::take(&P, None).unwrap();
        let _p2 = Draining::take(&P, None).unwrap();
        assert!(Draining::take(&P, None).is_none(), "past the whole");
        assert!(Draining::take(&P, Some(b)).is_none(), "past the whole");
        drop(a1);
        assert!(
            Draining::take(&P, Some(b)).is_some(),
            "a place given back is free for any"
        );
        assert_eq!((P.held(a).0, P.held(b).0), (1, 1));
        drop((_a2, _b1));
        assert_eq!(
            P.held(a).1,
            0,
            "an address's count goes with its last place"
        );
    }

    /// The connection's state hears of its writes, for the header
    /// timeout: one that went through moves it on, one waiting for room
    /// holds it until a write goes through again.
    #[tokio::test]
    async fn the_connection_hears_of_writes_and_of_writes_waiting() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let state = Arc::new(State::default());
        let t = Duration::from_secs(60);
        let mut conn = Lingering::new(stream, Some(addr.ip()), t, Some(state.clone()));
        let far = std::time::Instant::now() + t * 10;
        assert_eq!(
            state.head_due(t, far),
            None,
            "due a timeout after admission"
        );
        let before = std::time::Instant::now();
        conn.write_all(b"x").await.unwrap();
        assert!(
            state
                .head_due(t, before)
                .is_some_and(|due| due >= before + t)
        );
        // Writes until one waits for room (the client reads nothing).
        let piece = vec![0u8; 64 << 10];
        let mut sent = 0usize;
        while let Ok(written) =
            tokio::time::timeout(Duration::from_millis(100), conn.write(&piece)).await
        {
            sent += written.unwrap();
            assert!(sent < 1 << 30, "the buffers never filled");
        }
        assert_eq!(state.head_due(t, far), Some(far + t), "a write waits");
        // The client reads it all; the next write goes through.
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            let mut read = 0;
            while read < 1 + sent {
                read += client.read(&mut buf).unwrap();
            }
            client
        });
        conn.write_all(b"y").await.unwrap();
        assert_eq!(state.head_due(t, far), None, "no write waits");
        drop(reader);
    }

    /// A client that reads nothing: once the socket's buffers are full,
    /// the write fails after the write timeout instead of waiting for ever.
    #[tokio::test]
    async fn a_client_that_reads_nothing_is_cut_off_after_the_write_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let mut conn = Lingering::new(stream, Some(addr.ip()), Duration::from_millis(200), None);
        let piece = vec![0u8; 64 << 10];
        let mut sent = 0usize;
        let failed = loop {
            match tokio::time::timeout(Duration::from_secs(10), conn.write(&piece)).await {
                Ok(Ok(n)) => sent += n,
                Ok(Err(e)) => break e,
                Err(_) => panic!("the write waited past its timeout"),
            }
            assert!(sent < 1 << 30, "the buffers never filled");
        };
        assert_eq!(failed.kind(), io::ErrorKind::TimedOut);
        assert!(conn.ended, "not drained");
        drop(conn);
        // Reset, not closed: the kernel drops what it held for the client
        // (a close would keep it, with the socket, for as long as the
        // client stays and reads nothing), so the client, reading at last,
        // meets the reset after what had reached it.
        let mut client = client;
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut read = 0usize;
        let end = loop {
            match client.read(&mut buf) {
                Ok(0) => break None,
                Ok(n) => read += n,
                Err(e) => break Some(e.kind()),
            }
        };
        assert_eq!(
            end,
            Some(io::ErrorKind::ConnectionReset),
            "{read} of {sent} bytes read"
        );
        assert!(read < sent, "{read} of {sent} bytes read");
    }

    /// A client that goes away (resets) while its answer is still queued
    /// ends the wait for it at once: the queue's count stays, but nothing
    /// will be sent, and the place must not be held for the timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn settling_ends_when_the_client_resets() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (mut stream, _) = listener.accept().await.unwrap();
        // Queued: more than the client's buffers take while it reads nothing.
        let piece = vec![0u8; 64 << 10];
        while let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_millis(100), stream.write(&piece)).await
        {}
        assert!(queued(&stream));
        // Closed with unread bytes: the client's kernel resets.
        drop(client);
        tokio::time::timeout(
            Duration::from_secs(5),
            settle(stream, Duration::from_secs(30)),
        )
        .await
        .expect("settle waited for a client that had gone");
    }

    /// A client that closed its sending side and reads its answer late
    /// gets all of it and a clean end: the socket is closed once the
    /// kernel has sent what it held, not reset.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_half_closed_client_reading_late_gets_its_whole_answer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answer = vec![7u8; 256 << 10];
        let expected = answer.len();
        let client = std::thread::spawn(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.write_all(b"ask").unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            std::thread::sleep(Duration::from_millis(500));
            let mut got = Vec::new();
            c.read_to_end(&mut got).map(|_| got.len())
        });
        let (stream, _) = listener.accept().await.unwrap();
        let mut conn = Lingering::new(stream, Some(addr.ip()), Duration::from_secs(5), None);
        let mut buf = [0u8; 16];
        let mut asked = 0;
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            asked += n;
        }
        assert_eq!(asked, 3);
        assert!(conn.ended);
        // What fits in the socket's buffers now; the rest follows as the
        // client reads, from the socket this drop hands on.
        let sndbuf = 64 << 10;
        conn.write_all(&answer[..sndbuf]).await.unwrap();
        let rest = answer[sndbuf..].to_vec();
        let writer = tokio::spawn(async move {
            conn.write_all(&rest).await.unwrap();
            drop(conn);
        });
        writer.await.unwrap();
        let got = tokio::task::spawn_blocking(move || client.join().unwrap())
            .await
            .unwrap()
            .expect("the whole answer and a clean end");
        assert_eq!(got, expected);
    }
}
