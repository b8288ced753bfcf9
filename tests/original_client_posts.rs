//! Black-box tests of the original client's post calls (PROTOCOL section
//! 10): the author's update and delete of a post, private replies, and
//! images attached by the `s3_key` of the author's upload.

mod common;

use common::{Key, Server, now_s};
use serde_json::{Value, json};

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    common::hex(&sha2::Sha256::digest(bytes))
}

/// `POST /api/posts/update` signed with the legacy message.
fn update(s: &Server, key: &Key, post_id: &str, extra: Value) -> common::Resp {
    let mut body = json!({
        "post_id": post_id,
        "author_fingerprint": key.fp(),
        "signature": key.sign(&format!("update_post:{post_id}")),
    });
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            body[k] = v;
        }
    }
    s.post_json("/api/posts/update", &body)
}

fn search_ids(s: &Server, term: &str) -> Vec<String> {
    let r = s.get(&format!("/api/search?term={term}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["post_id"].as_str().unwrap().to_string())
        .collect()
}

fn timeline_ids(s: &Server, query: &str) -> Vec<String> {
    s.timeline_page(&format!("limit=100{query}")).0
}

fn thread_ids(s: &Server, root: &str) -> Vec<String> {
    let r = s.get(&format!("/api/thread/{root}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["comments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["post_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn update_changes_the_post_and_what_search_finds() {
    let s = Server::start();
    let author = s.identity("author");
    let other = s.identity("other");
    let id = s.new_post(
        &author,
        "Selling vintage typewriters",
        json!({"keywords": ["antique"]}),
    );
    assert_eq!(search_ids(&s, "typewriters"), std::slice::from_ref(&id));
    assert_eq!(search_ids(&s, "antique"), std::slice::from_ref(&id));

    // Another registered identity may not touch it; a bad signature is 401.
    let r = s.post_json(
        "/api/posts/update",
        &json!({"post_id": id, "author_fingerprint": other.fp(), "content": "hijacked",
                "signature": other.sign(&format!("update_post:{id}"))}),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.code(), "forbidden_party");
    let r = s.post_json(
        "/api/posts/update",
        &json!({"post_id": id, "author_fingerprint": author.fp(), "content": "x",
                "signature": author.sign("update_post:post_other")}),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    // Unknown post: 404; invalid members: 400 with details.
    let r = update(
        &s,
        &author,
        "post_01ARZ3NDEKTSV4RRFFQ69G5FAV",
        json!({"content": "x"}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    let r = update(
        &s,
        &author,
        &id,
        json!({"content": "  ", "keywords": "nope"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let details = r.json();
    let fields: Vec<&str> = details["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["field"].as_str().unwrap())
        .collect();
    assert!(
        fields.contains(&"content") && fields.contains(&"keywords"),
        "{fields:?}"
    );
    let r = update(
        &s,
        &author,
        &id,
        json!({"attachments": [{"filename": "../x.md", "content": "x"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.code(), "invalid_attachment");
    assert_eq!(
        s.get(&format!("/api/posts/{id}")).json()["post"]["content"],
        "Selling vintage typewriters"
    );

    // The author's update (free, no payment header).
    let r = update(
        &s,
        &author,
        &id,
        json!({"content": "Selling mechanical keyboards", "keywords": ["clicky"],
               "activity_metadata": {"state": "restocked"},
               "attachments": [{"filename": "terms.md", "content": "# Terms\nShipping worldwide."},
                               {"filename": "product.md", "content": "Cherry switches"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let p = r.json()["post"].clone();
    assert_eq!(p["post_id"], id.as_str());
    assert_eq!(p["content"], "Selling mechanical keyboards");
    assert_eq!(p["keywords"], json!(["clicky"]));
    assert_eq!(p["activity_metadata"], json!({"state": "restocked"}));
    assert_eq!(p["listing"]["verified"], true);
    assert_eq!(p["author_nick"], "author");
    assert_eq!(s.get(&format!("/api/posts/{id}")).json()["post"], p);
    assert_eq!(
        s.get(&format!("/api/posts/{id}/attachments/1")).text(),
        "Cherry switches"
    );

    // Search follows: old terms gone, new ones found.
    assert!(search_ids(&s, "typewriters").is_empty());
    assert!(search_ids(&s, "antique").is_empty());
    assert_eq!(search_ids(&s, "keyboards"), std::slice::from_ref(&id));
    assert_eq!(search_ids(&s, "clicky"), std::slice::from_ref(&id));
    assert_eq!(search_ids(&s, "shipping"), std::slice::from_ref(&id));
    let r = s.get("/api/search?term=typewriters");
    assert_eq!(r.json()["total"], 0);

    // A fresh signature works as well; members not sent stay.
    let ts = now_s();
    let r = s.post_json(
        "/api/posts/update",
        &json!({"post_id": id, "author_fingerprint": author.fp(), "content": "Selling typewriters again",
                "timestamp": ts, "signature": author.sign(&format!("update_post:{id}:{ts}"))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["post"]["keywords"], json!(["clicky"]));
    assert_eq!(search_ids(&s, "typewriters"), std::slice::from_ref(&id));
    assert!(search_ids(&s, "keyboards").is_empty());
    assert_eq!(search_ids(&s, "clicky"), std::slice::from_ref(&id));

    // The metadata alone (the index is left as it is) or the same text
    // again (taken out and put back): every word is still found, once.
    for extra in [
        json!({"activity_metadata": {"state": "sold out"}}),
        json!({"content": "Selling typewriters again", "keywords": ["clicky"]}),
    ] {
        let r = update(&s, &author, &id, extra.clone());
        assert_eq!(r.status, 200, "{extra}: {}", r.text());
        for word in ["typewriters", "clicky", "shipping"] {
            let r = s.get(&format!("/api/search?term={word}")).json();
            assert_eq!(r["total"], 1, "{extra} {word}: {r}");
            assert_eq!(r["results"][0]["post_id"], id.as_str());
        }
    }
    let p = s.get(&format!("/api/posts/{id}")).json()["post"].clone();
    assert_eq!(p["activity_metadata"], json!({"state": "sold out"}));
}

/// An operator who does not need the original client's legacy updates
/// (their signature signs no content: whoever holds one could update
/// again with other content) requires the fresh form for them, post and
/// profile; deletes and the rest stay as they were.
/// The literal update and delete paths are theirs for every method (they
/// take precedence over `/api/posts/{id}`, PROTOCOL 10): a GET there is
/// 405 naming POST, not a read of a post named `update`.
#[test]
fn the_literal_post_paths_answer_405_to_other_methods() {
    let s = Server::start();
    for path in [
        "/api/posts/update",
        "/api/v1/posts/delete",
        "/api/arbitration/contracts/buy",
    ] {
        let r = s.get(path);
        assert_eq!(
            (r.status, r.code().as_str()),
            (405, "method_not_allowed"),
            "{path}: {}",
            r.text()
        );
        assert_eq!(r.header("allow"), Some("POST, OPTIONS"), "{path}");
    }
    // A post id is still read by its route.
    assert_eq!(s.get("/api/posts/post_01NOSUCHPOST").code(), "not_found");
}

#[test]
fn an_operator_can_require_fresh_signatures_for_updates() {
    let s = Server::with(common::Options {
        config: Some(
            "[settings.timeline]\nlegacy_updates = false\n\n[settings.identity]\nlegacy_updates = false\n"
                .into(),
        ),
        ..Default::default()
    });
    let author = s.identity("freshonly");
    let id = s.new_post(&author, "Selling a lamp", json!({}));
    let r = update(
        &s,
        &author,
        &id,
        json!({"content": "Selling a lamp, cheap"}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "auth_expired"),
        "{}",
        r.text()
    );
    assert_eq!(
        s.get(&format!("/api/posts/{id}")).json()["post"]["content"],
        "Selling a lamp"
    );
    let ts = now_s();
    let r = s.post_json(
        "/api/posts/update",
        &json!({"post_id": id, "author_fingerprint": author.fp(), "content": "Selling a lamp, cheap",
                "timestamp": ts, "signature": author.sign(&format!("update_post:{id}:{ts}"))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The profile alike.
    let fp = author.fp();
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": fp, "signature": author.sign(&format!("update_profile:{fp}")), "about": "x"}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "auth_expired"),
        "{}",
        r.text()
    );
    let ts = now_s();
    let r = s.post_json(
        "/api/profile/update",
        &json!({"fingerprint": fp, "timestamp": ts, "about": "lamps",
                "signature": author.sign(&format!("update_profile:{fp}:{ts}"))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // A legacy delete is still taken.
    let r = s.delete_post(&author, &id);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn delete_removes_the_post_everywhere() {
    let s = Server::start();
    let author = s.identity("author");
    let other = s.identity("other");
    let root = s.new_post(&other, "Looking for a bicycle", json!({}));
    let id = s.new_post(
        &author,
        "Refurbished bicycle for sale",
        json!({"parent_id": root}),
    );
    let keep = s.new_post(&author, "Another refurbished listing", json!({}));
    // A reply to the post to delete: it stays in the root's thread.
    let reply = s.new_post(&other, "Is it still available", json!({"parent_id": id}));
    assert_eq!(thread_ids(&s, &root), [id.clone(), reply.clone()]);
    assert!(timeline_ids(&s, "").contains(&id));
    assert_eq!(search_ids(&s, "refurbished").len(), 2);
    assert_eq!(search_ids(&s, "sale"), std::slice::from_ref(&id));

    // Only the author.
    let r = s.post_json(
        "/api/posts/delete",
        &json!({"post_id": id, "author_fingerprint": other.fp(),
                "signature": other.sign(&format!("delete_post:{id}"))}),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.code(), "forbidden_party");
    assert_eq!(s.get(&format!("/api/posts/{id}")).status, 200);

    let r = s.delete_post(&author, &id);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"post_id": id, "deleted": true}));

    assert_eq!(s.get(&format!("/api/posts/{id}")).status, 404);
    assert_eq!(s.get(&format!("/api/thread/{id}")).status, 404);
    assert!(!timeline_ids(&s, "").contains(&id));
    assert!(!timeline_ids(&s, &format!("&author={}", author.fp())).contains(&id));
    assert!(!timeline_ids(&s, "&post_type=general").contains(&id));
    // The reply stays readable, and in every thread it was in.
    assert_eq!(thread_ids(&s, &root), std::slice::from_ref(&reply));
    assert_eq!(s.get(&format!("/api/posts/{reply}")).status, 200);
    assert_eq!(
        s.get(&format!("/api/posts/{root}")).json()["post"]["comment_count"],
        0
    );
    // Below a chain of deleted comments too.
    let deeper = s.new_post(&author, "Yes, it is", json!({"parent_id": reply}));
    assert_eq!(s.delete_post(&other, &reply).status, 200);
    assert_eq!(thread_ids(&s, &root), std::slice::from_ref(&deeper));
    assert_eq!(s.delete_post(&author, &deeper).status, 200);
    assert!(thread_ids(&s, &root).is_empty());
    assert!(search_ids(&s, "sale").is_empty());
    assert_eq!(search_ids(&s, "refurbished"), std::slice::from_ref(&keep));
    assert_eq!(s.get("/api/search?term=refurbished").json()["total"], 1);
    assert_eq!(search_ids(&s, "bicycle"), std::slice::from_ref(&root));
    // A second delete finds nothing.
    assert_eq!(s.delete_post(&author, &id).status, 404);
    assert_eq!(s.get(&format!("/api/posts/{keep}")).status, 200);
}

#[test]
fn private_replies_are_paid_hidden_and_readable_by_id_and_thread() {
    let s = Server::start();
    let seller = s.identity("seller");
    let buyer = s.identity("buyer");
    let root = s.new_post(&seller, "Rare stamps collection", json!({}));
    let payload = "-----BEGIN AGE-----\nb3BhcXVlIHN0YW1wcw==\n-----END AGE-----";
    let body = json!({
        "author_fingerprint": buyer.fp(),
        "content": "",
        "post_type": "private_reply",
        "parent_id": root,
        "recipient_fingerprint": seller.fp(),
        "encrypted_payload": payload,
        "signature": buyer.sign(&format!("post:{payload}")),
    });

    // Unpaid: 402 quoting the comment price.
    let r = s.post_json("/api/timeline", &body);
    assert_eq!(r.status, 402, "{}", r.text());
    assert_eq!(r.json()["payment"]["action"], "comment");
    assert_eq!(r.json()["payment"]["price"], "0.01");

    // Invalid shapes: 400 (content must be empty, payload and recipient
    // required, payload at most 64 KiB); other post types keep refusing "".
    let mut bad = body.clone();
    bad["content"] = json!("plaintext");
    bad["encrypted_payload"] = Value::Null;
    bad["recipient_fingerprint"] = json!("xyz");
    let r = s.post_paid("/api/timeline", &s.mint("0.01"), &bad);
    assert_eq!(r.status, 400, "{}", r.text());
    let mut big = body.clone();
    big["encrypted_payload"] = json!("a".repeat(64 * 1024 + 1));
    let r = s.post_paid("/api/timeline", &s.mint("0.01"), &big);
    assert_eq!(r.status, 400, "{}", r.text());
    let r = s.post(&buyer, "", json!({"parent_id": root}), &s.mint("0.01"));
    assert_eq!(r.status, 400, "{}", r.text());

    // Addressed to nobody (no registered identity): 404, nothing spent.
    let mut nobody = body.clone();
    nobody["recipient_fingerprint"] = json!("ab".repeat(32));
    let secret = s.mint("0.01");
    let r = s.post_paid("/api/timeline", &secret, &nobody);
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    assert_eq!(s.cash_state(&secret), (json!(false), json!("0.01")));

    // Paid at the comment price: 201.
    let r = s.post_paid("/api/timeline", &s.mint("0.01"), &body);
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["post_id"].as_str().unwrap().to_string();
    assert_eq!(r.json()["payment"]["action"], "comment");
    assert_eq!(r.json()["post"]["encrypted_payload"], payload);

    // Readable by id, opaque payload intact.
    let p = s.get(&format!("/api/posts/{id}"));
    assert_eq!(p.status, 200, "{}", p.text());
    let p = p.json()["post"].clone();
    assert_eq!(p["post_type"], "private_reply");
    assert_eq!(p["content"], "");
    assert_eq!(p["parent_id"], root.as_str());
    assert_eq!(p["encrypted_payload"], payload);
    assert_eq!(p["recipient_fingerprint"], seller.fp());
    assert_eq!(p["author_fingerprint"], buyer.fp());

    // In the parent's thread.
    let t = s.get(&format!("/api/thread/{root}")).json();
    assert_eq!(t["count"], 1);
    assert_eq!(t["comments"][0]["post_id"], id.as_str());
    assert_eq!(t["comments"][0]["encrypted_payload"], payload);

    // Never in the timeline (any filter) or search.
    assert!(!timeline_ids(&s, "").contains(&id));
    assert!(!timeline_ids(&s, "&post_type=private_reply").contains(&id));
    assert!(!timeline_ids(&s, &format!("&author={}", buyer.fp())).contains(&id));
    assert!(search_ids(&s, "b3BhcXVlIHN0YW1wcw").is_empty());
    assert!(search_ids(&s, "AGE").is_empty());

    // The legacy signature is single-use, as for any post.
    let r = s.post_paid("/api/timeline", &s.mint("0.01"), &body);
    assert_eq!(r.status, 409, "{}", r.text());

    // The author may delete it: it leaves the thread.
    assert_eq!(s.delete_post(&buyer, &id).status, 200);
    assert_eq!(s.get(&format!("/api/posts/{id}")).status, 404);
    assert_eq!(s.get(&format!("/api/thread/{root}")).json()["count"], 0);

    // Private replies newer than the public posts, more of them than the
    // first page of an answer reads: the timeline still finds the posts
    // behind them, and knows what follows. (Private replies are not in the
    // author index: the author's timeline holds the public post alone;
    // paging an index past skipped posts is tested in tests/timeline.rs.)
    let older = s.new_post(&buyer, "Older public post", json!({}));
    for n in 0..3 {
        let payload = format!("-----BEGIN AGE-----\nbW9yZSB{n}\n-----END AGE-----");
        let mut more = body.clone();
        more["encrypted_payload"] = json!(payload);
        more["signature"] = json!(buyer.sign(&format!("post:{payload}")));
        let r = s.post_paid("/api/timeline", &s.mint("0.01"), &more);
        assert_eq!(r.status, 201, "{}", r.text());
    }
    assert_eq!(
        s.timeline_page("limit=1"),
        (vec![older.clone()], Some(older.clone()))
    );
    assert_eq!(
        s.timeline_page("limit=2"),
        (vec![older.clone(), root.clone()], None)
    );
    for limit in [1, 2] {
        let by_buyer = s.timeline_page(&format!("limit={limit}&author={}", buyer.fp()));
        assert_eq!(by_buyer, (vec![older.clone()], None), "limit {limit}");
    }
}

#[test]
fn attachments_may_refer_to_the_authors_uploads() {
    let s = Server::start();
    let author = s.identity("painter");
    let other = s.identity("copier");
    // An image larger than an inline attachment may be, and stored in
    // pieces by the identity family (three of about a MiB), which this
    // family reads.
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend((0..2_700 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8));
    let s3_key = s.upload(&author, "img.png", "image/png", &png);
    let file_id = s3_key
        .strip_prefix("files/")
        .expect("files/{id}")
        .to_string();

    // Posted as `hrmw timeline post --image` sends it: no content.
    let sent = json!({"filename": "img.png", "attachment_type": "image/png",
                      "s3_key": s3_key, "is_public": true});
    let r = s.post(
        &author,
        "Oil painting, framed",
        json!({"attachments": [sent]}),
        &s.mint("0.3"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["post_id"].as_str().unwrap().to_string();
    let post = r.json()["post"].clone();
    let a = &post["attachments"][0];
    assert_eq!(a["index"], 0);
    assert_eq!(a["filename"], "img.png");
    assert_eq!(a["attachment_type"], "image/png");
    assert_eq!(a["s3_key"], s3_key.as_str());
    assert_eq!(a["url"], format!("/api/storage/files/{file_id}"));
    assert_eq!(a["size"], png.len());
    // Its digest, as an inline attachment's (PROTOCOL 5).
    assert_eq!(a["sha256"], sha256_hex(&png));
    assert_eq!(s.get(&format!("/api/posts/{id}")).json()["post"], post);
    // The URL is the one the identity family serves the upload at.
    assert!(s.get(a["url"].as_str().unwrap()).body == png);

    // The attachment route serves the upload's bytes and type, as safely
    // as an inline attachment.
    let got = s.get(&format!("/api/posts/{id}/attachments/0"));
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(got.body == png, "the uploaded bytes come back");
    assert_eq!(got.header("content-type"), Some("image/png"));
    assert_eq!(got.header("x-content-type-options"), Some("nosniff"));
    assert!(
        got.header("content-security-policy")
            .unwrap()
            .contains("sandbox")
    );
    let etag = got.header("etag").expect("an ETag").to_string();
    let again = s.request(
        "GET",
        &format!("/api/posts/{id}/attachments/0"),
        &[("if-none-match", &etag)],
        None,
    );
    assert_eq!(again.status, 304);

    // Refused before payment, nothing spent: an unknown upload, another
    // identity's upload, and content with an s3_key.
    let theirs = s.upload(&other, "theirs.png", "image/png", b"not yours");
    let cases = [
        json!({"filename": "img.png", "attachment_type": "image/png",
               "s3_key": "files/01J000000000000000000000000unknown", "is_public": true}),
        json!({"filename": "img.png", "attachment_type": "image/png",
               "s3_key": theirs, "is_public": true}),
        json!({"filename": "img.png", "attachment_type": "image/png",
               "s3_key": s3_key, "content": "inline too"}),
    ];
    for attachment in cases {
        let secret = s.mint("0.3");
        let r = s.post(
            &author,
            "Oil painting, framed",
            json!({"attachments": [attachment]}),
            &secret,
        );
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_attachment"),
            "{attachment}: {}",
            r.text()
        );
        assert_eq!(
            r.json()["details"][0]["field"],
            "attachments[0].s3_key",
            "{}",
            r.text()
        );
        assert_eq!(s.cash_state(&secret).0, json!(false), "400s spend nothing");
    }
    // The same through the author's update; the post stays as it was.
    let r = update(
        &s,
        &author,
        &id,
        json!({"attachments": [{"filename": "x.png", "s3_key": theirs}]}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_attachment"),
        "{}",
        r.text()
    );
    assert_eq!(s.get(&format!("/api/posts/{id}")).json()["post"], post);

    // An update mixes inline attachments and uploads; an upload's type
    // defaults to its own, and only inline markdown is searched.
    let notes = s.upload(
        &author,
        "notes.md",
        "text/markdown",
        b"# Provenance\nquattrocento",
    );
    let r = update(
        &s,
        &author,
        &id,
        json!({"attachments": [
            {"filename": "terms.md", "content": "# Terms\nPickup only, impasto guaranteed."},
            {"filename": "notes.md", "s3_key": notes, "is_public": true},
            sent,
        ]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let list = r.json()["post"]["attachments"].clone();
    assert_eq!(list[0]["size"], 40);
    assert_eq!(list[0]["sha256"].as_str().unwrap().len(), 64);
    assert!(list[0].get("s3_key").is_none() && list[0].get("url").is_none());
    assert_eq!(list[1]["attachment_type"], "text/markdown");
    assert_eq!(list[1]["s3_key"], notes.as_str());
    assert_eq!(list[1]["sha256"], sha256_hex(b"# Provenance\nquattrocento"));
    assert_eq!(list[2]["s3_key"], s3_key.as_str());
    assert_eq!(search_ids(&s, "impasto"), std::slice::from_ref(&id));
    assert!(search_ids(&s, "quattrocento").is_empty());
    let got = s.get(&format!("/api/posts/{id}/attachments/1"));
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.text(), "# Provenance\nquattrocento");
    assert_eq!(got.header("content-type"), Some("text/markdown"));
    assert!(s.get(&format!("/api/posts/{id}/attachments/2")).body == png);

    // Deleting the post leaves the upload with its owner.
    assert_eq!(s.delete_post(&author, &id).status, 200);
    assert_eq!(s.get(&format!("/api/posts/{id}/attachments/2")).status, 404);
    assert!(s.get(&format!("/api/storage/files/{file_id}")).body == png);
}
