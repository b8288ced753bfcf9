//! Ed25519 signature checks (PROTOCOL section 2). The fingerprint is the
//! 64-hex public key; signatures are hex; verification is strict.

use crate::reply::Reply;
use crate::store::{Kv, WriteTxn};
use ed25519_dalek::{Signature, VerifyingKey};

/// Used signatures: "{actor}:{signature}" -> unix seconds of use (u64 BE),
/// then 1 for a fresh (timestamped) use or 0 for a legacy one. Records
/// written before that flag existed hold the seconds only.
pub const USED: &str = "auth:used";

/// The used-signature records retention may remove, by time: u64 BE
/// milliseconds of use, then the `auth:used` key -> empty. Only fresh uses
/// are listed (see [`prunable_from_ms`]), and only earlier versions
/// recorded fresh uses there (now [`FRESH_USED`]).
pub const USED_BY_TIME: &str = "auth:used-by-time";

/// Fresh (timestamped) uses, as recorded since 2026-11-26: the signed
/// timestamp (u64 BE seconds), then "{actor}:{signature}" -> unix seconds
/// of use (u64 BE). A fresh signature only verifies with its own
/// timestamp, so the lookup knows the whole key; in timestamp order, a new
/// use is written near the end of the table, not at a random place as in
/// [`USED`] (where earlier versions recorded fresh uses, with a
/// [`USED_BY_TIME`] entry each), and retention removes a range of it.
pub const FRESH_USED: &str = "auth:fresh-used";

/// The [`FRESH_USED`] key of a use of `key` ("{actor}:{signature}") signed
/// with timestamp `ts`.
pub fn fresh_key(ts: u64, key: &str) -> Vec<u8> {
    crate::store::time_key(ts, key.as_bytes())
}

/// The oldest signed timestamp retention may remove from [`FRESH_USED`]:
/// the legacy rule covers numbers from [`PLAUSIBLE_TIMESTAMP`] only, so a
/// record below that is what refuses its signature in legacy form (a clock
/// near 1970: tests) and stays; the same bound as [`prunable_from_ms`].
pub const FRESH_PRUNABLE_FROM_S: u64 = PLAUSIBLE_TIMESTAMP + FRESH_WINDOW_S;

/// The shortest time a fresh use must be kept. Its timestamp was within
/// [`FRESH_WINDOW_S`] of the use, so from `2 * FRESH_WINDOW_S` after the use
/// on the timestamp is outside the window and the signature is refused as
/// `auth_expired` whether or not its record exists; a minute of margin.
pub const MIN_USED_RETENTION_S: u64 = 2 * FRESH_WINDOW_S + 60;

/// Unix seconds from which a message's trailing number is taken for a
/// timestamp (2001-09-09): `meet at 10:30` is no timestamp.
const PLAUSIBLE_TIMESTAMP: u64 = 1_000_000_000;

/// How far a fresh timestamp may be from the host clock.
pub const FRESH_WINDOW_S: u64 = 300;

/// A signed statement (see `auth.signed` in the WIT).
pub struct Statement<'a> {
    pub actor: &'a str,
    pub message: &'a str,
    pub signature: &'a str,
    pub timestamp: Option<u64>,
}

fn invalid(message: &str) -> Reply {
    Reply::error(401, "auth_invalid", message)
}

/// Parse a 64-hex fingerprint into a key.
pub fn key_of(fingerprint: &str) -> Option<VerifyingKey> {
    if fingerprint.len() != 64 {
        return None;
    }
    let bytes: [u8; 32] = marketplace_common::hex::decode(fingerprint)?
        .try_into()
        .ok()?;
    KEYS.get(&bytes)
}

/// Keys kept decompressed: decompressing a key (a square root in the
/// field) took 4.1 us against 36 us for the check itself (measured on the
/// 2-core VM, 2026-11-25; the check is about 20 us with AVX-512 IFMA,
/// `cargo bench -p marketplace --bench verify`), and a signer's next request usually comes soon. At most [`KeyCache::MAX`] keys; a full cache
/// starts over. Only keys that parse are kept.
static KEYS: KeyCache = KeyCache {
    keys: std::sync::Mutex::new(None),
};

struct KeyCache {
    keys: std::sync::Mutex<Option<std::collections::HashMap<[u8; 32], VerifyingKey>>>,
}

impl KeyCache {
    const MAX: usize = 4096;

