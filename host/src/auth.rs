//! Ed25519 signature checks (PROTOCOL section 2). The fingerprint is the
//! 64-hex public key; signatures are hex; verification is strict.

use crate::app::Reply;
use crate::storage::{Kv, WriteTxn};
use ed25519_dalek::{Signature, VerifyingKey};

/// Used signatures: "{actor}:{signature}" -> unix seconds of use (u64 BE).
const USED: &str = "auth:used";

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
    if fingerprint.len() != 64 || !fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let bytes = crate::ledger::decode_hex(fingerprint)?;
    VerifyingKey::from_bytes(&bytes.try_into().ok()?).ok()
}

/// Verify a statement; record single-use signatures in `txn`.
/// The signature check alone (no clock, no record): 401 `auth_invalid`
/// when malformed or not verifying.
pub fn check_signature(st: &Statement) -> Result<(), Reply> {
    let key = key_of(st.actor)
        .ok_or_else(|| invalid("actor fingerprint must be a 64-hex Ed25519 public key"))?;
    let sig_bytes = crate::ledger::decode_hex(st.signature)
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
        let internal = |e: &dyn std::fmt::Display| {
            tracing::error!("auth table: {e}");
            Reply::error(500, "internal", "internal error")
        };
        let k = format!(
            "{}:{}",
            st.actor.to_ascii_lowercase(),
            st.signature.to_ascii_lowercase()
        );
        if txn
            .get_in(USED, k.as_bytes())
            .map_err(|e| internal(&e))?
            .is_some()
        {
            return Err(Reply::error(
                409,
                "conflict",
                "this signature was already used",
            ));
        }
        txn.put_in(USED, k.as_bytes(), &now_s.to_be_bytes())
            .map_err(|e| internal(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    fn hex(b: &[u8]) -> String {
        crate::runtime::hex(b)
    }

    fn setup() -> (
        tempfile::TempDir,
        crate::storage::Storage,
        SigningKey,
        String,
    ) {
        let (dir, db) = crate::storage::temp_storage();
        let sk = SigningKey::from_bytes(&[7u8; 32]);
        let fp = hex(sk.verifying_key().as_bytes());
        (dir, db, sk, fp)
    }

    #[test]
    fn fresh_signature_verifies_once() {
        let (_d, db, sk, fp) = setup();
        let sig = hex(&sk.sign(b"post:hi:1000").to_bytes());
        let st = Statement {
            actor: &fp,
            message: "post:hi",
            signature: &sig,
            timestamp: Some(1000),
        };
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
    fn stale_legacy_and_bad_signatures_are_refused() {
        let (_d, db, sk, fp) = setup();
        let txn = db.begin_write().unwrap();
        let sig = hex(&sk.sign(b"post:hi:1000").to_bytes());
        let st = Statement {
            actor: &fp,
            message: "post:hi",
            signature: &sig,
            timestamp: Some(1000),
        };
        let r = verify(&txn, 1000 + FRESH_WINDOW_S + 1, &st, false, false, false).unwrap_err();
        assert_eq!(
            (r.status, r.body.windows(12).any(|w| w == b"auth_expired")),
            (401, true)
        );

        let legacy = hex(&sk.sign(b"post:hi").to_bytes());
        let st = Statement {
            actor: &fp,
            message: "post:hi",
            signature: &legacy,
            timestamp: None,
        };
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

        let st = Statement {
            actor: &fp,
            message: "post:other",
            signature: &legacy,
            timestamp: None,
        };
        assert_eq!(
            verify(&txn, 5, &st, false, false, false)
                .unwrap_err()
                .status,
            401
        );
        let st = Statement {
            actor: "zz",
            message: "post:hi",
            signature: &legacy,
            timestamp: None,
        };
        assert_eq!(
            verify(&txn, 5, &st, false, false, false)
                .unwrap_err()
                .status,
            401
        );
    }
}
