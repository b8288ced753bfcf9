//! Logs on stderr: text (colours only on a terminal) or JSON lines.
//!
//! A line is written to stderr as soon as it is made, except on an async
//! worker thread that is busy: there lines gather in a buffer of the
//! thread's own and are written together when the worker runs out of work
//! (it is about to park) or the buffer reaches [`FLUSH_AT`] bytes. Under
//! load that is one `write(2)` for many requests' lines instead of one per
//! line; when idle, a line is out before the worker sleeps. What a `kill
//! -9` can lose is at most the lines a busy worker gathered since it last
//! had nothing to do (under [`FLUSH_AT`] bytes per worker).

use crate::config::{Config, LogFormat};
use std::cell::RefCell;
use std::io::{IsTerminal, Write};

/// A busy worker writes its gathered lines once they reach this size.
const FLUSH_AT: usize = 32 << 10;

thread_local! {
    /// The lines this thread gathered; `None` while lines go straight out.
    static GATHERED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Set up the global subscriber from the configuration (or `RUST_LOG`).
pub fn init(config: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| config.log.clone());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(|| Stderr);
    let _ = if config.log_format == LogFormat::Json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
    };
}

/// From now on this thread gathers its lines (an async worker that woke
/// up: `on_thread_unpark`).
pub fn gather() {
    GATHERED.with(|g| {
        let mut g = g.borrow_mut();
        if g.is_none() {
            *g = Some(Vec::with_capacity(FLUSH_AT + 4096));
        }
    });
}

/// Write out what this thread gathered, and let its lines go straight out
/// again (an async worker about to park, or stopping).
pub fn flush() {
    let gathered = GATHERED.with(|g| g.borrow_mut().take());
    if let Some(buf) = gathered
        && !buf.is_empty()
    {
        let _ = write_out(&buf);
    }
}

/// Where lines go: stderr (in unit tests, a buffer of the thread's).
fn write_out(bytes: &[u8]) -> std::io::Result<()> {
    #[cfg(test)]
    return tests::OUT.with(|o| {
        o.borrow_mut().extend_from_slice(bytes);
        Ok(())
    });
    #[cfg(not(test))]
    std::io::stderr().lock().write_all(bytes)
}

/// The subscriber's writer: one formatted event per `write_all`.
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let full = GATHERED.with(|g| match g.borrow_mut().as_mut() {
            Some(buf) => {
                buf.extend_from_slice(bytes);
                Some(buf.len() >= FLUSH_AT)
            }
            None => None,
        });
        match full {
            None => write_out(bytes)?,
            Some(true) => {
                let buf = GATHERED.with(|g| {
                    g.borrow_mut()
                        .as_mut()
                        .map(|b| std::mem::replace(b, Vec::with_capacity(FLUSH_AT + 4096)))
                });
                if let Some(buf) = buf {
                    write_out(&buf)?;
                }
            }
            Some(false) => {}
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        pub(super) static OUT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }

    fn written() -> Vec<u8> {
        OUT.with(|o| std::mem::take(&mut *o.borrow_mut()))
    }

    #[test]
    fn lines_gather_between_gather_and_flush_and_go_straight_out_otherwise() {
        Stderr.write_all(b"zero\n").unwrap();
        assert_eq!(written(), b"zero\n");
        gather();
        Stderr.write_all(b"one\n").unwrap();
        Stderr.write_all(b"two\n").unwrap();
        assert_eq!(written(), b"");
        flush();
        assert_eq!(written(), b"one\ntwo\n");
        Stderr.write_all(b"three\n").unwrap();
        assert_eq!(written(), b"three\n");
    }

    #[test]
    fn a_busy_thread_writes_its_lines_out_once_they_fill_the_buffer() {
        gather();
        let line = [b'x'; 1000];
        let mut sent = 0;
        while sent + line.len() < FLUSH_AT {
            Stderr.write_all(&line).unwrap();
            sent += line.len();
        }
        assert_eq!(written().len(), 0);
        Stderr.write_all(&line).unwrap();
        assert_eq!(written().len(), sent + line.len(), "all of it, in order");
        Stderr.write_all(b"after\n").unwrap();
        flush();
        assert_eq!(written(), b"after\n");
    }
}