    fn get(&self, bytes: &[u8; 32]) -> Option<VerifyingKey> {
        let lock = || self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(key) = lock().as_ref().and_then(|keys| keys.get(bytes)) {
            return Some(*key);
        }
        let key = VerifyingKey::from_bytes(bytes).ok()?;
        let mut keys = lock();
        let keys = keys.get_or_insert_with(Default::default);
        if keys.len() >= Self::MAX {
            keys.clear();
        }
        keys.insert(*bytes, key);
        Some(key)
    }
}

/// When a used-signature record starts to count for retention (ms of use),
/// or None when it must be kept for good:
///
/// - a fresh use: its signature stops verifying (`auth_expired`) once its
///   timestamp leaves the window, and the same signature presented in
///   legacy form signs a message ending in that timestamp, which the legacy
///   rule refuses for good. That rule only covers numbers from
///   [`PLAUSIBLE_TIMESTAMP`], so a use before
///   `PLAUSIBLE_TIMESTAMP + FRESH_WINDOW_S` (a clock set near 1970: tests)
///   is kept;
/// - a legacy single use (`legacy_single_use`: a post, an identity
///   deletion): the signature has no time and would verify again, so its
///   record is what refuses the replay: kept for good (these are paid or
///   rare, so they grow with paid posts, not with traffic);
/// - a record of an older version (seconds only, fresh or legacy unknown):
///   kept.
pub fn prunable_from_ms(record: &[u8]) -> Option<u64> {
    let (secs, flag) = record.split_first_chunk::<8>()?;
    if flag != [1] {
        return None;
    }
    let used_s = u64::from_be_bytes(*secs);
    (used_s >= PLAUSIBLE_TIMESTAMP + FRESH_WINDOW_S).then(|| used_s.saturating_mul(1000))
}

/// Verify a statement; record single-use signatures in `txn`.
/// The signature check alone (no clock, no record): 401 `auth_invalid`
/// when malformed or not verifying.
pub fn check_signature(st: &Statement) -> Result<(), Reply> {
    let key = key_of(st.actor)
        .ok_or_else(|| invalid("actor fingerprint must be a 64-hex Ed25519 public key"))?;
    let sig_bytes = marketplace_common::hex::decode(st.signature)
        .filter(|b| b.len() == 64)
        .ok_or_else(|| invalid("signature must be 128 hex characters"))?;
    let sig = Signature::from_bytes(&sig_bytes.try_into().expect("64 bytes"));
    let signed = match st.timestamp {
        Some(ts) => format!("{}:{ts}", st.message),
        None => st.message.to_string(),
    };
    key.verify_strict(signed.as_bytes(), &sig)
        .map_err(|_| invalid("signature does not verify"))
}

/// Verify a statement; record single-use signatures in `txn`. `checked`:
/// [`check_signature`] already passed for this very statement.
pub fn verify(
    txn: &WriteTxn,
    now_s: u64,
    st: &Statement,
    require_fresh: bool,
    legacy_single_use: bool,
    checked: bool,
) -> Result<(), Reply> {
    if !checked {
        check_signature(st)?;
    }
    // (Summarized while a shared store is unavailable, as every request's
    // storage errors are then.)
    let internal = |e: &crate::store::StorageError| {
        crate::logging::request_error(e.unavailable(), None, &format!("auth table: {e}"));
        Reply::error(500, "internal", "internal error")
    };
    let k = format!(
        "{}:{}",
        st.actor.to_ascii_lowercase(),
        st.signature.to_ascii_lowercase()
    );
    if st.timestamp.is_none() {
        // A fresh signature signs "{message}:{timestamp}": the same bytes as
        // a legacy signature of a message ending in ":{timestamp}". Such a
        // legacy message is refused whenever its number could be a fresh
        // signature's timestamp, now or in the past (a fresh request that
        // was refused records nothing), and a signature once used fresh
        // never counts as legacy.
        let trailing = trailing_number(st.message);
        if let Some(n) = trailing
            && (PLAUSIBLE_TIMESTAMP..=now_s + FRESH_WINDOW_S).contains(&n)
        {
            return Err(invalid(
                "a legacy signature may not sign a message ending in a current timestamp: send the timestamp as `timestamp`",
            ));
        }
        // Used fresh: by an earlier version (flagged in `auth:used`), or
        // since, with the message's trailing number for its timestamp.
        let used_fresh = match txn.get_in(USED, k.as_bytes()).map_err(|e| internal(&e))? {
            Some(used) => used.get(8) == Some(&1),
            None => match trailing {
                Some(n) => txn
                    .get_in(FRESH_USED, &fresh_key(n, &k))
                    .map_err(|e| internal(&e))?
                    .is_some(),
                None => false,
            },
        };
        if used_fresh {
            return Err(invalid(
                "this signature was made for a timestamped message and cannot be used without its timestamp",
            ));
        }
    }
    match st.timestamp {
        Some(ts) if ts.abs_diff(now_s) > FRESH_WINDOW_S => {
            return Err(Reply::error(
                401,
                "auth_expired",
                format!(
                    "signature timestamp is more than {FRESH_WINDOW_S} s from the server clock ({now_s})"
                ),
            ));
        }
        None if require_fresh => {
            return Err(Reply::error(
                401,
                "auth_expired",
                "this operation needs a fresh signature: sign \"{message}:{timestamp}\" and send timestamp",
            ));
        }
        _ => {}
    }
    if st.timestamp.is_some() || legacy_single_use {
        // A fresh signature repeats when the same message is signed again
        // within its second (Ed25519 signs deterministically).
        let conflict = || {
            Reply::error(
                409,
                "conflict",
                match st.timestamp {
                    Some(_) => {
                        "this signature was already used: a signature is single use, and the same message signed at the same second gives the same one (sign with a later timestamp)"
                    }
                    None => "this signature was already used",
                },
            )
        };
        // A legacy use, or a fresh one an earlier version recorded.
        if txn
            .get_in(USED, k.as_bytes())
            .map_err(|e| internal(&e))?
            .is_some()
        {
            return Err(conflict());
        }
        match st.timestamp {
            Some(ts) => {
                let key = fresh_key(ts, &k);
                if txn
                    .get_in(FRESH_USED, &key)
                    .map_err(|e| internal(&e))?
                    .is_some()
                {
                    return Err(conflict());
                }
                txn.put_in(FRESH_USED, &key, &now_s.to_be_bytes())
                    .map_err(|e| internal(&e))?;
            }
            None => {
                // Seconds of use, then 0: a legacy use, kept for good.
                let mut record = now_s.to_be_bytes().to_vec();
                record.push(0);
                txn.put_in(USED, k.as_bytes(), &record)
                    .map_err(|e| internal(&e))?;
            }
        }
    }
    Ok(())
}

