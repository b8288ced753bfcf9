//! Black-box tests of the original client's identity calls (PROTOCOL 10):
//! identity delete, profile update, recovery scan, and uploads hosted by
//! the service (presign, single-use PUT of at most 8 MiB, public GET).

mod common;

use common::{Key, Server, now_s, path_of};
use marketplace_common::time::rfc3339;
use serde_json::{Value, json};

fn profile(s: &Server, key: &Key) -> common::Resp {
    s.get(&format!("/api/profile?fingerprint={}", key.fp()))
}

fn put(s: &Server, url: &str, body: &[u8]) -> common::Resp {
    s.request(
        "PUT",
        &path_of(url),
        &[("content-type", "application/octet-stream")],
        Some(body),
    )
}

#[test]
fn delete_identity_then_profile_is_404_and_nickname_free() {
    let s = Server::start();
    let alice = s.identity("alice_del");
    let post_id = s.new_post(&alice, "kept after delete", json!({}));
    let fp = alice.fp();

    // A bad signature: 401, nothing deleted.
    let bad = s.post_json(
        "/api/identity/delete",
        &json!({"fingerprint": fp, "signature": alice.sign("delete_identity:someone")}),
    );
    assert_eq!(bad.status, 401, "{}", bad.text());
    assert_eq!(profile(&s, &alice).status, 200);

    // A valid signature of a key with no registered identity: 401
    // `auth_invalid` (PROTOCOL section 2), for delete and for update.
    let stranger = Key::random();
    let r = s.post_json(
        "/api/identity/delete",
        &json!({"fingerprint": stranger.fp(),
                "signature": stranger.sign(&format!("delete_identity:{}", stranger.fp()))}),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["code"], "auth_invalid", "{}", r.text());
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": stranger.fp(), "about": "x",
                "signature": stranger.sign(&format!("update_profile:{}", stranger.fp()))}),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["code"], "auth_invalid", "{}", r.text());
    // Not signed at all: 401 `auth_required`, registered or not.
    for who in [stranger.fp(), alice.fp()] {
        let r = s.post_json("/api/identity/delete", &json!({"fingerprint": who}));
        assert_eq!(r.status, 401, "{}", r.text());
        assert_eq!(r.json()["code"], "auth_required", "{}", r.text());
    }

    // Legacy form, as the original client sends it.
    let sig = alice.sign(&format!("delete_identity:{fp}"));
    let r = s.post_json(
        "/api/identity/delete",
        &json!({"fingerprint": fp, "signature": sig}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"fingerprint": fp, "deleted": true}));
    assert_eq!(profile(&s, &alice).status, 404);
    // Deleting it again: no registered identity any more, 401.
    let r = s.post_json(
        "/api/identity/delete",
        &json!({"fingerprint": fp, "signature": sig}),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["code"], "auth_invalid", "{}", r.text());
    assert_eq!(s.get("/api/profile?nickname=alice_del").status, 404);

    // The post keeps its author fingerprint.
    let post = s.get(&format!("/api/posts/{post_id}"));
    assert_eq!(post.status, 200, "{}", post.text());
    assert!(post.text().contains(&fp), "{}", post.text());

    // The nickname is free again.
    let bob = s.identity("alice_del");
    assert_eq!(
        s.get("/api/profile?nickname=alice_del").json()["profile"]["fingerprint"],
        bob.fp()
    );

    // Fresh form works too.
    let ts = now_s();
    let r = s.post_json(
        "/api/identity/delete",
        &json!({"fingerprint": bob.fp(), "timestamp": ts,
                "signature": bob.sign(&format!("delete_identity:{}:{ts}", bob.fp()))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(profile(&s, &bob).status, 404);
}

#[test]
fn profile_update_shows_about_and_skills() {
    let s = Server::start();
    let carol = s.identity("carol_upd");
    let fp = carol.fp();
    let sig = carol.sign(&format!("update_profile:{fp}"));
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": fp, "signature": sig, "about": "Rust and wasm",
                "skills": ["rust", "wasm"]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let p = profile(&s, &carol).json()["profile"].clone();
    assert_eq!(p["about"], "Rust and wasm");
    assert_eq!(p["skills"], json!(["rust", "wasm"]));
    assert_eq!(p["nickname"], "carol_upd");

    // Only the members given change.
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": fp, "signature": sig, "about": "only about"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let p = profile(&s, &carol).json()["profile"].clone();
    assert_eq!(p["about"], "only about");
    assert_eq!(p["skills"], json!(["rust", "wasm"]));

    // Sizes are validated: 400 with details.
    let too_many: Vec<String> = (0..51).map(|i| format!("s{i}")).collect();
    for bad in [
        json!({"skills": too_many}),
        json!({"skills": ["x".repeat(65)]}),
        // The length is the item's as sent, as the document's maxLength.
        json!({"skills": [format!(" {}", "x".repeat(64))]}),
        json!({"skills": "rust"}),
        // Blank as the document's `\S` reads it (ECMAScript's white
        // space, U+FEFF included).
        json!({"skills": ["\u{feff} "]}),
        json!({"about": "a".repeat(2001)}),
        json!({"profile_picture": "files/nothing"}),
        json!({"profile_picture": "not-an-upload"}),
    ] {
        let mut body = json!({"fingerprint": fp, "signature": sig});
        for (k, v) in bad.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = s.post_json("/api/profile/update", &body);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.code(), "invalid_request");
        assert!(
            r.json()["details"]
                .as_array()
                .is_some_and(|d| !d.is_empty())
        );
    }

    // A profile_picture that is no upload's key is a 400 before the
    // signature is looked at (PROTOCOL 1: 400 before 401), as the
    // document's pattern says.
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": fp, "signature": "00", "profile_picture": "0000"}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );

    // U+0085 is not white space there: a skill of its own, trimmed as
    // ECMAScript trims.
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": fp, "signature": sig, "skills": ["\u{85}", " \u{feff}go\u{feff} "]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let p = profile(&s, &carol).json()["profile"].clone();
    assert_eq!(p["skills"], json!(["\u{85}", "go"]));
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": fp, "signature": sig, "skills": ["rust", "wasm"]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    // Bad signature: 401.
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": fp, "signature": carol.sign("update_profile:x"), "about": "no"}),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(profile(&s, &carol).json()["profile"]["about"], "only about");
}

#[test]
fn recovery_scan_answers_only_verified_probes() {
    let s = Server::start();
    let good = s.identity("rec_good");
    let bad = s.identity("rec_bad");
    let unknown = Key::random();
    let root = Key::random();
    let challenge = format!("recover:{}:{}", root.fp(), rfc3339(now_s() * 1000));
    let body = json!({
        "challenge": challenge,
        "probes": [
            {"key_index": 0, "fingerprint": good.fp(), "signature": good.sign(&challenge)},
            {"key_index": 1, "fingerprint": bad.fp(), "signature": bad.sign("recover:other")},
            {"key_index": 2, "fingerprint": unknown.fp(), "signature": unknown.sign(&challenge)},
        ],
        "include_contracts": true,
        "contract_limit": 10,
    });
    let r = s.post_json("/api/recovery/scan", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["challenge"], challenge);
    assert_eq!(
        v["identities"],
        json!([{"key_index": 0, "fingerprint": good.fp(), "nickname": "rec_good", "pub_key": good.fp()}])
    );
    // The identity family is not granted the contracts keyspace by default.
    assert_eq!(v["contracts"], json!([]));

    // A stale challenge: 401 auth_expired; so is one past the year 9999
    // in UTC (written with an offset), a time too, far from the clock.
    // Before 1970 in UTC (an offset east of it) is long past, too.
    for when in [
        rfc3339((now_s() - 600) * 1000),
        "9999-12-31T23:59:59-00:01".to_string(),
        "1970-01-01T00:00:00+00:01".to_string(),
        "0000-01-01T00:00:00Z".to_string(),
    ] {
        let asked = format!("recover:{}:{when}", root.fp());
        let r = s.post_json(
            "/api/recovery/scan",
            &json!({"challenge": asked, "probes": [
                {"key_index": 0, "fingerprint": good.fp(), "signature": good.sign(&asked)}]}),
        );
        assert_eq!(r.status, 401, "{when}: {}", r.text());
        assert_eq!(r.code(), "auth_expired", "{when}");
    }

    // Malformed challenge and too many probes: 400. So is a time that
    // does not exist (30 February, 29 February of a common year) and a
    // leap second, even the one RFC 3339 admits at a month's end.
    for asked in [
        "recover:nonsense".to_string(),
        format!("recover:{}:2026-02-30T12:00:00Z", root.fp()),
        format!("recover:{}:2100-02-29T12:00:00Z", root.fp()),
        format!("recover:{}:2026-12-31T23:59:60Z", root.fp()),
    ] {
        let r = s.post_json(
            "/api/recovery/scan",
            &json!({"challenge": asked, "probes": []}),
        );
        assert_eq!(r.status, 400, "{asked}: {}", r.text());
        assert_eq!(r.json()["details"][0]["field"], "challenge", "{asked}");
    }
    // A probe's fingerprint is a key's SHA-256, 64 hexadecimal digits.
    for fp in ["not-hex", "", &good.fp()[1..], &format!("{}0", good.fp())] {
        let r = s.post_json(
            "/api/recovery/scan",
            &json!({"challenge": challenge, "probes": [
                {"key_index": 0, "fingerprint": good.fp(), "signature": good.sign(&challenge)},
                {"key_index": 1, "fingerprint": fp, "signature": "00"}]}),
        );
        assert_eq!(r.status, 400, "{fp:?}: {}", r.text());
        let detail = &r.json()["details"][0];
        assert_eq!(detail["field"], "probes", "{fp:?}");
        assert!(
            detail["problem"].as_str().unwrap().contains("probe 1"),
            "{detail}"
        );
    }
    let probes: Vec<Value> = (0..101)
        .map(|i| json!({"key_index": i, "fingerprint": good.fp(), "signature": "00"}))
        .collect();
    let r = s.post_json(
        "/api/recovery/scan",
        &json!({"challenge": challenge, "probes": probes}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn presigned_upload_is_single_use_bounded_and_served_back() {
    let s = Server::start();
    let dave = s.identity("dave_up");

    // Exactly 8 MiB is accepted and served back byte for byte.
    let p = s.presign(&dave, "avatars/dave.png", "image/png");
    assert_eq!(p["expires_in"], 900);
    let s3_key = p["s3_key"].as_str().unwrap().to_string();
    let public_url = p["public_url"].as_str().unwrap().to_string();
    assert!(path_of(&public_url).ends_with(&s3_key), "{p}");
    let body: Vec<u8> = (0..8 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let presigned = p["presigned_url"].as_str().unwrap().to_string();
    let r = put(&s, &presigned, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = s.get("/openapi.json").json();
    for (method, path, answer) in [
        ("POST", "/api/storage/presign", p.clone()),
        ("PUT", "/api/storage/upload/{token}", r.json()),
    ] {
        common::assert_documented(&doc, method, path, 200, &answer);
    }
    let got = s.get(&path_of(&public_url));
    assert_eq!(got.status, 200);
    assert_eq!(got.header("content-type"), Some("image/png"));
    assert!(got.body == body, "the bytes come back unchanged");

    // The same token again: refused.
    let r = put(&s, &presigned, b"again");
    assert!(matches!(r.status, 404 | 409), "{} {}", r.status, r.text());
    assert!(s.get(&path_of(&public_url)).body == body);

    // 8 MiB + 1 byte: 413 before the plugin runs; the token stays usable.
    let p2 = s.presign(&dave, "big.bin", "application/octet-stream");
    let url2 = p2["presigned_url"].as_str().unwrap();
    let mut big = body.clone();
    big.push(0);
    let r = put(&s, url2, &big);
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(
        s.get(&path_of(p2["public_url"].as_str().unwrap())).status,
        404
    );

    // A bad signature: 401.
    let r = s.post_json(
        "/api/storage/presign",
        &json!({"fingerprint": dave.fp(), "file_path": "x", "content_type": "text/plain",
                "is_public": true, "signature": dave.sign("presign:y")}),
    );
    assert_eq!(r.status, 401, "{}", r.text());

    // The picture on the profile.
    let fp = dave.fp();
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": fp, "signature": dave.sign(&format!("update_profile:{fp}")),
                "profile_picture": s3_key}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let prof = profile(&s, &dave).json()["profile"].clone();
    assert_eq!(prof["profile_picture"], s3_key);
    assert_eq!(
        path_of(prof["profile_picture_url"].as_str().unwrap()),
        path_of(&public_url)
    );

    // Someone else cannot use dave's upload as their picture.
    let eve = s.identity("eve_up");
    let efp = eve.fp();
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": efp, "signature": eve.sign(&format!("update_profile:{efp}")),
                "profile_picture": s3_key}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

/// The identity family with the read of the contracts keyspace.
fn reading_contracts() -> common::Options {
    common::Options {
        config: Some(
            "[families.identity]\ncomponent = \"identity.wasm\"\n\
         grants = [\"payments\", \"signatures\"]\nread = [\"timeline\", \"contracts\"]\n"
                .into(),
        ),
        ..Default::default()
    }
}

/// A recovery scan of `key`'s identity (probe index 3) listing at most
/// `limit` contracts.
fn scan_contracts(s: &Server, key: &Key, limit: u64) -> Value {
    let challenge = format!("recover:{}:{}", key.fp(), rfc3339(now_s() * 1000));
    let r = s.post_json(
        "/api/recovery/scan",
        &json!({"challenge": challenge, "include_contracts": true, "contract_limit": limit,
                "probes": [{"key_index": 3, "fingerprint": key.fp(),
                            "signature": key.sign(&challenge)}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn contract_ids(scan: &Value) -> Vec<String> {
    scan["contracts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["contract_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn recovery_scan_lists_contracts_when_the_operator_grants_the_read() {
    let s = Server::with(reading_contracts());
    let d = common::deal::deal(&s);
    let id = common::deal::buy(&s, &d, "1");
    let challenge = format!("recover:{}:{}", d.buyer.fp(), rfc3339(now_s() * 1000));
    let v = scan_contracts(&s, &d.buyer, 10);
    assert_eq!(v["identities"][0]["key_index"], 3);
    let c = &v["contracts"][0];
    assert_eq!(c["contract_id"], id, "{v}");
    assert_eq!(c["buyer_fingerprint"], d.buyer.fp());
    assert_eq!(c["amount"], "1");
    assert_eq!(v["contracts"].as_array().unwrap().len(), 1);
    // Another deal's contracts are not this buyer's; its seller's are
    // the seller's, in the order of their ids, at most the limit.
    let other = common::deal::deal(&s);
    common::deal::buy(&s, &other, "2");
    let second = common::deal::buy(&s, &d, "3");
    assert_eq!(contract_ids(&scan_contracts(&s, &d.buyer, 10)).len(), 2);
    let mut both = vec![id.clone(), second];
    both.sort();
    assert_eq!(contract_ids(&scan_contracts(&s, &d.seller, 10)), both);
    assert_eq!(contract_ids(&scan_contracts(&s, &d.seller, 1)), both[..1]);
    // Without include_contracts: none.
    let r = s.post_json(
        "/api/recovery/scan",
        &json!({"challenge": challenge, "probes": [{"key_index": 3, "fingerprint": d.buyer.fp(),
                "signature": d.buyer.sign(&challenge)}]}),
    );
    assert_eq!(r.json()["contracts"], json!([]));
}

/// A database from before the contracts' index by party (no `by/` rows,
/// no progress): the scan finds its contracts by reading them all, and the
/// contracts family's writes index them, 20 a write.
#[test]
fn recovery_scan_finds_contracts_from_before_the_party_index() {
    use marketplace::store::Kv;
    let mut first = Server::with(reading_contracts());
    let d = common::deal::deal(&first);
    let mut mine: Vec<String> = (0..24)
        .map(|_| common::deal::buy(&first, &d, "1"))
        .collect();
    mine.sort();
    let other = common::deal::deal(&first);
    common::deal::buy(&first, &other, "1");
    first.kill();
    const TABLE: &str = "kv:contracts";
    let index_rows = |data_dir: &std::path::Path| -> Vec<Vec<u8>> {
        let db = common::open_store(data_dir);
        let read = db.begin_read().unwrap();
        read.scan_in(TABLE, b"by/", Some(b"by0"), false, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    // 25 contracts of two deals: each party's row.
    assert_eq!(index_rows(&first.data_dir).len(), 50);
    let db = common::open_store(&first.data_dir);
    db.write(|txn| {
        for (k, _) in txn.scan_in(TABLE, b"by/", Some(b"by0"), false, usize::MAX)? {
            txn.delete_in(TABLE, &k)?;
        }
        txn.delete_in(TABLE, b"meta/by-party")
    })
    .unwrap()
    .unwrap();
    drop(db);
    assert!(index_rows(&first.data_dir).is_empty());

    let opts = common::Options {
        data_dir: Some(first.data_dir.clone()),
        ..reading_contracts()
    };
    let progress = || {
        let db = common::open_store(&first.data_dir);
        let read = db.begin_read().unwrap();
        read.get_in(TABLE, b"meta/by-party").unwrap()
    };
    let mut s = Server::with(opts.clone());
    assert_eq!(contract_ids(&scan_contracts(&s, &d.buyer, 100)), mine);
    assert_eq!(contract_ids(&scan_contracts(&s, &d.buyer, 5)), mine[..5]);
    // A write of the family indexes the first 20 contracts...
    common::deal::act_ok(&s, &d.seller, &mine[0], "accept");
    assert_eq!(contract_ids(&scan_contracts(&s, &d.buyer, 100)), mine);
    s.kill();
    assert_eq!(index_rows(&first.data_dir).len(), 40);
    let halfway = progress().expect("the progress of the index");
    assert!(halfway.starts_with(b"c/"), "{halfway:?}");
    // ... the next the rest, and the index is complete.
    let mut s = Server::with(opts.clone());
    common::deal::act_ok(&s, &d.seller, &mine[1], "accept");
    assert_eq!(contract_ids(&scan_contracts(&s, &d.buyer, 100)), mine);
    assert_eq!(contract_ids(&scan_contracts(&s, &d.buyer, 5)), mine[..5]);
    // Both parties of one deal at once: each contract once.
    let both = {
        let challenge = format!("recover:{}:{}", d.buyer.fp(), rfc3339(now_s() * 1000));
        let probe = |k: &Key, i: u64| json!({"key_index": i, "fingerprint": k.fp(), "signature": k.sign(&challenge)});
        let r = s.post_json(
            "/api/recovery/scan",
            &json!({"challenge": challenge, "include_contracts": true, "contract_limit": 100,
                    "probes": [probe(&d.buyer, 1), probe(&d.seller, 2)]}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    assert_eq!(contract_ids(&both), mine);
    s.kill();
    assert_eq!(index_rows(&first.data_dir).len(), 50);
    assert_eq!(progress().as_deref(), Some(&b"complete"[..]));
}

/// An upload takes about its own size in the database file: redb gives a
/// value of its own a power of two of pages, so an 8 MiB upload kept in
/// one value took 16 MiB (and more as the file grew), letting one paid
/// identity's 64 uploads fill twice the disk the limit implies. Kept in
/// pieces of about a MiB, four uploads of 8 MiB added 1.07 times their
/// bytes to the file, against 4.0 times in one value each; the bound is
/// 2.5 times, since redb grows its file by up to double as it fills.
#[test]
fn an_upload_takes_about_its_size_on_disk() {
    if common::skip_on_postgres(
        "an_upload_takes_about_its_size_on_disk",
        "it reads the embedded store's file",
    ) {
        return;
    }
    let mut s = Server::start();
    let key = s.identity("big_files");
    s.stop();
    let file = s.data_dir.join("marketplace.redb");
    let before = std::fs::metadata(&file).unwrap().len();
    let mut s = Server::with(common::Options {
        data_dir: Some(s.data_dir.clone()),
        ..Default::default()
    });
    let mut uploaded = 0;
    let mut keys = Vec::new();
    for i in 0..4u32 {
        let bytes: Vec<u8> = (0..8 * 1024 * 1024u32)
            .map(|j| (j.wrapping_add(i).wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        uploaded += bytes.len() as u64;
        keys.push((
            s.upload(
                &key,
                &format!("f{i}.bin"),
                "application/octet-stream",
                &bytes,
            ),
            bytes,
        ));
    }
    for (s3_key, bytes) in &keys {
        let got = s.get(&format!("/api/storage/{s3_key}"));
        assert!(
            got.status == 200 && got.body == *bytes,
            "{s3_key} comes back whole"
        );
    }
    s.signal("TERM");
    let stopped = s.wait_exit(std::time::Duration::from_secs(30));
    assert!(
        stopped.is_some_and(|e| e.success()),
        "a clean stop writes the file"
    );
    let grew = std::fs::metadata(&file).unwrap().len() - before;
    assert!(
        grew < uploaded * 5 / 2,
        "the file grew {grew} bytes for {uploaded} bytes of uploads"
    );
}

/// Presigning is free, so one identity may hold at most 64 uploads: the
/// 65th presign is refused and nothing more can be stored for it.
#[test]
fn presigned_uploads_are_bounded_per_identity() {
    let s = Server::start();
    let key = s.identity("quota");
    for i in 0..64 {
        s.presign(&key, &format!("pic{i}.png"), "image/png");
    }
    let r = s.post_json(
        "/api/storage/presign",
        &json!({"fingerprint": key.fp(), "file_path": "one-more.png", "content_type": "image/png",
                "is_public": true, "signature": key.sign("presign:one-more.png")}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "conflict"),
        "{}",
        r.text()
    );
    assert!(s.documents("POST", "/api/storage/presign", 409));
    // Another identity is not affected.
    let other = s.identity("quota2");
    s.presign(&other, "pic.png", "image/png");
}

#[test]
fn a_replayed_legacy_registration_does_not_bring_a_deleted_identity_back() {
    let s = Server::start();
    let key = Key::random();
    // Registered in the legacy form, as the original client does.
    let legacy = json!({"nickname": "phoenix", "pgp_public_key": key.fp(),
                        "signature": key.sign("register:phoenix")});
    let r = s.post_paid("/api/identity", &s.mint("0.6"), &legacy);
    assert_eq!(r.status, 201, "{}", r.text());
    let ts = now_s();
    let r = s.post_json(
        "/api/identity/delete",
        &json!({"fingerprint": key.fp(), "timestamp": ts,
                "signature": key.sign(&format!("delete_identity:{}:{ts}", key.fp()))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Anyone holding the old request replays it, paying: refused, and
    // nothing is spent.
    let secret = s.mint("0.6");
    let r = s.post_paid("/api/identity", &secret, &legacy);
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "conflict"),
        "{}",
        r.text()
    );
    assert_eq!(profile(&s, &key).status, 404);
    assert_eq!(s.get("/api/profile?nickname=phoenix").status, 404);
    // The same key under another nickname, legacy-signed, is no replay.
    let r = s.post_paid(
        "/api/identity",
        &s.mint("0.6"),
        &json!({"nickname": "phoenix_b", "pgp_public_key": key.fp(),
                "signature": key.sign("register:phoenix_b")}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // (Another second than the first delete's: a fresh signature of the
    // same message and time is the same signature, used once only.)
    let ts = now_s() + 1;
    let r = s.post_json(
        "/api/identity/delete",
        &json!({"fingerprint": key.fp(), "timestamp": ts,
                "signature": key.sign(&format!("delete_identity:{}:{ts}", key.fp()))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The owner comes back with a fresh signature (paid by that secret).
    let r = s.register(&key, "phoenix", &secret);
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(profile(&s, &key).status, 200);
}

#[test]
fn a_profile_lookup_with_an_empty_parameter_uses_the_other() {
    let s = Server::start();
    let k = s.identity("emptyq");
    for q in [
        "fingerprint=&nickname=emptyq",
        "nickname=emptyq&fingerprint=",
    ] {
        let r = s.get(&format!("/api/profile?{q}"));
        assert_eq!(r.status, 200, "{q}: {}", r.text());
        assert_eq!(r.json()["profile"]["fingerprint"], k.fp());
    }
    let r = s.get("/api/profile?fingerprint=&nickname=");
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
    // A fingerprint naming no profile is 404, well-formed or not
    // (PROTOCOL section 1).
    for fp in ["zz".to_string(), "ab".repeat(32)] {
        let r = s.get(&format!("/api/profile?fingerprint={fp}&nickname=emptyq"));
        assert_eq!((r.status, r.code().as_str()), (404, "not_found"), "{fp}");
    }
    // Upper-case hex is the same key.
    let r = s.get(&format!(
        "/api/profile?fingerprint={}",
        k.fp().to_ascii_uppercase()
    ));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_private_upload_stays_out_of_shared_caches_and_no_token_is_logged() {
    let s = Server::start();
    let k = s.identity("private_up");
    let presign = |is_public: bool| -> Value {
        let r = s.post_json(
            "/api/storage/presign",
            &json!({"fingerprint": k.fp(), "file_path": "p.png", "content_type": "image/png",
                    "is_public": is_public, "signature": k.sign("presign:p.png")}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    // What is served back as the upload's Content-Type must be a media type.
    for bad in ["not a type", "image", "image/png; charset"] {
        let r = s.post_json(
            "/api/storage/presign",
            &json!({"fingerprint": k.fp(), "file_path": "p.png", "content_type": bad,
                    "is_public": true, "signature": k.sign("presign:p.png")}),
        );
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{bad}: {}",
            r.text()
        );
        assert_eq!(
            r.json()["details"][0]["field"],
            "content_type",
            "{}",
            r.text()
        );
    }
    let mut tokens = Vec::new();
    for (is_public, cache) in [
        (false, "private, no-store"),
        (true, "public, max-age=31536000, immutable"),
    ] {
        let p = presign(is_public);
        let url = p["presigned_url"].as_str().unwrap();
        tokens.push(url.rsplit('/').next().unwrap().to_string());
        assert_eq!(put(&s, url, b"\x89PNG").status, 200);
        // The file's key is a bearer capability too.
        let file = p["public_url"].as_str().unwrap();
        tokens.push(file.rsplit('/').next().unwrap().to_string());
        let r = s.get(&path_of(file));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.header("cache-control"),
            Some(cache),
            "public: {is_public}"
        );
        assert_eq!(r.body, b"\x89PNG");
        // A part of it, while it is the same file (its checksum tags it).
        let etag = r.header("etag").unwrap().to_string();
        assert_eq!(etag.len(), 34, "{etag}");
        let part = s.request(
            "GET",
            &path_of(file),
            &[("range", "bytes=1-2"), ("if-range", &etag)],
            None,
        );
        assert_eq!((part.status, part.body.as_slice()), (206, &b"PN"[..]));
        assert_eq!(part.header("content-range"), Some("bytes 1-2/4"));
        // Revalidated by its tag (304, before any range), and held to it.
        let same = s.request(
            "GET",
            &path_of(file),
            &[("if-none-match", &etag), ("range", "bytes=1-2")],
            None,
        );
        assert_eq!((same.status, same.body.len()), (304, 0));
        assert_eq!(same.header("etag"), Some(etag.as_str()));
        let other = s.request("GET", &path_of(file), &[("if-match", "\"other\"")], None);
        assert_eq!(
            (other.status, other.code().as_str()),
            (412, "precondition_failed")
        );
    }
    // A request no route takes at that URL (a browser's GET: 405) is
    // logged without the token too.
    let p = presign(false);
    let url = p["presigned_url"].as_str().unwrap();
    tokens.push(url.rsplit('/').next().unwrap().to_string());
    assert_eq!(s.get(&path_of(url)).status, 405);
    // The single-use URL's token and the file's key are bearer
    // capabilities: the access line names the route's parameter instead.
    s.wait_log("the upload's access lines", |log| {
        log.contains("path=/api/storage/upload/{token}")
            && log.contains("path=/api/storage/upload/{redacted}")
            && log.contains("path=/api/storage/files/{token}")
    });
    let log = s.log_text();
    for token in &tokens {
        assert!(!log.contains(token.as_str()), "token {token} in the log");
    }
}

#[test]
fn a_malformed_signer_fingerprint_is_401_as_on_every_signed_route() {
    // PROTOCOL 2: a malformed signer is 401 `auth_invalid` (unsigned: 401
    // `auth_required`), here as on the posts and contract routes; one that
    // is not even a string is the body's 400.
    let s = Server::start();
    for path in ["/api/profile/update", "/api/identity/delete"] {
        for fp in ["aa", "zz", "", &"g".repeat(64), &"a".repeat(65)] {
            let r = s.post_json(path, &json!({"fingerprint": fp, "signature": "bb"}));
            assert_eq!(
                (r.status, r.code().as_str()),
                (401, "auth_invalid"),
                "{path} {fp}: {}",
                r.text()
            );
            let r = s.post_json(path, &json!({"fingerprint": fp}));
            assert_eq!(
                (r.status, r.code().as_str()),
                (401, "auth_required"),
                "{path} {fp}: {}",
                r.text()
            );
        }
        // No signer is an unsigned request.
        let r = s.post_json(path, &json!({"signature": "bb"}));
        assert_eq!(
            (r.status, r.code().as_str()),
            (401, "auth_required"),
            "{path}: {}",
            r.text()
        );
        // A signer or signature that is not a string is a malformed body
        // (400, before any 401), as on the other signed routes
        // (tests/payments.rs); another route's signer member is an unknown
        // member, ignored (PROTOCOL 1).
        for (body, field) in [
            (json!({"fingerprint": 5, "signature": "bb"}), "fingerprint"),
            (json!({"fingerprint": "aa", "signature": [1]}), "signature"),
        ] {
            let r = s.post_json(path, &body);
            assert_eq!(
                (r.status, r.code().as_str()),
                (400, "invalid_request"),
                "{path} {body}: {}",
                r.text()
            );
            assert_eq!(
                r.json()["details"][0]["field"],
                field,
                "{path}: {}",
                r.text()
            );
        }
        let r = s.post_json(
            path,
            &json!({"fingerprint": "aa", "signature": "bb", "seller_fingerprint": [[]], "actor_fingerprint": 5}),
        );
        assert_eq!(
            (r.status, r.code().as_str()),
            (401, "auth_invalid"),
            "{path}: {}",
            r.text()
        );
    }
    let r = s.post_json(
        "/api/posts/update",
        &json!({"post_id": "post_NOPE", "author_fingerprint": "aa", "signature": "bb"}),
    );
    assert_eq!((r.status, r.code().as_str()), (401, "auth_invalid"));
}

/// A signed message holds the signer's fingerprint as the body sends it
/// (PROTOCOL 2's `{field}`), on the identity routes as on buy and accept:
/// upper-case hex is signed in upper case, and names the same identity.
#[test]
fn identity_routes_sign_the_fingerprint_as_sent() {
    let s = Server::start();
    let k = s.identity("upper_signer");
    let (lower, upper) = (k.fp(), k.fp().to_ascii_uppercase());
    let ts = now_s();
    let update = |signed: &str, about: &str| {
        s.post_json(
            "/api/profile/update",
            &json!({"fingerprint": upper, "timestamp": ts, "about": about,
                    "signature": k.sign(&format!("update_profile:{signed}:{ts}"))}),
        )
    };
    let r = update(&lower, "lower-cased message");
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "auth_invalid"),
        "{}",
        r.text()
    );
    let r = update(&upper, "as sent");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(profile(&s, &k).json()["profile"]["about"], "as sent");

    let delete = |signed: &str| {
        s.post_json(
            "/api/identity/delete",
            &json!({"fingerprint": upper, "timestamp": ts,
                    "signature": k.sign(&format!("delete_identity:{signed}:{ts}"))}),
        )
    };
    let r = delete(&lower);
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "auth_invalid"),
        "{}",
        r.text()
    );
    assert_eq!(profile(&s, &k).status, 200);
    let r = delete(&upper);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["fingerprint"],
        lower,
        "the identity, in lower case"
    );
    assert_eq!(profile(&s, &k).status, 404);
}
