//! Black-box tests of posts, comments, attachments, threads, listings,
//! ranked search (PROTOCOL section 5) and ratings (section 6).

mod common;

use common::{Key, Server, now_s};
use serde_json::{Value, json};

fn listing_attachments() -> Value {
    json!([
        {"filename": "terms.md", "content": "# Terms\nPayment on delivery.", "attachment_type": "text/markdown"},
        {"filename": "service.md", "content": "# Service\nWe audit **smart contracts**.", "attachment_type": "text/markdown"},
    ])
}

#[test]
fn recommended_client_flow_search_post_thread() {
    let s = Server::start();
    let seller = s.identity("seller");
    let buyer = s.identity("buyer");
    let id = s.new_post(
        &seller,
        "Contract audit service for escrow marketplaces",
        json!({"post_type": "service_request", "keywords": ["audit", "security"], "attachments": listing_attachments()}),
    );
    assert!(id.starts_with("post_"));

    // 1. Discovery.
    let r = s.get("/api/search?term=audit&limit=20");
    assert_eq!(r.status, 200, "{}", r.text());
    let found = r.json();
    assert_eq!(found["term"], "audit");
    assert_eq!(found["total"], 1);
    let hit = &found["results"][0];
    assert_eq!(hit["post_id"], id.as_str());
    assert!(hit["score"].as_f64().unwrap() > 0.0);
    assert_eq!(hit["listing"]["verified"], true);
    assert_eq!(hit["author_nick"], "seller");

    // 2. Scope validation.
    let post = s.get(&format!("/api/posts/{id}"));
    assert_eq!(post.status, 200);
    let p = post.json()["post"].clone();
    assert_eq!(
        p["listing"],
        json!({"terms": true, "descriptor": "service.md", "verified": true})
    );
    assert_eq!(p["post_type"], "service_request");
    assert_eq!(p["keywords"], json!(["audit", "security"]));
    assert_eq!(p["attachments"][1]["filename"], "service.md");
    assert_eq!(p["attachments"][0]["index"], 0);
    assert!(p["attachments"][0]["sha256"].as_str().unwrap().len() == 64);
    let terms = s.get(&format!("/api/posts/{id}/attachments/0"));
    assert_eq!(terms.text(), "# Terms\nPayment on delivery.");
    // Sent as a JSON string, served as its UTF-8, which the type says
    // (RFC 7763 requires it of text/markdown; clients read text/* without
    // one as Latin-1).
    assert_eq!(
        terms.header("content-type"),
        Some("text/markdown; charset=utf-8")
    );

    // A comment (paid at the comment price) shows in the thread and the count.
    let r = s.post(
        &buyer,
        "Is a Rust codebase in scope?",
        json!({"parent_id": id}),
        &s.mint("0.01"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let comment = r.json()["post_id"].as_str().unwrap().to_string();
    assert_eq!(r.json()["post"]["parent_id"], id.as_str());
    let reply = s.new_post(&seller, "Yes it is.", json!({"parent_id": comment}));
    let t = s.get(&format!("/api/thread/{id}"));
    assert_eq!(t.status, 200);
    let t = t.json();
    assert_eq!(t["root"]["post_id"], id.as_str());
    assert_eq!(t["count"], 2);
    assert_eq!(t["comments"][0]["post_id"], comment.as_str());
    assert_eq!(t["comments"][1]["post_id"], reply.as_str());
    assert_eq!(t["root"]["comment_count"], 1);
    assert_eq!(
        s.get(&format!("/api/posts/{comment}")).json()["post"]["comment_count"],
        1
    );
    assert_eq!(
        s.get(&format!("/api/profile?fingerprint={}", seller.fp()))
            .json()["profile"]["post_count"],
        2
    );
}

#[test]
fn listing_without_terms_is_not_verified() {
    let s = Server::start();
    let k = s.identity("lister");
    let id = s.new_post(
        &k,
        "Product listing",
        json!({"attachments": [{"filename": "product.md", "content": "A product"}]}),
    );
    let l = s.get(&format!("/api/posts/{id}")).json()["post"]["listing"].clone();
    assert_eq!(
        l,
        json!({"terms": false, "descriptor": "product.md", "verified": false})
    );
    let id = s.new_post(&k, "No attachments", json!({}));
    assert_eq!(
        s.get(&format!("/api/posts/{id}")).json()["post"]["listing"]["verified"],
        false
    );
    // `is_public` is accepted (a boolean, or null for absent) and ignored.
    let id = s.new_post(
        &k,
        "Flagged attachments",
        json!({"attachments": [
            {"filename": "a.md", "content": "A", "is_public": false},
            {"filename": "b.md", "content": "B", "is_public": null}
        ]}),
    );
    let post = s.get(&format!("/api/posts/{id}")).json()["post"].clone();
    assert_eq!(post["attachments"].as_array().map(Vec::len), Some(2));
    // An update's attachments are checked as a post's, as the body's 400
    // before a missing signature's 401 (PROTOCOL 1's order).
    let bad = json!({"post_id": id, "attachments": [
        {"filename": "c.md", "content": "C", "is_public": "yes"}
    ]});
    let r = s.post_json("/api/posts/update", &bad);
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_attachment"),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["details"][0]["field"], "attachments[0].is_public");
}

#[test]
fn attachment_bytes_round_trip_with_type_and_etag() {
    let s = Server::start();
    let k = s.identity("files");
    let text = "ünïcödé ✓\r\n\ttabs, \"quotes\" and trailing spaces   \n";
    let id = s.new_post(
        &k,
        "files",
        json!({"attachments": [{"filename": "notes.txt", "content": text, "attachment_type": "text/plain; charset=utf-8"}]}),
    );
    let r = s.get(&format!("/api/posts/{id}/attachments/0"));
    assert_eq!(r.status, 200);
    assert_eq!(r.body, text.as_bytes());
    assert_eq!(
        s.get(&format!("/api/posts/{id}/attachments/00")).status,
        404
    );
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    // Cached as its route says (public): readable by a page whoever
    // fetched it first.
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-expose-headers"), Some("*"));
    assert!(
        r.header("content-security-policy")
            .unwrap()
            .contains("sandbox")
    );
    assert_eq!(
        r.header("content-disposition"),
        Some("inline; filename=\"notes.txt\"; filename*=UTF-8''notes.txt")
    );
    // HEAD: the same headers, the GET's length, no body.
    let head = s.request("HEAD", &format!("/api/posts/{id}/attachments/0"), &[], None);
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(
        head.header("content-length"),
        Some(text.len().to_string().as_str())
    );
    assert_eq!(head.header("etag"), r.header("etag"));
    let etag = r.header("etag").unwrap().to_string();
    // The same bytes as another type are another answer: another tag (a
    // cache holding the first must not be told 304).
    let as_html = s.new_post(
        &k,
        "files as html",
        json!({"attachments": [{"filename": "notes.txt", "content": text, "attachment_type": "text/html"}]}),
    );
    let other = s.get(&format!("/api/posts/{as_html}/attachments/0"));
    assert_eq!(other.body, text.as_bytes());
    assert_eq!(
        other.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_ne!(other.header("etag"), Some(etag.as_str()));
    let again = s.request(
        "GET",
        &format!("/api/posts/{id}/attachments/0"),
        &[("if-none-match", &etag)],
        None,
    );
    assert_eq!(again.status, 304);
    // Compared weakly, as If-None-Match is; another tag is not a match.
    for (tags, status) in [
        (format!("W/{etag}"), 304),
        (format!("\"other\", W/{etag}"), 304),
        ("W/\"other\"".to_string(), 200),
    ] {
        let r = s.request(
            "GET",
            &format!("/api/posts/{id}/attachments/0"),
            &[("if-none-match", &tags)],
            None,
        );
        assert_eq!(r.status, status, "{tags}");
    }
    // Parts of it (a resumed download, a media player's seek): one range,
    // the answer's current tag only; past the end 416.
    let url = format!("/api/posts/{id}/attachments/0");
    assert_eq!(head.header("accept-ranges"), Some("bytes"));
    let part = |headers: &[(&str, &str)]| s.request("GET", &url, headers, None);
    let r = part(&[("range", "bytes=0-1")]);
    assert_eq!((r.status, r.body.as_slice()), (206, &text.as_bytes()[..2]));
    let content_range = format!("bytes 0-1/{}", text.len());
    assert_eq!(r.header("content-range"), Some(content_range.as_str()));
    let r = part(&[("range", "bytes=-3")]);
    assert_eq!(
        (r.status, r.body.as_slice()),
        (206, &text.as_bytes()[text.len() - 3..])
    );
    let r = part(&[("range", "bytes=2-"), ("if-range", &etag)]);
    assert_eq!((r.status, r.body.as_slice()), (206, &text.as_bytes()[2..]));
    for whole in [
        [("range", "bytes=2-"), ("if-range", "\"other\"")],
        [("range", "bytes=0-1,4-5"), ("x-none", "")],
    ] {
        let r = part(&whole);
        assert_eq!(
            (r.status, r.body.as_slice()),
            (200, text.as_bytes()),
            "{whole:?}"
        );
    }
    let r = part(&[("range", "bytes=100000-")]);
    assert_eq!(
        (r.status, r.code()),
        (416, "range_not_satisfiable".to_string())
    );
    let unsatisfied = format!("bytes */{}", text.len());
    assert_eq!(r.header("content-range"), Some(unsatisfied.as_str()));
    // A HEAD ignores Range.
    let r = s.request("HEAD", &url, &[("range", "bytes=0-1")], None);
    assert_eq!(r.status, 200);
    for status in [206, 416] {
        assert!(s.documents("GET", "/api/posts/{post_id}/attachments/{index}", status));
        assert!(s.documents("GET", "/api/storage/files/{token}", status));
    }
    assert!(s.documents("GET", "/api/posts/{post_id}/attachments/{index}", 304));
    assert_eq!(again.header("etag"), Some(etag.as_str()));
    // No body, so no media type made up for it.
    assert_eq!(again.header("content-type"), None);
    assert!(again.body.is_empty());
    assert_eq!(
        s.get(&format!("/api/posts/{id}/attachments/1")).code(),
        "not_found"
    );
    for index in ["x", "+0", "-0", "%200"] {
        assert_eq!(
            s.get(&format!("/api/posts/{id}/attachments/{index}"))
                .code(),
            "not_found",
            "{index}"
        );
    }
    assert_eq!(
        s.get("/api/posts/post_NOPE/attachments/0").code(),
        "not_found"
    );
    assert_eq!(s.get("/api/posts/post_NOPE").code(), "not_found");
    assert_eq!(s.get("/api/thread/nothing-at-all").code(), "not_found");
}

#[test]
fn bad_limits_and_bad_attachments_are_400() {
    let s = Server::start();
    // Digits only: a sign (`%2B5`; a bare `+` is a space in a query) is
    // what `str::parse` would take, ` 5` what a trim would.
    for q in [
        "limit=0",
        "limit=101",
        "limit=abc",
        "limit=-1",
        "limit=2.5",
        "limit=%2B5",
        "limit=+5",
        "limit=%205",
        "limit=5%20",
    ] {
        let r = s.get(&format!("/api/timeline?{q}"));
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "timeline {q}"
        );
        assert_eq!(r.json()["details"][0]["field"], "limit");
        let r = s.get(&format!("/api/search?term=x&{q}"));
        assert_eq!(r.status, 400, "search {q}");
    }
    // Empty is absent: the query as PROTOCOL writes it.
    let r = s.get("/api/timeline?limit=&before=&post_type=&author=");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["posts"].is_array());
    let r = s.get("/api/search?term=x&limit=&post_type=");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.get("/api/search").status, 400);
    assert_eq!(s.get("/api/search?term=%20").status, 400);
    // Blank as the document's `\S` reads it (ECMAScript's white space):
    // U+FEFF is, U+0085 is not.
    assert_eq!(s.get("/api/search?term=%EF%BB%BF").status, 400);
    // The length is the term's as sent, as the document's maxLength.
    let padded = format!("/api/search?term=x{}", "%20".repeat(1000));
    assert_eq!(s.get(&padded).status, 400);
    let r = s.get("/api/search?term=%C2%85");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.get("/api/search?term=x&limit=100").status, 200);

    let k = s.identity("attacher");
    let secret = s.mint("0.3");
    let many: Vec<Value> = (0..17)
        .map(|i| json!({"filename": format!("f{i}.md"), "content": "x"}))
        .collect();
    let cases = [
        (
            json!([{"filename": "a.md", "content": "1"}, {"filename": "A.md", "content": "2"}]),
            "attachments[1].filename",
        ),
        (
            json!([{"filename": "../etc/passwd", "content": "1"}]),
            "attachments[0].filename",
        ),
        (
            json!([{"filename": "bad\u{7}name", "content": "1"}]),
            "attachments[0].filename",
        ),
        // Names that read as another: a right-to-left override (shown as
        // "terms.md"), a zero-width space, a line separator, ...
        (
            json!([{"filename": "\u{202e}dm.smret", "content": "1"}]),
            "attachments[0].filename",
        ),
        (
            json!([{"filename": "terms\u{200b}.md", "content": "1"}]),
            "attachments[0].filename",
        ),
        (
            json!([{"filename": "a\u{2028}b.md", "content": "1"}]),
            "attachments[0].filename",
        ),
        // Tag characters spelling hidden text, a soft hyphen.
        (
            json!([{"filename": "terms\u{e0061}\u{e0062}.md", "content": "1"}]),
            "attachments[0].filename",
        ),
        (
            json!([{"filename": "ter\u{ad}ms.md", "content": "1"}]),
            "attachments[0].filename",
        ),
        (
            json!([{"filename": "big.md", "content": "x".repeat(512 * 1024 + 1)}]),
            "attachments[0].content",
        ),
        (
            json!([{"filename": "nocontent.md"}]),
            "attachments[0].content",
        ),
        (
            json!([{"filename": "flag.md", "content": "1", "is_public": "yes"}]),
            "attachments[0].is_public",
        ),
        (
            json!([{"filename": "flag.md", "content": "1", "is_public": {}}]),
            "attachments[0].is_public",
        ),
        (json!(many), "attachments"),
        (json!("not a list"), "attachments"),
    ];
    for (attachments, field) in cases {
        let r = s.post(
            &k,
            "with attachments",
            json!({"attachments": attachments}),
            &secret,
        );
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_attachment"),
            "{field}: {}",
            r.text()
        );
        assert_eq!(r.json()["details"][0]["field"], field);
    }
    assert_eq!(s.cash_state(&secret).0, json!(false), "400s spend nothing");
    let r = s.post(&k, "", json!({}), &secret);
    assert_eq!(
        (r.status, r.json()["details"][0]["field"].as_str()),
        (400, Some("content"))
    );
}