/// The number after a message's last `:`, when all of it is digits (and
/// fits a u64).
fn trailing_number(message: &str) -> Option<u64> {
    marketplace_common::uint::parse(message.rsplit_once(':')?.1)
}

/// The service's arbiter key: Ed25519, generated into
/// `<data_dir>/arbiter.key` (64 hex, mode 0600) on first start, or given by
/// the operator (`arbiter_key`, 64 hex).
pub struct Arbiter(ed25519_dalek::SigningKey);

impl Arbiter {
    pub fn open(data_dir: &std::path::Path, configured: Option<&str>) -> anyhow::Result<Arbiter> {
        use anyhow::Context;
        let seed_hex = match configured {
            Some(hex) => hex.trim().to_string(),
            None => {
                let path = data_dir.join("arbiter.key");
                match std::fs::read_to_string(&path) {
                    Ok(text) => text.trim().to_string(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        let mut seed = [0u8; 32];
                        crate::ids::fill_random(&mut seed);
                        let hex = marketplace_common::hex::encode(&seed);
                        crate::money::ledger::write_private(&path, &hex)?;
                        hex
                    }
                    Err(e) => {
                        return Err(e).with_context(|| format!("reading {}", path.display()));
                    }
                }
            }
        };
        let seed: [u8; 32] = marketplace_common::hex::decode(&seed_hex)
            .and_then(|b| b.try_into().ok())
            .context("the arbiter key must be 64 hex characters (arbiter_key, or <data_dir>/arbiter.key)")?;
        Ok(Arbiter(ed25519_dalek::SigningKey::from_bytes(&seed)))
    }

    /// The secret seed, 64 lower-case hex (for the key's check digest).
    pub fn seed_hex(&self) -> String {
        marketplace_common::hex::encode(&self.0.to_bytes())
    }

    /// The public key, 64 lower-case hex.
    pub fn public_hex(&self) -> String {
        marketplace_common::hex::encode(self.0.verifying_key().as_bytes())
    }

    /// Signature of `message`, 128 lower-case hex.
    pub fn sign_hex(&self, message: &[u8]) -> String {
        use ed25519_dalek::Signer;
        marketplace_common::hex::encode(&self.0.sign(message).to_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    fn hex(b: &[u8]) -> String {
        marketplace_common::hex::encode(b)
    }

    /// What `actor` says: `message` signed `signature`, fresh at
    /// `timestamp` or legacy without one.
    fn statement<'a>(
        actor: &'a str,
        message: &'a str,
        signature: &'a str,
        timestamp: Option<u64>,
    ) -> Statement<'a> {
        Statement {
            actor,
            message,
            signature,
            timestamp,
        }
    }

