//! Conditional requests and byte ranges (RFC 9110 13 and 14), on the
//! `GET` and `HEAD` answers whose route tags them (`ETag`) or serves them
//! by ranges (`Accept-Ranges: bytes`: attachments and uploaded files).
//! The route makes its whole answer as ever; the host then evaluates, in
//! RFC 9110 13.2.2's order, `If-Match` (no tag of the list is the
//! answer's strong tag, nor `*`: 412 `precondition_failed`),
//! `If-None-Match` (one of the list is the answer's tag, compared weakly,
//! or `*`: 304 with no body; an answer without a tag is matched by `*`
//! alone) and, for a `GET`, `Range` with `If-Range`:
//! the part asked for, `206` with `Content-Range`, or `416` when the part
//! lies past the end, so that `curl -C -`, `wget -c` and media players
//! can resume or seek. One range per request: a request for several
//! (`bytes=0-1,5-6`), an invalid one, another unit or an `If-Range` that
//! does not name the answer's current tag gets the whole answer (200), as
//! RFC 9110 allows.

use crate::reply::Reply;
use marketplace_common::etag::listed;

/// What a request asks of its answer's bytes.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Asked {
    if_match: Option<String>,
    if_none_match: Option<String>,
    range: Option<String>,
    if_range: Option<String>,
}

impl Asked {
    /// The conditions of a `GET` or `HEAD`, and a `GET`'s `Range` and
    /// `If-Range` (any other method's are not read: RFC 9110 14.2).
    pub fn of(method: &hyper::Method, headers: &hyper::HeaderMap) -> Asked {
        let get = method == hyper::Method::GET;
        if !get && method != hyper::Method::HEAD {
            return Asked::default();
        }
        // A value that is not text is kept as "", which names no range and
        // no tag: a Range is then answered whole, any Range after an
        // If-Range too (13.1.5: only a validator that matches), an If-Match
        // fails and an If-None-Match holds.
        let text = |name| {
            headers
                .get(name)
                .map(|v| v.to_str().unwrap_or_default().to_string())
        };
        let range = text(hyper::header::RANGE).filter(|_| get);
        Asked {
            if_match: text(hyper::header::IF_MATCH),
            if_none_match: text(hyper::header::IF_NONE_MATCH),
            if_range: range.as_ref().and_then(|_| text(hyper::header::IF_RANGE)),
            range,
        }
    }

    /// `reply` as the request's conditions and range make it.
    pub fn apply(&self, reply: Reply) -> Reply {
        if self == &Asked::default() || reply.status != 200 {
            return reply;
        }
        let tag = reply.header("etag").map(|t| t.trim().to_string());
        // An untagged answer is matched by `*` alone (it is a current
        // representation, 13.1.1 and 13.1.2), never by a listed tag.
        let matched = |list: &str, strong| match &tag {
            Some(tag) => listed(list, tag, strong),
            None => list.split(',').any(|t| t.trim() == "*"),
        };
        if let Some(list) = &self.if_match
            && !matched(list, true)
        {
            return Reply::error(
                412,
                "precondition_failed",
                "If-Match names no tag of the current answer",
            );
        }
        if let Some(list) = &self.if_none_match
            && matched(list, false)
        {
            return not_modified(reply);
        }
        let Some(range) = &self.range else {
            return reply;
        };
        if reply.header("accept-ranges").map(str::trim) != Some("bytes") {
            return reply;
        }
        // Only the representation the client holds part of may be
        // continued: a strong tag equal to the answer's (no date: the
        // routes that serve ranges give no Last-Modified).
        if let Some(asked) = &self.if_range
            && (asked.starts_with("W/") || tag.as_deref() != Some(asked.trim()))
        {
            return reply;
        }
        let len = reply.body.len() as u64;
        match part(range, len) {
            Part::Whole => reply,
            Part::Bytes(first, last) => {
                let mut reply = reply;
                reply.status = 206;
                reply.body.truncate(last as usize + 1);
                reply.body.drain(..first as usize);
                reply.headers.push((
                    "content-range".into(),
                    format!("bytes {first}-{last}/{len}"),
                ));
                reply
            }
            Part::Unsatisfiable => {
                let mut refused = Reply::error(
                    416,
                    "range_not_satisfiable",
                    format!("the range {range:?} lies past the end of the {len} bytes"),
                );
                refused
                    .headers
                    .push(("content-range".into(), format!("bytes */{len}")));
                refused
            }
        }
    }
}