#[test]
fn content_match_outranks_a_long_attachment_match() {
    let s = Server::start();
    let k = s.identity("ranker");
    let filler: String = (0..600).map(|i| format!("word{i} ")).collect();
    let in_attachment = s.new_post(
        &k,
        "General notes",
        json!({"attachments": [{"filename": "description.md", "content": format!("{filler} zeppelin {filler}")}]}),
    );
    let in_content = s.new_post(&k, "Zeppelin rides over the bay", json!({}));
    let _other = s.new_post(&k, "Nothing relevant here", json!({}));
    let r = s.get("/api/search?term=ZEPPELIN").json();
    assert_eq!(r["total"], 2);
    assert_eq!(r["results"][0]["post_id"], in_content.as_str());
    assert_eq!(r["results"][1]["post_id"], in_attachment.as_str());
    assert!(r["results"][0]["score"].as_f64() > r["results"][1]["score"].as_f64());
    // Keywords are searchable; the post_type filter applies.
    let typed = s.new_post(
        &k,
        "Typed",
        json!({"post_type": "service_request", "keywords": ["zeppelin"]}),
    );
    let r = s
        .get("/api/search?term=zeppelin&post_type=service_request")
        .json();
    assert_eq!(r["total"], 1);
    assert_eq!(r["results"][0]["post_id"], typed.as_str());
    assert_eq!(s.get("/api/search?term=absentword").json()["total"], 0);
}