    fn setup() -> (tempfile::TempDir, crate::store::Storage, SigningKey, String) {
        let (dir, db) = crate::store::temp_storage();
        let sk = SigningKey::from_bytes(&[7u8; 32]);
        let fp = hex(sk.verifying_key().as_bytes());
        (dir, db, sk, fp)
    }

    #[test]
    fn the_arbiter_key_is_private_stable_and_signs() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arbiter::open(dir.path(), None).unwrap();
        let again = Arbiter::open(dir.path(), None).unwrap();
        assert_eq!(a.public_hex(), again.public_hex());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("arbiter.key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let sig = marketplace_common::hex::decode(&a.sign_hex(b"arbiter_issue:x")).unwrap();
        let key = key_of(&a.public_hex()).unwrap();
        let sig = Signature::from_bytes(&sig.try_into().unwrap());
        assert!(key.verify_strict(b"arbiter_issue:x", &sig).is_ok());
        let given = Arbiter::open(dir.path(), Some(&"07".repeat(32))).unwrap();
        assert_ne!(given.public_hex(), a.public_hex());
        assert!(Arbiter::open(dir.path(), Some("zz")).is_err());
    }

    #[test]
    fn kept_keys_are_the_parsed_keys_and_the_cache_stays_bounded() {
        let cache = KeyCache {
            keys: std::sync::Mutex::new(None),
        };
        let key = |i: u32| {
            let mut seed = [0u8; 32];
            seed[..4].copy_from_slice(&i.to_le_bytes());
            SigningKey::from_bytes(&seed).verifying_key()
        };
        for round in 0..2 {
            for i in 0..(KeyCache::MAX as u32 + 10) {
                let k = key(i);
                assert_eq!(cache.get(k.as_bytes()), Some(k), "round {round}, key {i}");
            }
            let kept = cache.keys.lock().unwrap().as_ref().unwrap().len();
            assert!(kept <= KeyCache::MAX, "{kept}");
        }
        // Bytes that are no point on the curve are refused, and not kept.
        let mut bad = None;
        for b in 0..=255u8 {
            let bytes = [b; 32];
            if VerifyingKey::from_bytes(&bytes).is_err() {
                bad = Some(bytes);
                break;
            }
        }
        let bad = bad.expect("some bytes are no key");
        assert_eq!(cache.get(&bad), None);
        assert!(
            !cache
                .keys
                .lock()
                .unwrap()
                .as_ref()
                .unwrap()
                .contains_key(&bad)
        );
        assert!(key_of(&hex(&bad)).is_none());
        assert_eq!(key_of(&hex(key(3).as_bytes())), Some(key(3)));
    }

    #[test]
    fn fresh_signature_verifies_once() {
        let (_d, db, sk, fp) = setup();
        let sig = hex(&sk.sign(b"post:hi:1000").to_bytes());
        let st = statement(&fp, "post:hi", &sig, Some(1000));
        let txn = db.begin_write().unwrap();
        assert!(verify(&txn, 1100, &st, false, false, false).is_ok());
        assert_eq!(
            verify(&txn, 1100, &st, false, false, false)
                .unwrap_err()
                .status,
            409
        );
    }

    #[test]
    fn a_fresh_signature_never_verifies_as_legacy_for_another_message() {
        let (_d, db, sk, fp) = setup();
        let txn = db.begin_write().unwrap();
        let now = 1_800_000_000u64;
        let sig = hex(&sk.sign(format!("post:hi:{now}").as_bytes()).to_bytes());
        let fresh = statement(&fp, "post:hi", &sig, Some(now));
        let as_legacy_message = format!("post:hi:{now}");
        let legacy = statement(&fp, &as_legacy_message, &sig, None);
        // While the number could be a current timestamp: refused.
        assert_eq!(
            verify(&txn, now, &legacy, false, false, false)
                .unwrap_err()
                .status,
            401
        );
        // Once used fresh: refused as legacy forever after.
        assert!(verify(&txn, now, &fresh, false, false, false).is_ok());
        let later = now + 10 * FRESH_WINDOW_S;
        let r = verify(&txn, later, &legacy, false, false, false).unwrap_err();
        assert_eq!(
            (r.status, r.body.windows(12).any(|w| w == b"auth_invalid")),
            (401, true)
        );
        // A legacy message ending in a number that is no current timestamp
        // (a time of day, a price) still verifies.
        let sig = hex(&sk.sign(b"post:meet at 10:30").to_bytes());
        let st = statement(&fp, "post:meet at 10:30", &sig, None);
        assert!(verify(&txn, now, &st, false, false, false).is_ok());
        assert_eq!(trailing_number("a:b:123"), Some(123));
        assert_eq!(trailing_number("a:b:"), None);
        assert_eq!(trailing_number("a:12x"), None);
    }