/// 304 for `reply`: no body, and of its headers those RFC 9110 15.4.5
/// keeps (its validator and caching, and what lets a page read it).
fn not_modified(reply: Reply) -> Reply {
    const KEPT: [&str; 7] = [
        "etag",
        "cache-control",
        "expires",
        "vary",
        "content-location",
        "access-control-allow-origin",
        "access-control-expose-headers",
    ];
    Reply {
        status: 304,
        headers: reply
            .headers
            .into_iter()
            .filter(|(n, _)| KEPT.iter().any(|k| n.eq_ignore_ascii_case(k)))
            .collect(),
        body: vec![],
    }
}

/// What a `Range` asks of `len` bytes.
#[derive(Debug, PartialEq)]
enum Part {
    /// Not one valid byte range: the whole answer.
    Whole,
    /// Bytes `first` to `last`, both included.
    Bytes(u64, u64),
    /// A valid range that starts past the end.
    Unsatisfiable,
}

fn part(range: &str, len: u64) -> Part {
    let Some((unit, spec)) = range.split_once('=') else {
        return Part::Whole;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") || spec.contains(',') {
        return Part::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Part::Whole;
    };
    let number = |s: &str| {
        (!s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    match (first, last) {
        // The last `n` bytes.
        ("", n) => match number(n) {
            None => Part::Whole,
            Some(0) => Part::Unsatisfiable,
            // Satisfiable (RFC 9110 14.1.1), but no 206 can carry an empty
            // part: the whole, empty answer.
            Some(_) if len == 0 => Part::Whole,
            Some(n) => Part::Bytes(len.saturating_sub(n), len - 1),
        },
        (a, b) => {
            let Some(a) = number(a) else {
                return Part::Whole;
            };
            let b = match b {
                "" => u64::MAX,
                b => match number(b) {
                    Some(b) if b >= a => b,
                    _ => return Part::Whole,
                },
            };
            if a >= len {
                Part::Unsatisfiable
            } else {
                Part::Bytes(a, b.min(len - 1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_read_as_rfc_9110_says() {
        assert_eq!(part("bytes=0-9", 100), Part::Bytes(0, 9));
        assert_eq!(part("bytes=90-", 100), Part::Bytes(90, 99));
        assert_eq!(part("bytes=90-1000", 100), Part::Bytes(90, 99));
        assert_eq!(part("bytes=-10", 100), Part::Bytes(90, 99));
        assert_eq!(part("bytes=-1000", 100), Part::Bytes(0, 99));
        assert_eq!(part("Bytes = 5-5", 100), Part::Bytes(5, 5));
        assert_eq!(part("bytes=100-", 100), Part::Unsatisfiable);
        assert_eq!(part("bytes=-0", 100), Part::Unsatisfiable);
        assert_eq!(part("bytes=0-", 0), Part::Unsatisfiable);
        assert_eq!(part("bytes=-5", 0), Part::Whole);
        for whole in [
            "bytes=9-0",
            "bytes=0-1,5-6",
            "items=0-9",
            "bytes=a-9",
            "bytes=-",
            "bytes=+1-2",
            "bytes=99999999999999999999-",
            "bytes",
        ] {
            assert_eq!(part(whole, 100), Part::Whole, "{whole}");
        }
    }

    fn served(body: &[u8]) -> Reply {
        Reply {
            status: 200,
            headers: vec![
                ("accept-ranges".into(), "bytes".into()),
                ("etag".into(), "\"t1\"".into()),
            ],
            body: body.to_vec(),
        }
    }

    fn asked(range: &str, if_range: Option<&str>) -> Asked {
        Asked {
            range: Some(range.into()),
            if_range: if_range.map(str::to_string),
            ..Asked::default()
        }
    }

    #[test]
    fn only_a_route_that_serves_ranges_is_cut_and_only_its_current_tag() {
        let r = asked("bytes=2-4", None).apply(served(b"0123456789"));
        assert_eq!((r.status, r.body.as_slice()), (206, &b"234"[..]));
        assert_eq!(r.header("content-range"), Some("bytes 2-4/10"));
        assert_eq!(r.header("etag"), Some("\"t1\""));
        let r = asked("bytes=10-", None).apply(served(b"0123456789"));
        assert_eq!(r.status, 416);
        assert_eq!(r.header("content-range"), Some("bytes */10"));
        assert!(String::from_utf8_lossy(&r.body).contains("range_not_satisfiable"));
        // The representation the client holds part of, or the whole.
        let r = asked("bytes=2-4", Some("\"t1\"")).apply(served(b"0123456789"));
        assert_eq!(r.status, 206);
        for other in ["\"t0\"", "W/\"t1\"", "Sat, 05 Dec 2026 22:00:00 GMT", ""] {
            let r = asked("bytes=2-4", Some(other)).apply(served(b"0123456789"));
            assert_eq!((r.status, r.body.len()), (200, 10), "{other}");
        }
        // A route that does not say it serves ranges, or not a 200.
        let mut plain = served(b"0123456789");
        plain.headers.remove(0);
        assert_eq!(asked("bytes=2-4", None).apply(plain).status, 200);
        let mut missing = served(b"{}");
        missing.status = 404;
        assert_eq!(asked("bytes=0-0", None).apply(missing).status, 404);
        // An If-Range that is not text matches nothing; a Range of
        // another method is not read.
        let mut headers = hyper::HeaderMap::new();
        headers.insert(hyper::header::RANGE, "bytes=2-4".parse().unwrap());
        headers.insert(
            hyper::header::IF_RANGE,
            hyper::header::HeaderValue::from_bytes(b"\"t1\xff\"").unwrap(),
        );
        let r = Asked::of(&hyper::Method::GET, &headers).apply(served(b"0123456789"));
        assert_eq!(r.status, 200);
        headers.remove(hyper::header::IF_RANGE);
        let r = Asked::of(&hyper::Method::GET, &headers).apply(served(b"0123456789"));
        assert_eq!(r.status, 206);
        let r = Asked::of(&hyper::Method::HEAD, &headers).apply(served(b"0123456789"));
        assert_eq!(r.status, 200);
        let r = Asked::of(&hyper::Method::POST, &headers).apply(served(b"0123456789"));
        assert_eq!(r.status, 200);
        // No Range: as it was.
        assert_eq!(Asked::default().apply(served(b"01")), served(b"01"));
    }

    #[test]
    fn conditions_are_evaluated_before_the_range() {
        let when = |if_match: Option<&str>, if_none_match: Option<&str>, range: Option<&str>| {
            Asked {
                if_match: if_match.map(str::to_string),
                if_none_match: if_none_match.map(str::to_string),
                range: range.map(str::to_string),
                if_range: None,
            }
            .apply(served(b"0123456789"))
        };
        // If-Match: a strong tag of the answer's, or *.
        for holds in ["\"t1\"", "\"x\", \"t1\"", "*"] {
            assert_eq!(when(Some(holds), None, None).status, 200, "{holds}");
        }
        for fails in ["\"x\"", "W/\"t1\"", ""] {
            let r = when(Some(fails), None, Some("bytes=0-1"));
            assert_eq!((r.status, r.body.is_empty()), (412, false), "{fails}");
            assert!(String::from_utf8_lossy(&r.body).contains("precondition_failed"));
        }
        // If-None-Match: weakly, before the range; 304 keeps the tag.
        for matches in ["\"t1\"", "W/\"t1\"", "\"x\", W/\"t1\"", "*"] {
            let r = when(None, Some(matches), Some("bytes=0-1"));
            assert_eq!((r.status, r.body.len()), (304, 0), "{matches}");
            assert_eq!(r.header("etag"), Some("\"t1\""));
            assert_eq!(r.header("accept-ranges"), None);
        }
        let r = when(None, Some("\"x\""), Some("bytes=0-1"));
        assert_eq!(r.status, 206);
        // An answer without a tag is matched by `*` alone.
        let mut untagged = served(b"01");
        untagged.headers.retain(|(n, _)| n != "etag");
        let on_untagged = |if_match: Option<&str>, if_none_match: Option<&str>| {
            Asked {
                if_match: if_match.map(str::to_string),
                if_none_match: if_none_match.map(str::to_string),
                ..Asked::default()
            }
            .apply(untagged.clone())
            .status
        };
        assert_eq!(on_untagged(Some("*"), None), 200);
        assert_eq!(on_untagged(Some("\"x\""), None), 412);
        assert_eq!(on_untagged(None, Some("\"x\", *")), 304);
        assert_eq!(on_untagged(None, Some("\"x\"")), 200);
        assert_eq!(on_untagged(Some("*"), Some("\"x\"")), 200);
    }
}