#[test]
fn timeline_is_newest_first_with_cursor_and_filters() {
    let s = Server::start();
    let a = s.identity("alpha");
    let b = s.identity("beta");
    let mut ids = Vec::new();
    for i in 0..5 {
        let (key, ty) = if i % 2 == 0 {
            (&a, "offer")
        } else {
            (&b, "general")
        };
        ids.push(s.new_post(key, &format!("post {i}"), json!({"post_type": ty})));
    }
    let page = s.get("/api/timeline?limit=2").json();
    let got: Vec<&str> = page["posts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["post_id"].as_str().unwrap())
        .collect();
    assert_eq!(got, [ids[4].as_str(), ids[3].as_str()]);
    assert_eq!(page["next_before"], ids[3].as_str());
    let page2 = s
        .get(&format!("/api/timeline?limit=2&before={}", ids[3]))
        .json();
    assert_eq!(page2["posts"][0]["post_id"], ids[2].as_str());
    let all = s.get("/api/timeline?limit=100").json();
    assert_eq!(all["posts"].as_array().unwrap().len(), 5);
    assert!(all["next_before"].is_null());
    let offers = s.get("/api/timeline?post_type=offer").json();
    assert_eq!(offers["posts"].as_array().unwrap().len(), 3);
    let by_b = s.get(&format!("/api/timeline?author={}", b.fp())).json();
    assert_eq!(by_b["posts"].as_array().unwrap().len(), 2);
    assert!(
        by_b["posts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["author_nick"] == "beta")
    );
    let both = s
        .get(&format!("/api/timeline?author={}&post_type=offer", b.fp()))
        .json();
    assert!(both["posts"].as_array().unwrap().is_empty());
    assert_eq!(s.get("/api/timeline?before=garbage").status, 400);
    assert_eq!(s.get("/api/timeline?before=").status, 200);
    assert_eq!(s.get("/api/timeline?before=post_a%2Fb").status, 400);
    // Filters: an upper-case fingerprint is the same author; empty ones are
    // no filter (PROTOCOL's `?post_type=&author=`); a value no post type or
    // author can have is a 400 naming its field, not an empty page.
    let upper = s
        .get(&format!("/api/timeline?author={}", b.fp().to_uppercase()))
        .json();
    assert_eq!(upper["posts"], by_b["posts"]);
    let unfiltered = s.get("/api/timeline?limit=100&post_type=&author=").json();
    assert_eq!(unfiltered["posts"], all["posts"]);
    for (query, field) in [
        ("author=zz", "author"),
        (&*format!("author={}0", b.fp()), "author"),
        ("post_type=%21%21%21", "post_type"),
        (&*format!("post_type={}", "a".repeat(65)), "post_type"),
    ] {
        let r = s.get(&format!("/api/timeline?{query}"));
        assert_eq!(r.status, 400, "{query}: {}", r.text());
        assert_eq!(r.json()["details"][0]["field"], field, "{query}");
        let r = s.get(&format!("/api/search?term=offer&{query}"));
        if field == "post_type" {
            assert_eq!(r.status, 400, "search {query}: {}", r.text());
            assert_eq!(r.json()["details"][0]["field"], field);
        }
    }
    assert_eq!(s.get("/api/search?term=offer&post_type=").status, 200);
    // An unknown member is ignored whatever its name (PROTOCOL 1); the
    // route's own signer member is type-checked.
    let ts = common::now_s();
    let content = "a post with an unknown member";
    let body = |extra: (&str, Value)| {
        let mut body = json!({
            "author_fingerprint": a.fp(), "content": content,
            "signature": a.sign(&format!("post:{content}:{ts}")), "timestamp": ts,
        });
        body[extra.0] = extra.1;
        body
    };
    let r = s.post_with(
        "/api/timeline",
        &[("x-cash-secret", &s.mint("1"))],
        &body(("referrer_fingerprint", json!(123))),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s.post_with(
        "/api/timeline",
        &[("x-cash-secret", &s.mint("1"))],
        &body(("author_fingerprint", json!(123))),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["details"][0]["field"], "author_fingerprint");
}

#[test]
fn an_author_and_type_filter_pages_past_other_types() {
    // One author's index holds newer posts of another type than a first
    // page reads: the filter still finds the older ones, in order, with the
    // right cursor.
    let s = Server::start();
    let a = s.identity("alpha");
    let offers: Vec<String> = (0..2)
        .map(|i| s.new_post(&a, &format!("offer {i}"), json!({"post_type": "offer"})))
        .collect();
    for i in 0..3 {
        s.new_post(&a, &format!("general {i}"), json!({}));
    }
    let page =
        |limit: u32| s.timeline_page(&format!("author={}&post_type=offer&limit={limit}", a.fp()));
    assert_eq!(page(1), (vec![offers[1].clone()], Some(offers[1].clone())));
    assert_eq!(page(2), (vec![offers[1].clone(), offers[0].clone()], None));
    assert_eq!(page(3), (vec![offers[1].clone(), offers[0].clone()], None));
}

#[test]
fn a_page_passes_over_at_most_256_posts_it_does_not_list() {
    // An offer below 300 newer posts of another type: the filtered first
    // page stops after passing over 256 of them, empty, with a cursor
    // that goes on; the walk still finds the offer, once, and ends.
    let s = Server::start();
    let a = s.identity("alpha");
    let offer = s.new_post(&a, "the one offer", json!({"post_type": "offer"}));
    let general: Vec<String> = (0..300)
        .map(|i| s.new_post(&a, &format!("general {i}"), json!({})))
        .collect();
    let query = format!("author={}&post_type=offer&limit=5", a.fp());
    let (first, cursor) = s.timeline_page(&query);
    assert!(first.is_empty(), "{first:?}");
    // The 256th passed over, newest first.
    assert_eq!(cursor.as_deref(), Some(general[300 - 256].as_str()));
    let (second, end) = s.timeline_page(&format!("{query}&before={}", cursor.unwrap()));
    assert_eq!((second, end), (vec![offer.clone()], None));
    // Unfiltered, the same posts page as ever.
    let (newest, next) = s.timeline_page(&format!("author={}&limit=3", a.fp()));
    assert_eq!(newest, [&general[299][..], &general[298], &general[297]]);
    assert_eq!(next.as_deref(), Some(general[297].as_str()));
}

#[test]
fn a_page_past_its_bound_never_names_a_private_reply() {
    // 300 private replies above the one public post (whose deletion would
    // leave them in no thread): the pages pass over them, each ending at a
    // millisecond rather than at a reply's id, and the walk lists the post
    // once and ends.
    let s = Server::start();
    let (a, b) = (s.identity("alpha"), s.identity("bravo"));
    let root = s.new_post(&a, "the public post", json!({}));
    let replies: std::collections::HashSet<String> = (0..300)
        .map(|i| {
            let payload = format!("sealed {i}");
            let body = json!({
                "author_fingerprint": b.fp(), "content": "", "post_type": "private_reply",
                "parent_id": root, "recipient_fingerprint": a.fp(), "encrypted_payload": payload,
                "signature": b.sign(&format!("post:{payload}")),
            });
            let r = s.post_paid("/api/timeline", &s.mint("0.01"), &body);
            assert_eq!(r.status, 201, "{}", r.text());
            r.json()["post_id"].as_str().unwrap().to_string()
        })
        .collect();
    let (mut listed, mut before, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let (ids, next) = s.timeline_page(&format!("limit=5{before}"));
        listed.extend(ids);
        pages += 1;
        let Some(next) = next else { break };
        assert!(!replies.contains(&next), "a private reply's id: {next}");
        // `post_` and a ULID's millisecond.
        assert_eq!(next.len(), 15, "{next}");
        before = format!("&before={next}");
    }
    assert_eq!(listed, [root]);
    assert!(pages >= 2, "{pages}");
}

#[test]
fn a_thread_of_a_thousand_comments_is_shown_whole() {
    // Its rendering reads a rating per comment and every author: more keys
    // than one storage call may name.
    let s = Server::start();
    let a = s.identity("alpha");
    let b = s.identity("beta");
    let root = s.new_post(&a, "A busy thread", json!({}));
    for i in 0..999 {
        let key = if i % 2 == 0 { &a } else { &b };
        let r = s.post(
            key,
            &format!("comment {i}"),
            json!({"parent_id": root}),
            &s.mint("0.01"),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let t = s.get(&format!("/api/thread/{root}"));
    assert_eq!(t.status, 200, "{}", t.text());
    let t = t.json();
    assert_eq!(t["count"], 999);
    let comments = t["comments"].as_array().unwrap();
    assert_eq!(comments.len(), 999);
    assert_eq!(comments[0]["content"], "comment 0");
    assert_eq!(comments[998]["content"], "comment 998");
    assert_eq!(comments[1]["author_nick"], "beta");
    // Each comment names its own author, the two taking turns (a page's
    // authors are looked up once each).
    for (i, c) in comments.iter().enumerate() {
        let nick = if i % 2 == 0 { "alpha" } else { "beta" };
        assert_eq!(c["author_nick"], nick, "comment {i}");
    }
    assert_eq!(t["root"]["comment_count"], 999);
}

#[test]
fn answers_of_the_largest_posts_page_on_instead_of_failing() {
    // Content is up to 65,536 characters; a control character is stored
    // escaped, six bytes. 90 such comments are about 35 MB of records:
    // more than one storage call may read (`max_call_bytes`, 32 MiB) and
    // than a plugin's memory holds with its answer. Reads come in fewer
    // records then, and each answer holds at most 4 MiB of them and says
    // where to go on.
    let s = Server::start();
    let a = s.identity("largeposts");
    let big = |i: usize| format!("hugeword comment{i} {}", "\u{1}".repeat(65_000));
    let root = s.new_post(&a, "hugeword root of a thread of large comments", json!({}));
    let mut comments = Vec::new();
    for i in 0..90 {
        let r = s.post(&a, &big(i), json!({"parent_id": root}), &s.mint("0.01"));
        assert_eq!(r.status, 201, "{}", r.text());
        comments.push(r.json()["post_id"].as_str().unwrap().to_string());
    }
    // Two deleted, one the first answer reaches and one it does not:
    // every answer's `count` is the whole thread's (PROTOCOL 5: all
    // descendants), not its page's.
    for gone in [comments.remove(85), comments.remove(1)] {
        let ts = common::now_s();
        let delete = json!({"post_id": gone, "author_fingerprint": a.fp(), "timestamp": ts,
                            "signature": a.sign(&format!("delete_post:{gone}:{ts}"))});
        let r = s.post_json("/api/posts/delete", &delete);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // The thread, page by page: every comment once, oldest first.
    let (mut listed, mut after, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let path = match &after {
            Some(a) => format!("/api/thread/{root}?after={a}"),
            None => format!("/api/thread/{root}"),
        };
        let r = s.get(&path);
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.body.len() < 8 << 20, "{} bytes", r.body.len());
        let t = r.json();
        assert_eq!(t["root"]["post_id"], root.as_str());
        let page: Vec<String> = t["comments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["post_id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(t["count"], 88, "{path}");
        assert!(!page.is_empty());
        listed.extend(page);
        pages += 1;
        match t["next_after"].as_str() {
            Some(next) => {
                assert_eq!(Some(next), listed.last().map(String::as_str));
                after = Some(next.to_string());
            }
            None => break,
        }
    }
    assert_eq!(listed, comments);
    assert!(pages > 1, "one answer held every large comment");
    // A cursor is a post id, as the document says; an empty one is none,
    // as the timeline's `before=` is.
    for bad in ["nope", "post_", "post_a-b"] {
        assert_eq!(
            s.get(&format!("/api/thread/{root}?after={bad}")).status,
            400
        );
    }
    let first = s.get(&format!("/api/thread/{root}")).json();
    let r = s.get(&format!("/api/thread/{root}?after="));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["comments"], first["comments"]);
    let doc = s.get("/openapi.json").json();
    let params = doc["paths"]["/api/thread/{post_id}"]["get"]["parameters"].clone();
    let after = params
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "after");
    assert_eq!(
        after.unwrap()["schema"]["pattern"],
        "^(post_[0-9A-Za-z]{1,59})?$"
    );
    // The timeline, at its default and its largest limit, goes on with
    // `next_before`.
    let mut newest_first = comments.clone();
    newest_first.push(root.clone());
    newest_first.sort_by(|x, y| y.cmp(x));
    for limit in [20, 100] {
        let (mut seen, mut before, mut pages) = (Vec::new(), None::<String>, 0);
        loop {
            let query = match &before {
                Some(b) => format!("limit={limit}&before={b}"),
                None => format!("limit={limit}"),
            };
            let (ids, next) = s.timeline_page(&query);
            assert!(!ids.is_empty());
            seen.extend(ids);
            pages += 1;
            match next {
                Some(next) => before = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, newest_first, "limit={limit}");
        assert!(pages > 1);
    }
    // Search lists fewer than asked, and counts them all.
    let r = s.get("/api/search?term=hugeword&limit=100");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["total"], 89);
    let found = r.json()["results"].as_array().unwrap().len();
    assert!((1..89).contains(&found), "{found} results");
}

#[test]
fn post_signature_identity_and_parent_rules() {
    let s = Server::start();
    let stranger = Key::random();
    let secret = s.mint("0.3");
    let r = s.post(&stranger, "unregistered", json!({}), &secret);
    assert_eq!((r.status, r.code().as_str()), (401, "auth_invalid"));
    let k = s.identity("poster");
    let r = s.post(
        &k,
        "orphan",
        json!({"parent_id": "post_01NOPE"}),
        &s.mint("0.01"),
    );
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
    assert_eq!(s.cash_state(&secret).0, json!(false));
    // A legacy post signature is single-use.
    let body = json!({"author_fingerprint": k.fp(), "content": "legacy", "signature": k.sign("post:legacy")});
    assert_eq!(
        s.post_paid("/api/timeline", &s.mint("0.3"), &body).status,
        201
    );
    let again = s.mint("0.3");
    let r = s.post_paid("/api/timeline", &again, &body);
    assert_eq!((r.status, r.code().as_str()), (409, "conflict"));
    assert_eq!(s.cash_state(&again).0, json!(false));
    // The nickname comes from the profile, never the request.
    let r = s.post(
        &k,
        "nick",
        json!({"author_nick": "spoofed"}),
        &s.mint("0.3"),
    );
    assert_eq!(r.json()["post"]["author_nick"], "poster");
    // An empty parent is no parent: a post, priced as one.
    let ts = now_s();
    let unpaid = json!({"author_fingerprint": k.fp(), "content": "no parent", "parent_id": "",
                        "signature": k.sign(&format!("post:no parent:{ts}")), "timestamp": ts});
    let r = s.post_json("/api/timeline", &unpaid);
    assert_eq!(r.status, 402, "{}", r.text());
    assert!(r.text().contains("post"), "{}", r.text());
    assert!(!r.text().contains("comment"), "{}", r.text());
    let r = s.post(&k, "no parent", json!({"parent_id": ""}), &s.mint("0.3"));
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(r.json()["post"]["parent_id"].is_null(), "{}", r.text());
}

#[test]
fn ratings_change_the_authors_score() {
    let s = Server::start();
    let author = s.identity("author");
    let rater = s.identity("rater");
    let post = s.new_post(&author, "Rate me", json!({}));
    let vote = |key: &Key, post_id: &str, v: &str| {
        let ts = now_s();
        s.post_paid(
            "/api/profiles/rate",
            &s.mint("0.001"),
            &json!({"post_id": post_id, "actor_fingerprint": key.fp(), "vote": v, "timestamp": ts,
                    "signature": key.sign(&format!("vote:{post_id}:{v}:{ts}"))}),
        )
    };
    let r = vote(&rater, &post, "up");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["rating"], json!({"up": 1, "down": 0, "score": 1}));
    let r = vote(&rater, &post, "down");
    assert_eq!(r.json()["rating"], json!({"up": 0, "down": 1, "score": -1}));
    assert_eq!(r.json()["previous_vote"], "up");
    let doc = s.get("/openapi.json").json();
    common::assert_documented(&doc, "POST", "/api/profiles/rate", 200, &r.json());
    let profile = s
        .get(&format!("/api/profile?fingerprint={}", author.fp()))
        .json();
    assert_eq!(
        profile["profile"]["rating"],
        json!({"up": 0, "down": 1, "score": -1})
    );
    assert_eq!(
        s.get(&format!("/api/posts/{post}")).json()["post"]["rating"],
        json!({"up": 0, "down": 1})
    );

    let r = vote(&author, &post, "up");
    assert_eq!((r.status, r.code().as_str()), (403, "forbidden_party"));
    let r = vote(&rater, "post_01UNKNOWN", "up");
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
    let r = vote(&rater, &post, "sideways");
    assert_eq!(r.status, 400);
    // The same signed vote again (paid anew): the signature is used. (A
    // timestamp none of the votes above can have: Ed25519 signatures are
    // deterministic.)
    let ts = now_s() + 5;
    let again = json!({"post_id": post, "actor_fingerprint": rater.fp(), "vote": "up", "timestamp": ts,
                       "signature": rater.sign(&format!("vote:{post}:up:{ts}"))});
    assert_eq!(
        s.post_paid("/api/profiles/rate", &s.mint("0.001"), &again)
            .status,
        200
    );
    let r = s.post_paid("/api/profiles/rate", &s.mint("0.001"), &again);
    assert_eq!((r.status, r.code().as_str()), (409, "conflict"));
    assert!(s.documents("POST", "/api/profiles/rate", 409));
    let stranger = Key::random();
    let r = vote(&stranger, &post, "up");
    assert_eq!((r.status, r.code().as_str()), (401, "auth_invalid"));
    let r = s.post_json(
        "/api/profiles/rate",
        &json!({"post_id": post, "vote": "up"}),
    );
    assert_eq!((r.status, r.code().as_str()), (402, "payment_required"));
    assert_eq!(r.json()["required_amount"], "0.001");

    // An author whose identity was deleted has no profile a vote could
    // rate: 404, nothing spent.
    let fp = author.fp();
    let r = s.post_json(
        "/api/identity/delete",
        &json!({"fingerprint": fp, "signature": author.sign(&format!("delete_identity:{fp}"))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let ts = now_s() + 7;
    let secret = s.mint("0.001");
    let r = s.post_paid(
        "/api/profiles/rate",
        &secret,
        &json!({"post_id": post, "actor_fingerprint": rater.fp(), "vote": "up", "timestamp": ts,
                "signature": rater.sign(&format!("vote:{post}:up:{ts}"))}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    assert_eq!(s.cash_state(&secret), (json!(false), json!("0.001")));
}

/// A server whose searches read every list whole (the default for lists
/// this short) or, with `whole_read = 0`, by the threshold algorithm.
fn search_servers() -> [Server; 2] {
    [
        Server::start(),
        Server::with(common::Options {
            config: Some("[settings.search]\nwhole_read = \"0\"\n".into()),
            ..Default::default()
        }),
    ]
}

#[test]
fn the_head_of_a_long_posting_list_ranks_and_filters_reach_its_tail() {
    for s in search_servers() {
        head_of_a_long_list_ranks_and_filters_reach_its_tail(&s);
    }
}

fn head_of_a_long_list_ranks_and_filters_reach_its_tail(s: &Server) {
    let k = s.identity("lister");
    // Equal-scoring posts: the newest must come first among them.
    let mut equal = Vec::new();
    for i in 0..55 {
        equal.push(s.new_post(&k, &format!("common filler{i}"), json!({})));
    }
    let best = s.new_post(&k, "common common common", json!({}));
    let long: String = (0..60).map(|i| format!("pad{i} ")).collect();
    let rare = s.new_post(
        &k,
        &format!("common {long}"),
        json!({"post_type": "rare_kind"}),
    );
    let r = s.get("/api/search?term=common&limit=3").json();
    assert_eq!(r["total"], 57);
    let ids: Vec<&str> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["post_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [best.as_str(), &equal[54], &equal[53]]);
    // The rare type sits at the very end of the impact order (a long post),
    // beyond the head a plain query reads: the filter reads on to it.
    let raw = s.get("/api/search?term=common&post_type=rare_kind&limit=5");
    // The listing check is stored with the post and shown once.
    assert_eq!(
        raw.text().matches("\"listing\"").count(),
        1,
        "{}",
        raw.text()
    );
    let r = raw.json();
    assert_eq!(r["total"], 1);
    assert_eq!(r["results"][0]["post_id"], rare.as_str());
    assert_eq!(r["results"][0]["post_type"], "rare_kind");
}

#[test]
fn a_post_with_every_word_of_the_query_ranks_first_however_deep_in_each_list() {
    for s in search_servers() {
        every_word_ranks_first_however_deep(&s);
    }
}

fn every_word_ranks_first_however_deep(s: &Server) {
    let k = s.identity("twowords");
    // The listing has both words, but in each word's list it ranks below
    // fifty shorter (so higher-impact) posts that have that word alone.
    let listing = s.new_post(&k, "Selling my redx bicyclex, lightly used", json!({}));
    for i in 0..50 {
        s.new_post(&k, &format!("redx a{i}"), json!({}));
        s.new_post(&k, &format!("bicyclex b{i}"), json!({}));
    }
    for query in ["", "&limit=20", "&limit=1"] {
        let r = s.get(&format!("/api/search?term=redx%20bicyclex{query}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let r = r.json();
        let results = r["results"].as_array().unwrap();
        assert_eq!(results[0]["post_id"], listing.as_str(), "{query}: {r}");
        // Its score is both words' parts: above every one-word post.
        let best = results[0]["score"].as_f64().unwrap();
        assert!(
            results[1..]
                .iter()
                .all(|p| p["score"].as_f64().unwrap() < best),
            "{r}"
        );
    }
}

/// A young service's first post was ranked in its word's list against an
/// average length of itself alone: later, longer posts came to rank level
/// with it there (newer first), though its score now is higher. A list
/// this short is read whole, so it still comes first (it was missing from
/// the page when only the list's head was read).
#[test]
fn a_young_services_first_post_keeps_its_rank_as_longer_posts_come() {
    let s = Server::start();
    let k = s.identity("firstseller");
    let first = s.new_post(
        &k,
        "mangosteen durian together in one old listing",
        json!({}),
    );
    // Long posts raise the average length, then shorter ones come: each
    // ranks above the first post in the list (shorter than the average of
    // its time), though the first post, shortest of all, scores higher now.
    let long = "with a long description of the fruit and its many virtues ".repeat(2);
    for i in 0..20 {
        s.new_post(
            &k,
            &format!("mangosteen crate number {i} {long}"),
            json!({}),
        );
    }
    for i in 0..50 {
        s.new_post(
            &k,
            &format!("mangosteen item number {i} with some more filler words"),
            json!({}),
        );
    }
    for query in ["", "&post_type=general"] {
        let r = s
            .get(&format!("/api/search?term=mangosteen&limit=5{query}"))
            .json();
        assert_eq!(r["results"][0]["post_id"], first.as_str(), "{query}: {r}");
        // Read whole, the total is exact with a filter too.
        assert_eq!(r["total"], 71, "{query}");
    }
}

#[test]
fn a_word_longer_than_64_characters_is_found() {
    let s = Server::start();
    let k = s.identity("checksums");
    // A SHA-512 checksum in hex: 128 characters, one word.
    let sum: String = (0..128)
        .map(|i| char::from(b"0123456789abcdef"[i * 7 % 16]))
        .collect();
    let id = s.new_post(
        &k,
        &format!("release tarball sha512 {sum} verified"),
        json!({}),
    );
    for term in [sum.clone(), sum.to_uppercase(), sum[..64].to_string()] {
        let r = s.get(&format!("/api/search?term={term}")).json();
        assert_eq!(r["total"], 1, "{term}: {r}");
        assert_eq!(r["results"][0]["post_id"], id.as_str());
    }
}

/// A post's keywords are read before its content (README, Search): a
/// content of the most characters, two bytes each, fills the index's
/// 128 KiB by itself, and had left the keywords unsearchable (an outside
/// probe's finding).
#[test]
fn a_post_of_the_longest_content_is_found_by_its_keywords() {
    let s = Server::start();
    let k = s.identity("longest");
    let content = "é".repeat(65_536);
    let id = s.new_post(&k, &content, json!({"keywords": ["zqchosen", "two words"]}));
    let found = |w: &str| s.get(&format!("/api/search?term={w}")).json();
    for word in ["zqchosen", "words"] {
        let r = found(word);
        assert_eq!(r["total"], 1, "{word}: {r}");
        assert_eq!(r["results"][0]["post_id"], id.as_str());
    }
    // Updated with other keywords and the same content: the index follows.
    let r = s.post_json(
        "/api/posts/update",
        &json!({"post_id": id, "author_fingerprint": k.fp(), "content": content,
                "keywords": ["zqrenamed"],
                "signature": k.sign(&format!("update_post:{id}"))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(found("zqchosen")["total"], 0);
    assert_eq!(found("zqrenamed")["total"], 1);
}

#[test]
fn a_post_of_many_distinct_words_is_indexed_by_its_most_used() {
    // Its document frequencies are read in pieces of the host's get-many
    // limit (1,000 keys): a long listing is a 201, not a 413. Past 2,048
    // distinct words a post is indexed by those it uses most, then those
    // it uses first (README, Search): its other words are not found.
    let s = Server::start();
    let k = s.identity("wordy");
    let find = |word: &str| s.get(&format!("/api/search?term={word}")).json();
    for (n, letter) in [(1_500usize, 'a'), (2_048, 'b'), (9_000, 'c')] {
        let words: Vec<String> = (0..n).map(|i| format!("{letter}{i:04}")).collect();
        // The last word twice: among the most used, however far it comes.
        let content = format!("{} {}", words.join(" "), words[n - 1]);
        assert!(content.chars().count() <= 65_536, "{}", content.len());
        let r = s.post(&k, &content, json!({}), &s.mint("1"));
        assert_eq!(r.status, 201, "{n} words: {}", r.text());
        let id = r.json()["post_id"].as_str().unwrap().to_string();
        let indexed = n.min(2_047);
        for word in [
            &words[0],
            &words[indexed / 2],
            &words[indexed - 1],
            &words[n - 1],
        ] {
            let found = find(word);
            assert_eq!(found["total"], 1, "{word}: {found}");
            assert_eq!(found["results"][0]["post_id"], id.as_str());
        }
        for word in words[indexed.min(n - 1)..n - 1].iter().step_by(499) {
            assert_eq!(find(word)["total"], 0, "{word} of {n}");
        }
    }
}

/// A post as large as the limits allow, of made-up words in markdown
/// attachments, is posted and found by its first words: its index is
/// bounded (README, Search), where it had run the timeline component
/// past its memory cap (503, every time) and, updated, held the writers'
/// turn for a second.
#[test]
fn a_post_of_the_largest_markdown_of_distinct_words_is_taken_and_found() {
    let s = Server::start();
    let k = s.identity("prolix");
    // Three attachments of 500 KiB, words of 7 letters, none twice: about
    // 190,000 distinct words (a word's letters are its number in base 26).
    let word = |n: usize| -> String {
        (0..7)
            .map(|i| (b'a' + (n / 26usize.pow(i) % 26) as u8) as char)
            .collect()
    };
    let attachments: Vec<Value> = (0..3)
        .map(|a| {
            let words: Vec<String> = (0..65_000).map(|i| word(a * 65_000 + i)).collect();
            let text = words.join(" ");
            json!({"filename": format!("part{a}.md"), "content": &text[..500 * 1024]})
        })
        .collect();
    let secret = s.mint("0.3");
    let r = s.post(
        &k,
        "zqlargest listing",
        json!({"attachments": attachments}),
        &secret,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(s.cash_state(&secret).0, json!(true));
    let id = r.json()["post_id"].as_str().unwrap().to_string();
    let found = |w: &str| s.get(&format!("/api/search?term={w}")).json()["total"].clone();
    assert_eq!(found("zqlargest"), 1);
    // Of the words read (the content's, then the first attachment's to
    // 128 KiB), the content's two and the first 2,046 others are kept.
    for (n, total) in [(0, 1), (2_045, 1), (2_046, 0), (60_000, 0), (65_000, 0)] {
        assert_eq!(found(&word(n)), total, "{}", word(n));
    }
    // A free update with the same attachments and new content is taken
    // too, and the index follows it.
    let r = s.post_json(
        "/api/posts/update",
        &json!({"post_id": id, "author_fingerprint": k.fp(), "content": "zqupdated listing",
                "attachments": attachments,
                "signature": k.sign(&format!("update_post:{id}"))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(found("zqlargest"), 0);
    assert_eq!(found("zqupdated"), 1);
    assert_eq!(found(&word(0)), 1);
}

#[test]
fn a_word_is_one_word_however_its_accents_are_typed() {
    let s = Server::start();
    let k = s.identity("accents");
    // "café" precomposed (U+00E9), the same word as e + U+0301 (what macOS
    // keyboards and many pastes give), and the other word "cafe".
    let nfc = s.new_post(&k, "zqnfc caf\u{e9} au lait", json!({}));
    let nfd = s.new_post(&k, "zqnfd cafe\u{301} au lait", json!({}));
    let plain = s.new_post(&k, "zqplain cafe au lait", json!({}));
    let found = |term: &str| -> Vec<String> {
        let r = s.get(&format!("/api/search?term={term}&limit=20"));
        assert_eq!(r.status, 200, "{term}: {}", r.text());
        let mut ids: Vec<String> = r.json()["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["post_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let mut accented = vec![nfc.clone(), nfd.clone()];
    accented.sort();
    // Asked either way, "café" finds both of its spellings and not "cafe".
    assert_eq!(found("caf%C3%A9"), accented);
    assert_eq!(found("cafe%CC%81"), accented);
    assert_eq!(found("cafe"), vec![plain]);

    // Two attachment names a reader cannot tell apart are duplicates.
    let r = s.post(
        &k,
        "two resumes",
        json!({"attachments": [
            {"filename": "r\u{e9}sum\u{e9}.md", "content": "a"},
            {"filename": "re\u{301}sume\u{301}.md", "content": "b"},
        ]}),
        &s.mint("0.3"),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.code(), "invalid_attachment", "{}", r.text());
    // ... and so are names differing in the case of a letter past ASCII.
    let r = s.post(
        &k,
        "two resumes",
        json!({"attachments": [
            {"filename": "R\u{c9}SUM\u{c9}.md", "content": "a"},
            {"filename": "r\u{e9}sum\u{e9}.md", "content": "b"},
        ]}),
        &s.mint("0.3"),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

/// `GET path`, checked to be 400 `invalid_request` naming `field`.
fn refused_naming(s: &Server, path: &str, field: &str) -> common::Resp {
    let r = s.get(path);
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{path}: {}",
        r.text()
    );
    assert_eq!(r.json()["details"][0]["field"], field, "{path}");
    r
}

#[test]
fn a_query_parameter_that_is_not_utf8_is_refused_not_replaced() {
    let s = Server::start();
    // Latin-1 "café", and bytes that are no text at all.
    for (path, field) in [
        ("/api/search?term=caf%E9", "term"),
        ("/api/search?term=%FF%FE&limit=5", "term"),
        ("/api/profile?nickname=%FF", "nickname"),
        ("/api/timeline?author=%C3", "author"),
    ] {
        let r = refused_naming(&s, path, field);
        assert!(!r.text().contains('\u{FFFD}'), "{}", r.text());
    }
    // UTF-8 escapes decode as before.
    assert_eq!(s.get("/api/search?term=caf%C3%A9").status, 200);
}

/// A parameter a route declares given twice is 400 naming it, not its
/// first value taken and the other dropped (PROTOCOL 1); a parameter no
/// route reads may repeat, as trackers' do.
#[test]
fn a_query_parameter_given_twice_is_refused() {
    let s = Server::start();
    for (path, field) in [
        ("/api/search?term=translate&limit=1&limit=abc", "limit"),
        ("/api/search?term=a&term=b", "term"),
        ("/api/timeline?limit=1&limit=2", "limit"),
        ("/api/timeline?limit=2&limit=2", "limit"),
        ("/api/docs/search?q=post&q=post", "q"),
    ] {
        refused_naming(&s, path, field);
    }
    assert_eq!(s.get("/api/timeline?limit=2&utm=a&utm=b").status, 200);
    assert_eq!(s.get("/api/search?term=a&limit=1").status, 200);
}

/// A 404 names what was asked for, but not all of a long id a stranger
/// sent: the message is clipped.
#[test]
fn a_404_does_not_echo_a_long_id_whole() {
    let s = Server::start();
    let id = "a".repeat(5000);
    let r = s.get(&format!("/api/posts/{id}"));
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
    let message = r.json()["message"].as_str().unwrap().to_string();
    assert!(message.len() < 300, "{} bytes: {message}", message.len());
    assert!(message.ends_with("... not found"), "{message}");
    // A short one is named whole.
    let r = s.get("/api/posts/post_nothing");
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("post_nothing"),
        "{}",
        r.text()
    );
}

#[test]
fn an_unknown_parent_is_404_before_a_reused_signature_is_409() {
    // PROTOCOL 1's order of checks: 401, 404, 403, 409.
    let s = Server::start();
    let key = s.identity("orderly");
    let ts = now_s();
    let content = "first of its signature";
    let body = json!({
        "author_fingerprint": key.fp(),
        "content": content,
        "signature": key.sign(&format!("post:{content}:{ts}")),
        "timestamp": ts,
    });
    let r = s.post_paid("/api/timeline", &s.mint("0.3"), &body);
    assert_eq!(r.status, 201, "{}", r.text());
    let parent = r.json()["post_id"].as_str().unwrap().to_string();

    // The same signature again, as a comment of a post that does not exist.
    let mut again = body.clone();
    again["parent_id"] = json!("post_NOPE");
    let secret = s.mint("0.3");
    refused_unspent(&s, "/api/timeline", &secret, &again, (404, "not_found"));
    // Of a post that exists: the reuse is what is wrong.
    again["parent_id"] = json!(parent);
    refused_unspent(&s, "/api/timeline", &secret, &again, (409, "conflict"));
    // A bad signature is still 401 first, whatever the parent.
    let mut forged = again.clone();
    forged["parent_id"] = json!("post_NOPE");
    forged["signature"] = json!(key.sign("post:something else"));
    let r = s.post_paid("/api/timeline", &secret, &forged);
    assert_eq!(r.status, 401, "{}", r.text());
}

#[test]
fn a_signature_used_on_a_post_since_deleted_is_404_not_409() {
    // PROTOCOL 1's order (401, 404, 403, 409) on every signed route: a
    // signed update and a signed vote, sent again once their post is gone,
    // are answered for the missing post, and nothing is spent.
    let s = Server::start();
    let author = s.identity("gone_author");
    let rater = s.identity("gone_rater");
    let post = s.new_post(&author, "Soon deleted", json!({}));
    let ts = now_s();
    let vote = json!({"post_id": post, "actor_fingerprint": rater.fp(), "vote": "up", "timestamp": ts,
                      "signature": rater.sign(&format!("vote:{post}:up:{ts}"))});
    let r = s.post_paid("/api/profiles/rate", &s.mint("0.001"), &vote);
    assert_eq!(r.status, 200, "{}", r.text());
    let update = json!({"post_id": post, "author_fingerprint": author.fp(), "content": "changed",
                        "timestamp": ts, "signature": author.sign(&format!("update_post:{post}:{ts}"))});
    assert_eq!(s.post_json("/api/posts/update", &update).status, 200);
    // Both again while the post is there: the signatures are used.
    let r = s.post_json("/api/posts/update", &update);
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "conflict"),
        "{}",
        r.text()
    );
    let delete = json!({"post_id": post, "author_fingerprint": author.fp(), "timestamp": ts,
                        "signature": author.sign(&format!("delete_post:{post}:{ts}"))});
    assert_eq!(s.post_json("/api/posts/delete", &delete).status, 200);
    // Once it is gone: 404.
    let r = s.post_json("/api/posts/update", &update);
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    let r = s.post_json("/api/posts/delete", &delete);
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    let secret = s.mint("0.001");
    refused_unspent(&s, "/api/profiles/rate", &secret, &vote, (404, "not_found"));
}

/// A paid request refused with `(status, code)`, its secret left unspent.
fn refused_unspent(s: &Server, path: &str, secret: &str, body: &Value, want: (u16, &str)) {
    let r = s.post_paid(path, secret, body);
    assert_eq!((r.status, r.code().as_str()), want, "{}", r.text());
    assert_eq!(s.cash_state(secret).0, json!(false), "nothing spent");
}

/// Updates are free and re-index the post, so one author's are counted
/// per hour (`updates_per_hour`): past it 429 `rate_limited` with
/// `Retry-After`, the post unchanged; another author, or the next hour,
/// updates again.
#[test]
fn one_author_updates_a_bounded_number_of_times_an_hour() {
    let s = Server::with(common::Options {
        testing_routes: true,
        config: Some("[settings.timeline]\nupdates_per_hour = \"2\"\n".into()),
        ..Default::default()
    });
    let update = |key: &Key, id: &str, content: &str| {
        s.post_json(
            "/api/posts/update",
            &json!({"post_id": id, "author_fingerprint": key.fp(), "content": content,
                    "signature": key.sign(&format!("update_post:{id}"))}),
        )
    };
    let author = s.identity("updater");
    let id = s.new_post(&author, "first words", json!({}));
    for n in 0..2 {
        let r = update(&author, &id, &format!("words {n}"));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = update(&author, &id, "one too many");
    let wait = common::rate_limited(&r, 3600);
    assert!(s.documents("POST", "/api/posts/update", 429));
    let shown = s.get(&format!("/api/posts/{id}")).json();
    assert_eq!(shown["post"]["content"], "words 1", "{shown}");
    // Those were legacy signatures, which whoever holds one may send
    // again: the author's fresh ones are counted apart.
    let fresh = |content: &str| {
        let ts = now_s();
        s.post_json(
            "/api/posts/update",
            &json!({"post_id": id, "author_fingerprint": author.fp(), "content": content,
                    "timestamp": ts, "signature": author.sign(&format!("update_post:{id}:{ts}"))}),
        )
    };
    assert_eq!(fresh("fresh words").status, 200);
    // Another author is not affected.
    let other = s.identity("updater2");
    let theirs = s.new_post(&other, "their words", json!({}));
    assert_eq!(update(&other, &theirs, "changed").status, 200);
    // The next hour, the first updates again.
    let r = s.admin_request("POST", "/admin/clock", &json!({"shift_ms": wait * 1000}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = update(&author, &id, "an hour later");
    assert_eq!(r.status, 200, "{}", r.text());
}
