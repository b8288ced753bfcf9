//! Answers held until their clients read them.
//!
//! An answer is made whole before it is sent, and its bytes stay in memory
//! until the client has read them. A client that asks for a large answer
//! (a search of 100 long posts, `GET /api/mcp` with many macros: megabytes)
//! and never reads it would keep it for as long as its connection lives,
//! and a few thousand such sockets held gigabytes. So the large answers of
//! reads count against `max_unsent_answer_bytes` until they are sent (or
//! their connection ends): one that finds no room is `503` with
//! `Retry-After` instead, made small. And a connection whose client reads
//! nothing of its answer for the header timeout is closed
//! ([`super::linger`]), which gives its answer's bytes back.

use super::shares::Shares;
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Answers up to this size are not counted: a connection holds one at a
/// time, so they are bounded by the connection limits.
pub const SMALL: usize = 64 << 10;

/// Most bytes handed to hyper at once: the rest of an answer is given as
/// the client reads, so its hold ends when its last bytes are on their way.
const CHUNK: usize = 64 << 10;

/// The bytes of large answers not yet sent, of `max_unsent_answer_bytes`,
/// in all and by client address: one address may hold at most an eighth
/// of them (at least 16 MiB, or the whole when that is less), so a few
/// sockets that never read cannot keep every other client's large answers
/// out.
pub struct Unsent(Shares);

impl Unsent {
    pub fn new(bytes: u64) -> Arc<Unsent> {
        Arc::new(Unsent(Shares::new(
            bytes,
            (bytes / 8).max(bytes.min(16 << 20)),
        )))
    }

    /// The largest answer of a read one client may be sent: its
    /// address's share. A larger one is never sent.
    pub fn largest(&self) -> u64 {
        self.0.most_per_address()
    }

    /// Room for an answer of `len` bytes to `client` until it is sent, if
    /// there is.
    pub fn hold(self: &Arc<Self>, client: IpAddr, len: usize) -> Option<Held> {
        let len = len as u64;
        if !self.0.take(Some(client), len) {
            return None;
        }
        crate::metrics::metrics()
            .unsent_answer_bytes
            .inc_by(len as i64);
        Some(Held {
            unsent: self.clone(),
            client,
            len,
        })
    }
}

/// One answer's room, given back when it is sent or its connection ends.
pub struct Held {
    unsent: Arc<Unsent>,
    client: IpAddr,
    len: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.unsent.0.give(Some(self.client), self.len);
        crate::metrics::metrics()
            .unsent_answer_bytes
            .dec_by(self.len as i64);
    }
}

/// An answer's body: given to hyper in pieces of at most [`CHUNK`], with
/// its room ([`Held`]) kept until the last one is taken.
pub struct Answer {
    rest: Bytes,
    held: Option<Held>,
}

impl Answer {
    pub fn new(bytes: Bytes) -> Answer {
        Answer {
            rest: bytes,
            held: None,
        }
    }

    /// This answer, holding `held` until it is sent.
    pub fn holding(mut self, held: Held) -> Answer {
        self.held = Some(held);
        self
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            this.held = None;
            return Poll::Ready(None);
        }
        let piece = this.rest.split_to(this.rest.len().min(CHUNK));
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));

    #[tokio::test]
    async fn an_answer_comes_in_pieces_and_gives_its_room_back_when_sent() {
        let unsent = Unsent::new(300 << 10);
        let held = unsent.hold(A, 200 << 10).unwrap();
        assert!(unsent.hold(B, 200 << 10).is_none(), "no room left");
        let data: Vec<u8> = (0..200 << 10).map(|i| i as u8).collect();
        let mut answer = Answer::new(Bytes::from(data.clone())).holding(held);
        assert_eq!(answer.size_hint().exact(), Some(200 << 10));
        let mut got = Vec::new();
        while let Some(frame) = answer.frame().await {
            let piece = frame.unwrap().into_data().unwrap();
            assert!(piece.len() <= CHUNK);
            got.extend_from_slice(&piece);
        }
        assert_eq!(got, data);
        assert!(answer.is_end_stream());
        let again = unsent.hold(A, 300 << 10);
        assert!(again.is_some(), "the whole room is back once it is sent");
        drop(again);
        // Dropped unsent (its connection ended): given back too.
        let unread = Answer::new(Bytes::from(vec![0; 300 << 10]))
            .holding(unsent.hold(A, 300 << 10).unwrap());
        drop(unread);
        assert!(unsent.hold(A, 300 << 10).is_some());
    }

    #[test]
    fn one_address_holds_at_most_an_eighth() {
        let unsent = Unsent::new(256 << 20);
        let mine: Vec<Held> = (0..4).map(|_| unsent.hold(A, 8 << 20).unwrap()).collect();
        assert!(unsent.hold(A, 1).is_none(), "32 MiB of one address");
        let theirs = unsent.hold(B, 8 << 20);
        assert!(theirs.is_some(), "another address still has room");
        drop(mine);
        assert!(unsent.hold(A, 32 << 20).is_some());
        // A small budget is one address's whole.
        let small = Unsent::new(16 << 20);
        assert!(small.hold(A, 16 << 20).is_some());
    }
}
