//! Which versions of the service served a database, recorded in it
//! (`host:meta`: `served-by`, the version that started on it last, and
//! `served-by-newest`, the newest that ever did), so that a start can say
//! what it found: an upgrade (an `info` line naming the version before, to
//! read README "Upgrading" from), or a database a newer version served
//! (going back is not supported: an ERROR line and the `database_newer`
//! alert; the host serves, as with a changed key). Versions are calendar
//! versions (`YEAR.MONTH.DAY` of the release), as the README's upgrade
//! notes are dated. Databases from before 2026.12.6 have no record.

use crate::store::{Kv, META_TABLE, Storage};

/// The `host:meta` keys.
const LAST: &[u8] = b"served-by";
const NEWEST: &[u8] = b"served-by-newest";

/// What a start found.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// No version recorded: a new database, or one from before versions
    /// were recorded.
    Unrecorded,
    /// This version served it last.
    Same,
    /// An older version served it last (`from`).
    Upgraded { from: String },
    /// A newer version served it (`newest`).
    Older { newest: String },
}

/// A calendar version's parts, for ordering (`None`: not such a version).
fn parts(version: &str) -> Option<Vec<u64>> {
    version.split('.').map(|p| p.parse().ok()).collect()
}

/// Whether `a` is a newer version than `b` (versions that do not parse
/// are never newer).
fn newer(a: &str, b: &str) -> bool {
    matches!((parts(a), parts(b)), (Some(a), Some(b)) if a > b)
}

/// Record `mine` as the version serving `storage`, and say what was there.
pub fn record(storage: &Storage, mine: &str) -> Found {
    let read = storage.write(|txn| {
        let text = |v: Option<Vec<u8>>| v.map(|v| String::from_utf8_lossy(&v).into_owned());
        let last = text(txn.get_in(META_TABLE, LAST)?);
        let newest = text(txn.get_in(META_TABLE, NEWEST)?);
        if last.as_deref() != Some(mine) {
            txn.put_in(META_TABLE, LAST, mine.as_bytes())?;
        }
        if newest.as_deref().is_none_or(|n| newer(mine, n)) {
            txn.put_in(META_TABLE, NEWEST, mine.as_bytes())?;
        }
        Ok((last, newest))
    });
    let found = match read.and_then(|r| r) {
        Ok((_, Some(newest))) if newer(&newest, mine) => Found::Older { newest },
        Ok((Some(last), _)) if last == mine => Found::Same,
        Ok((Some(last), _)) => Found::Upgraded { from: last },
        Ok((None, _)) => Found::Unrecorded,
        Err(e) => {
            tracing::warn!("recording the version serving the database: {e}");
            return Found::Unrecorded;
        }
    };
    match &found {
        Found::Older { newest } => {
            let message = format!(
                "this database was served by marketplace {newest}, newer than this {mine}: going back to an older version is not supported (README \"Upgrading\"): this version may not know what the newer one recorded (used signatures, kept answers); start {newest} or newer"
            );
            tracing::error!("{message}");
            crate::alerts::raise(crate::alerts::Kind::DatabaseNewer, message);
        }
        Found::Upgraded { from } => tracing::info!(
            from = %from,
            to = %mine,
            "this database was last served by marketplace {from}: see README \"Upgrading\" for what changed since"
        ),
        Found::Same | Found::Unrecorded => {}
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_versions_order_by_their_parts() {
        assert!(newer("2026.12.10", "2026.12.9"));
        assert!(newer("2027.1.1", "2026.12.31"));
        assert!(!newer("2026.12.6", "2026.12.6"));
        assert!(!newer("2026.12.5", "2026.12.6"));
        assert!(!newer("0.1.0", "2026.12.6"));
        assert!(!newer("garbage", "2026.12.6"));
        assert!(!newer("2026.12.6", "garbage"));
    }

    #[test]
    fn a_start_says_what_served_the_database_before() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(&dir.path().join("db.redb"), Default::default()).unwrap();
        assert_eq!(record(&storage, "2026.12.6"), Found::Unrecorded);
        assert_eq!(record(&storage, "2026.12.6"), Found::Same);
        assert_eq!(
            record(&storage, "2026.12.9"),
            Found::Upgraded {
                from: "2026.12.6".into()
            }
        );
        // Going back: said at every start of the older version, and the
        // newest stays recorded.
        for _ in 0..2 {
            assert_eq!(
                record(&storage, "2026.12.6"),
                Found::Older {
                    newest: "2026.12.9".into()
                }
            );
        }
        assert!(crate::alerts::all().iter().any(
            |a| a.kind == crate::alerts::Kind::DatabaseNewer && a.message.contains("2026.12.9")
        ));
        assert_eq!(
            record(&storage, "2026.12.9"),
            Found::Upgraded {
                from: "2026.12.6".into()
            }
        );
    }

    /// The README's upgrade notes are dated: the newest of them is of a
    /// version no later than this one (a note of a later date needs the
    /// version raised with it, so that `--version`, health and the
    /// database's record tell which notes apply).
    #[test]
    fn the_version_is_as_new_as_the_newest_upgrade_note() {
        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let marker = "Upgrading from a version before ";
        let dates: Vec<String> = readme
            .match_indices(marker)
            .filter_map(|(at, _)| readme.get(at + marker.len()..at + marker.len() + 10))
            .map(|d| {
                d.split('-')
                    .map(|p| p.trim_start_matches('0').to_string())
                    .collect::<Vec<_>>()
                    .join(".")
            })
            .collect();
        assert!(!dates.is_empty(), "README has upgrade notes");
        let mine = env!("CARGO_PKG_VERSION");
        assert!(parts(mine).is_some_and(|p| p.len() == 3), "{mine}");
        for date in dates {
            assert!(parts(&date).is_some(), "{date}");
            assert!(
                !newer(&date, mine),
                "README's upgrade note of {date} is newer than this version {mine}: raise [workspace.package] version"
            );
        }
    }
}