    #[test]
    fn fresh_uses_go_in_timestamp_order_and_older_records_still_refuse() {
        let (_d, db, sk, fp) = setup();
        let now = 1_800_000_000u64;
        let fresh_of = |message: &'static str, ts: u64| {
            let sig = hex(&sk.sign(format!("{message}:{ts}").as_bytes()).to_bytes());
            (sig, message, ts)
        };
        let txn = db.begin_write().unwrap();
        // The status a statement is refused with, at `now`.
        let refused = |now: u64, st: &Statement| {
            verify(&txn, now, st, false, false, false)
                .unwrap_err()
                .status
        };
        // A new fresh use: one row under its timestamp, none in `auth:used`.
        let (sig, message, ts) = fresh_of("post:a", now - 7);
        let st = statement(&fp, message, &sig, Some(ts));
        verify(&txn, now, &st, false, false, false).unwrap();
        let k = format!("{fp}:{sig}");
        assert_eq!(
            txn.get_in(FRESH_USED, &fresh_key(ts, &k)).unwrap(),
            Some(now.to_be_bytes().to_vec())
        );
        assert_eq!(txn.get_in(USED, k.as_bytes()).unwrap(), None);
        assert_eq!(refused(now, &st), 409);
        // A fresh use as the previous version recorded it still refuses
        // the signature, fresh (409) and as legacy (401), even with a
        // trailing number the legacy rule would let through.
        let (sig, message, ts) = fresh_of("post:b", 999);
        let k = format!("{fp}:{sig}");
        let mut flagged = now.to_be_bytes().to_vec();
        flagged.push(1);
        txn.put_in(USED, k.as_bytes(), &flagged).unwrap();
        let st = statement(&fp, message, &sig, Some(ts));
        assert_eq!(refused(1_000, &st), 409);
        let as_legacy = format!("{message}:{ts}");
        let legacy = statement(&fp, &as_legacy, &sig, None);
        assert_eq!(refused(1_000, &legacy), 401);
        // The same with a new record: a timestamp below the legacy rule's
        // range (a clock near 1970) is found through the trailing number.
        let (sig, message, ts) = fresh_of("post:c", 990);
        let st = statement(&fp, message, &sig, Some(ts));
        verify(&txn, 1_000, &st, false, false, false).unwrap();
        let as_legacy = format!("{message}:{ts}");
        let legacy = statement(&fp, &as_legacy, &sig, None);
        assert_eq!(refused(1_000, &legacy), 401);
        // A legacy single use refuses the same bytes presented fresh.
        let sig = hex(&sk.sign(b"post:d:12").to_bytes());
        let legacy = statement(&fp, "post:d:12", &sig, None);
        verify(&txn, 1_000, &legacy, false, true, false).unwrap();
        let st = statement(&fp, "post:d", &sig, Some(12));
        assert_eq!(refused(12, &st), 409);
    }

    #[test]
    fn stale_legacy_and_bad_signatures_are_refused() {
        let (_d, db, sk, fp) = setup();
        let txn = db.begin_write().unwrap();
        let sig = hex(&sk.sign(b"post:hi:1000").to_bytes());
        let st = statement(&fp, "post:hi", &sig, Some(1000));
        let r = verify(&txn, 1000 + FRESH_WINDOW_S + 1, &st, false, false, false).unwrap_err();
        assert_eq!(
            (r.status, r.body.windows(12).any(|w| w == b"auth_expired")),
            (401, true)
        );

        let legacy = hex(&sk.sign(b"post:hi").to_bytes());
        let st = statement(&fp, "post:hi", &legacy, None);
        assert!(verify(&txn, 5, &st, false, false, false).is_ok());
        assert!(
            verify(&txn, 5, &st, false, false, false).is_ok(),
            "legacy is reusable unless asked"
        );
        assert_eq!(
            verify(&txn, 5, &st, true, false, false).unwrap_err().status,
            401
        );
        assert!(verify(&txn, 5, &st, false, true, false).is_ok());
        assert_eq!(
            verify(&txn, 5, &st, false, true, false).unwrap_err().status,
            409
        );

        let st = statement(&fp, "post:other", &legacy, None);
        assert_eq!(
            verify(&txn, 5, &st, false, false, false)
                .unwrap_err()
                .status,
            401
        );
        let st = statement("zz", "post:hi", &legacy, None);
        assert_eq!(
            verify(&txn, 5, &st, false, false, false)
                .unwrap_err()
                .status,
            401
        );
    }
}
