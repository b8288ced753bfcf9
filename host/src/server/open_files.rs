//! The open-files limit a serving process needs.
//!
//! Each client connection is a descriptor, and so is each connection
//! draining after its answer (`linger.rs`), besides the database, the log
//! segments, the components and the listeners. Many systems start a
//! process with a soft limit of 1,024 descriptors, under the default
//! `max_connections` alone: past it `accept` fails and clients wait. As
//! most servers do, the process raises its soft limit to what it needs, up
//! to the hard limit the operator allows, and says so when that is not
//! enough.

/// Descriptors besides client connections: the database and its log,
/// listeners, the shared store's connections, component files, the admin
/// API's work.
const OTHERS: u64 = 256;

/// How many descriptors `max_connections` clients need.
pub fn needed(max_connections: u32, store_connections: u64) -> u64 {
    u64::from(max_connections) + super::linger::MOST_AT_ONCE + store_connections + OTHERS
}

/// Raise the soft `RLIMIT_NOFILE` to `needed` (at most the hard limit);
/// the limits before and after (`u64::MAX`: none).
pub fn raise_to(needed: u64) -> (u64, u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    // (None: no limit.)
    let before = limit.current.unwrap_or(u64::MAX);
    if before >= needed {
        return (before, before);
    }
    let raised = needed.min(limit.maximum.unwrap_or(u64::MAX));
    limit.current = Some(raised);
    // Lowering nothing, raising within the hard limit.
    if setrlimit(Resource::Nofile, limit).is_err() {
        return (before, before);
    }
    (before, raised)
}

/// Raise the limit for this configuration, and log what was done.
pub fn ensure(max_connections: u32, store_connections: u64) {
    let needed = needed(max_connections, store_connections);
    let (before, after) = raise_to(needed);
    if after > before {
        tracing::info!(from = before, to = after, "open-files limit raised");
    }
    if after < needed {
        tracing::warn!(
            limit = after,
            needed,
            "the open-files limit is below what max_connections needs (raise the hard limit, e.g. LimitNOFILE= in a systemd unit, or lower max_connections): past it new connections wait"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_within_the_hard_one() {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        let (soft, hard): (u64, u64) = (limit.rlim_cur, limit.rlim_max);
        let (before, after) = raise_to(soft + 1);
        assert_eq!(before, soft);
        if soft < hard {
            assert_eq!(after, soft + 1, "raised within the hard limit");
        } else {
            assert_eq!(after, soft, "not past the hard limit");
        }
        // Already enough: unchanged.
        assert_eq!(raise_to(16), (after, after));
    }
}
