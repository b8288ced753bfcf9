//! Black-box tests of endpoint families (PROTOCOL section 9): mounting a new
//! family through the admin API, the configuration and the watched
//! `families/` directory; unmounting; the assembled OpenAPI document and the
//! health view; route conflicts and refused components (the old one keeps
//! serving); capability grants checked at mount; a rogue family cannot reach
//! another family's escrow.

mod common;

use common::deal::{act_ok, admin, buy, deal};
use common::{Options, Server, with_custom_section};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Every capability an operator can grant.
const ALL_GRANTS: &[&str] = &[
    "payments",
    "signatures",
    "escrow",
    "dispatch",
    "host-info",
    "limits",
    "arbiter",
    "credentials",
];

/// `items` as a TOML array's members: `"a", "b"`.
fn toml_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|g| format!("\"{g}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The routes of the template component.
const TEMPLATE_ROUTES: &[&str] = &["GET /api/template/notes", "POST /api/template/notes"];

// ---------------------------------------------------------------- helpers

/// A built component's bytes.
fn wasm(file: &str) -> Vec<u8> {
    std::fs::read(common::plugins_dir().join(file))
        .unwrap_or_else(|e| panic!("reading {file}: {e}"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    common::hex(&Sha256::digest(bytes))
}

/// `GET /admin/plugins`.
fn plugins(s: &Server) -> Vec<Value> {
    let r = admin(s, "GET", "/admin/plugins", b"");
    assert_eq!(r.status, 200, "GET /admin/plugins: {}", r.text());
    r.json().as_array().expect("a JSON list").clone()
}

/// The admin entry of one family (mounted, unmounted or a refused file),
/// if it is listed.
fn plugin(s: &Server, family: &str) -> Option<Value> {
    plugins(s).into_iter().find(|p| p["family"] == family)
}

fn openapi(s: &Server) -> Value {
    let r = s.get("/openapi.json");
    assert_eq!(r.status, 200, "/openapi.json: {}", r.text());
    r.json()
}

fn health(s: &Server) -> Value {
    let r = s.get("/api/health");
    assert_eq!(r.status, 200, "/api/health: {}", r.text());
    r.json()
}

/// A JSON list of strings as a set.
fn names(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected a list of strings, got {v}"))
        .iter()
        .map(|x| x.as_str().expect("a string").to_string())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The capability names a component imports beyond the base interfaces
/// every family has, read from its import names.
fn imported_capabilities(bytes: &[u8]) -> BTreeSet<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut out = BTreeSet::new();
    for (interface, capability) in [
        ("payments", "payments"),
        ("auth", "signatures"),
        ("escrow", "escrow"),
        ("dispatch", "dispatch"),
        ("host", "host-info"),
        ("limits", "limits"),
        ("arbiter", "arbiter"),
    ] {
        if text.contains(&format!("marketplace:plugin/{interface}@")) {
            out.insert(capability.to_string());
        }
    }
    out
}

/// A private plugins directory holding copies of the built components, so
/// nothing is ever written into the shared build directory.
fn plugin_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(common::plugins_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "wasm") {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    dir
}

/// A server on a private copy of the plugins directory, and that copy's
/// families directory (made), which it watches. The copy lives as long as
/// the returned directory.
fn watching_families() -> (tempfile::TempDir, Server, PathBuf) {
    let plugins_dir = plugin_copy();
    let s = Server::with(common::Options {
        plugins_dir: Some(plugins_dir.path().to_path_buf()),
        ..Default::default()
    });
    let families = plugins_dir.path().join("families");
    std::fs::create_dir_all(&families).unwrap();
    (plugins_dir, s, families)
}

/// Write a file the way an operator's deploy does: write aside, rename.
fn install(bytes: &[u8], to: &Path) {
    let tmp = to.with_extension("part");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// Poll `check` until it holds (behaviour, not timing: the deadline is
/// generous).
fn eventually(what: &str, s: &Server, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        if Instant::now() > deadline {
            panic!("never happened: {what}\n---- log ----\n{}", s.log_text());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn notes(s: &Server) -> common::Resp {
    s.get("/api/template/notes")
}

fn write_note(s: &Server, note: &str) -> common::Resp {
    s.post_json("/api/template/notes", &json!({"note": note}))
}

// ------------------------------------------------------- contract helpers

// ------------------------------------------------------------------ tests

/// `GET path`: its 200 body, with the content type checked.
fn page(s: &Server, path: &str, content_type: &str) -> Vec<u8> {
    let r = s.get(path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    let ct = r.header("content-type").unwrap_or_default();
    assert!(ct.starts_with(content_type), "{path}: {ct}");
    r.body
}

#[test]
fn the_yaml_document_docs_page_and_docs_search_follow_every_mount_and_unmount() {
    // The MCP family derives all three from the document once per load of
    // components (its memo): each must still show the routes served now.
    let s = Server::start();
    let yaml = || page(&s, "/openapi.yaml", "application/yaml");
    let docs = || page(&s, "/docs", "text/html");
    let has_notes = |b: &[u8]| String::from_utf8_lossy(b).contains("/api/template/notes");
    let found = || {
        has_notes(&page(
            &s,
            "/api/docs/search?q=template+notes",
            "application/json",
        ))
    };
    // Each document has a tag, by which a client revalidates it (304,
    // no body) until a load changes it.
    let tags = || {
        ["/openapi.json", "/openapi.yaml", "/docs"].map(|path| {
            let tag = s.get(path).header("etag").unwrap().to_string();
            let again = s.request("GET", path, &[("if-none-match", &tag)], None);
            assert_eq!((again.status, again.body.len()), (304, 0), "{path}");
            tag
        })
    };
    let tags_before = tags();
    assert!(tags_before[0] != tags_before[1] && tags_before[1] != tags_before[2]);
    let (yaml_before, docs_before) = (yaml(), docs());
    assert!(!has_notes(&yaml_before) && !has_notes(&docs_before) && !found());
    // Kept and rendered give the same bytes.
    assert_eq!(yaml(), yaml_before);
    assert_eq!(docs(), docs_before);

    let r = admin(&s, "PUT", "/admin/plugins/template", &wasm("template.wasm"));
    assert_eq!(r.status, 200, "mount template: {}", r.text());
    let (yaml_mounted, docs_mounted) = (yaml(), docs());
    assert!(
        has_notes(&yaml_mounted),
        "the YAML shows the mounted family's routes"
    );
    assert!(has_notes(&docs_mounted), "the docs page shows them");
    assert!(found(), "docs search finds them");
    assert_eq!(yaml(), yaml_mounted);
    assert_eq!(docs(), docs_mounted);
    let tags_mounted = tags();
    for (before, mounted) in tags_before.iter().zip(&tags_mounted) {
        assert_ne!(before, mounted, "a new document, a new tag");
    }

    let r = admin(&s, "DELETE", "/admin/plugins/template", b"");
    assert_eq!(r.status, 200, "unmount template: {}", r.text());
    assert_eq!(yaml(), yaml_before, "back to the document before the mount");
    assert_eq!(docs(), docs_before);
    assert_eq!(tags(), tags_before, "the same bytes, the same tags");
    assert!(!found());
}

#[test]
fn a_familys_memo_keeps_text_for_its_later_requests_until_the_next_load() {
    let s = Server::testing();
    // `GET /_testing/memo?key=K[&put=V]`: whether V was kept, then what the
    // testing family's memo holds under K.
    let memo = |query: &str| {
        let r = s.get(&format!("/_testing/memo?{query}"));
        assert_eq!(r.status, 200, "{query}: {}", r.text());
        let b = r.json();
        (b["stored"].clone(), b["value"].clone())
    };
    assert_eq!(memo("key=a"), (Value::Null, Value::Null), "empty at start");
    assert_eq!(memo("key=a&put=one"), (json!(true), json!("one")));
    assert_eq!(memo("key=b&put=two"), (json!(true), json!("two")));
    // Later requests (each a fresh instance) read what earlier ones kept.
    assert_eq!(memo("key=a"), (Value::Null, json!("one")));
    assert_eq!(memo("key=b"), (Value::Null, json!("two")));
    assert_eq!(memo("key=a&put=three"), (json!(true), json!("three")));
    assert_eq!(memo("key=a"), (Value::Null, json!("three")));

    // A key over 256 bytes is not kept.
    let long = "k".repeat(257);
    assert_eq!(
        memo(&format!("key={long}&put=x")),
        (json!(false), Value::Null)
    );

    // Each family has a memo of its own: the mcp family keeps its YAML
    // under this key (`memoized("openapi.yaml", ..)` in
    // plugins/mcp/src/lib.rs), which the testing family does not see.
    page(&s, "/openapi.yaml", "application/yaml");
    assert_eq!(memo("key=openapi.yaml"), (Value::Null, Value::Null));

    // Another family mounted: the route table changed, so what was derived
    // from the one before is gone.
    let r = admin(&s, "PUT", "/admin/plugins/template", &wasm("template.wasm"));
    assert_eq!(r.status, 200, "mount template: {}", r.text());
    assert_eq!(memo("key=a"), (Value::Null, Value::Null));
    assert_eq!(memo("key=b"), (Value::Null, Value::Null));

    // The family's own component loaded again (same bytes): it starts with
    // an empty memo.
    assert_eq!(memo("key=a&put=four"), (json!(true), json!("four")));
    assert_eq!(memo("key=a"), (Value::Null, json!("four")));
    let r = admin(&s, "PUT", "/admin/plugins/testing", &wasm("testing.wasm"));
    assert_eq!(r.status, 200, "load testing again: {}", r.text());
    assert_eq!(memo("key=a"), (Value::Null, Value::Null));
}

#[test]
fn template_mounts_through_the_admin_api_serves_and_unmounts_keeping_its_data() {
    let s = Server::start();
    let template = wasm("template.wasm");

    // Not served before it is mounted.
    let r = notes(&s);
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    assert!(openapi(&s)["paths"].get("/api/template/notes").is_none());
    assert!(plugin(&s, "template").is_none());

    // Mounted as a new family, with no grants at all.
    let r = admin(&s, "PUT", "/admin/plugins/template", &template);
    assert_eq!(r.status, 200, "mount template: {}", r.text());
    let b = r.json();
    assert_eq!(b["family"], "template", "{b}");
    assert_eq!(b["mounted"], true, "{b}");
    assert_eq!(b["status"], "ok", "{b}");
    assert_eq!(b["hash"], sha256_hex(&template), "{b}");
    assert_eq!(names(&b["grants"]), set(&[]), "{b}");
    assert_eq!(names(&b["routes"]), set(TEMPLATE_ROUTES), "{b}");

    // The admin list shows it.
    let p = plugin(&s, "template").expect("template in GET /admin/plugins");
    assert_eq!(p["status"], "ok", "{p}");
    assert_eq!(p["hash"], sha256_hex(&template), "{p}");
    assert_eq!(names(&p["grants"]), set(&[]), "{p}");
    assert_eq!(names(&p["reads"]), set(&[]), "{p}");
    assert_eq!(names(&p["routes"]), set(TEMPLATE_ROUTES), "{p}");
    for member in ["component", "version", "loaded_at"] {
        assert!(p[member].is_string(), "{member}: {p}");
    }

    // It serves its routes, in its own keyspace.
    let r = notes(&s);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["count"], 0, "{}", r.text());
    let r = write_note(&s, "first note");
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["count"], 1, "{}", r.text());
    let r = write_note(&s, "second note");
    assert_eq!((r.status, r.json()["count"].clone()), (201, json!(2)));
    let r = notes(&s);
    assert_eq!(r.status, 200);
    let b = r.json();
    assert_eq!(b["count"], 2, "{b}");
    assert!(b.to_string().contains("first note"), "{b}");
    // Its validation answers like any family's.
    let r = s.post_json("/api/template/notes", &json!({"note": ""}));
    assert_eq!(r.status, 400, "{}", r.text());

    // The OpenAPI document has its operations, marked with the family.
    let doc = openapi(&s);
    let path = &doc["paths"]["/api/template/notes"];
    assert_eq!(path["get"]["x-family"], "template", "{path}");
    assert_eq!(path["post"]["x-family"], "template", "{path}");
    assert_eq!(doc["paths"]["/api/info"]["get"]["x-family"], "info");
    // Health is the host's own route: no family.
    let health_op = &doc["paths"]["/api/health"]["get"];
    assert!(
        health_op.is_object() && health_op.get("x-family").is_none(),
        "{health_op}"
    );

    // Health shows it with its (empty) grants, and the built-in grants.
    let h = health(&s);
    let t = &h["plugins"]["template"];
    assert_eq!(t["status"], "ok", "{h}");
    assert_eq!(names(&t["grants"]), set(&[]), "{h}");
    let c = &h["plugins"]["contracts"];
    assert_eq!(
        names(&c["grants"]),
        set(&["payments", "signatures", "escrow", "arbiter"]),
        "{h}"
    );
    assert_eq!(names(&c["reads"]), set(&["timeline", "identity"]), "{h}");
    assert_eq!(
        names(&h["plugins"]["info"]["grants"]),
        set(&["host-info", "payments"]),
        "{h}"
    );
    assert_eq!(
        names(&h["plugins"]["mcp"]["grants"]),
        set(&["dispatch", "host-info", "limits", "signatures"]),
        "{h}"
    );
    assert_eq!(names(&h["plugins"]["search"]["grants"]), set(&[]), "{h}");

    // Uploading it again swaps (not a new mount) and keeps the data.
    let r = admin(&s, "PUT", "/admin/plugins/template", &template);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["mounted"], false, "{}", r.text());
    assert_eq!(notes(&s).json()["count"], 2);

    // Unmount: its routes are gone, everywhere.
    let r = admin(&s, "DELETE", "/admin/plugins/template", b"");
    assert_eq!(r.status, 200, "unmount: {}", r.text());
    assert_eq!(r.json(), json!({"family": "template", "unmounted": true}));
    for r in [notes(&s), write_note(&s, "after unmount")] {
        assert_eq!(
            (r.status, r.code().as_str()),
            (404, "not_found"),
            "{}",
            r.text()
        );
    }
    assert!(plugin(&s, "template").is_none());
    let doc = openapi(&s);
    assert!(
        doc["paths"].get("/api/template/notes").is_none(),
        "unmounted routes stay in the OpenAPI document: {}",
        doc["paths"]["/api/template/notes"]
    );
    assert!(doc["paths"]["/api/health"]["get"].is_object());
    assert!(health(&s)["plugins"].get("template").is_none());

    // Unmounting again, or a family that never was: 404. The fee policy
    // cannot be unmounted.
    let r = admin(&s, "DELETE", "/admin/plugins/template", b"");
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    let r = admin(&s, "DELETE", "/admin/plugins/nosuchfamily", b"");
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    let r = admin(&s, "DELETE", "/admin/plugins/fees", b"");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(s.get("/api/fees").status, 200);

    // Mounted again, it finds its old data.
    let r = admin(&s, "PUT", "/admin/plugins/template", &template);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["mounted"], true, "{}", r.text());
    let r = notes(&s);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["count"],
        2,
        "the family's data stays: {}",
        r.text()
    );
}

#[test]
fn a_built_in_family_can_be_unmounted_and_mounted_again() {
    let s = Server::start();
    let d = deal(&s);
    let r = s.get(&format!("/api/posts/{}", d.post));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = admin(&s, "DELETE", "/admin/plugins/timeline", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    // A built-in family's routes going away is a warning in the log.
    s.wait_log("the built-in unmount's warning", |log| {
        log.lines().any(|l| {
            l.contains("WARN") && l.contains("built-in family unmounted") && l.contains("timeline")
        })
    });
    // Health lists it as the operator left it (not a failure: still ok),
    // and so does the admin listing.
    let h = health(&s);
    assert_eq!(h["status"], "ok", "{h}");
    assert_eq!(h["plugins"]["timeline"]["status"], "unmounted", "{h}");
    assert_eq!(
        plugin(&s, "timeline").map(|p| p["status"].clone()),
        Some(json!("unmounted"))
    );
    let r = s.get(&format!("/api/posts/{}", d.post));
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    assert!(
        openapi(&s)["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|item| item.as_object().unwrap().values())
            .all(|op| op["x-family"] != "timeline")
    );
    // Mounted again (with its built-in grants given explicitly), the post
    // is still there.
    let r = admin(
        &s,
        "PUT",
        "/admin/plugins/timeline?grants=payments,signatures&read=identity",
        &wasm("timeline.wasm"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["mounted"], true, "{}", r.text());
    let r = s.get(&format!("/api/posts/{}", d.post));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_swap_that_drops_routes_says_which_in_the_log() {
    // Another family's component under contracts' name: accepted (its
    // routes conflict with no one), but the answer and the log name every
    // route of the old version that now answers 404.
    let s = Server::start();
    let r = admin(
        &s,
        "PUT",
        "/admin/plugins/contracts",
        &wasm("template.wasm"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let dropped = r.json()["dropped_routes"].clone();
    assert!(
        dropped
            .as_array()
            .is_some_and(|d| d.contains(&json!("POST /api/arbitration/contracts/buy"))),
        "{}",
        r.text()
    );
    s.wait_log("the dropped routes' warning", |log| {
        log.lines().any(|l| {
            l.contains("WARN")
                && l.contains("these now answer 404")
                && l.contains("POST /api/arbitration/contracts/buy")
        })
    });
    // A swap to the same routes says nothing of the kind.
    let r = admin(
        &s,
        "PUT",
        "/admin/plugins/fees",
        &wasm("fees_pickup_paid.wasm"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["dropped_routes"], json!([]), "{}", r.text());
    let log = s.log_text();
    assert_eq!(log.matches("these now answer 404").count(), 1, "{log}");
    // The listing names the policy by the component's own name, which the
    // component file's name does not tell.
    let fees = plugin(&s, "fees").expect("fees listed");
    assert_eq!(fees["name"], "fees-pickup-paid", "{fees}");
    assert_eq!(r.json()["name"], "fees-pickup-paid", "{}", r.text());
}

#[test]
fn a_route_conflict_is_refused_and_the_mounted_family_keeps_serving() {
    let s = Server::start();
    let template = wasm("template.wasm");
    let r = admin(&s, "PUT", "/admin/plugins/template", &template);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(write_note(&s, "kept").status, 201);

    // The same routes under another family name: refused, naming template.
    let r = admin(&s, "PUT", "/admin/plugins/other", &template);
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
    let msg = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("component refused: "), "{msg}");
    assert!(msg.contains("conflict"), "{msg}");
    assert!(msg.contains("template"), "names the other family: {msg}");
    assert!(
        plugin(&s, "other").is_none(),
        "a refused family is not listed"
    );
    assert!(health(&s)["plugins"].get("other").is_none());

    // Routes of a built-in family (granted what it imports): refused,
    // naming it.
    let r = admin(
        &s,
        "PUT",
        "/admin/plugins/other?grants=host-info,payments",
        &wasm("info.wasm"),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let msg = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("conflict") && msg.contains("info"), "{msg}");
    assert_eq!(s.get("/api/health").status, 200);

    // Bad bytes: refused, for a new family and for the mounted one.
    for family in ["junk", "template"] {
        let r = admin(
            &s,
            "PUT",
            &format!("/admin/plugins/{family}"),
            b"\0asm not a component",
        );
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{family}: {}",
            r.text()
        );
        assert!(
            r.json()["message"]
                .as_str()
                .unwrap_or_default()
                .contains("component refused: "),
            "{}",
            r.text()
        );
    }
    assert!(plugin(&s, "junk").is_none());
    // A bad family name.
    let r = admin(&s, "PUT", "/admin/plugins/Bad%20Name", &template);
    assert_eq!(r.status, 400, "{}", r.text());

    // The template family keeps serving, with its data, in the document.
    let r = notes(&s);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["count"], 1);
    assert_eq!(write_note(&s, "still here").json()["count"], 2);
    let p = plugin(&s, "template").unwrap();
    assert_eq!(
        (p["status"].clone(), p["hash"].clone()),
        (json!("ok"), json!(sha256_hex(&template)))
    );
    assert_eq!(
        openapi(&s)["paths"]["/api/template/notes"]["get"]["x-family"],
        "template"
    );

    // Once template is unmounted, the other name may have the routes.
    assert_eq!(
        admin(&s, "DELETE", "/admin/plugins/template", b"").status,
        200
    );
    let r = admin(&s, "PUT", "/admin/plugins/other", &template);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        openapi(&s)["paths"]["/api/template/notes"]["post"]["x-family"],
        "other"
    );
    // Its own keyspace: not template's notes.
    assert_eq!(notes(&s).json()["count"], 0);
}

#[test]
fn perf_map_names_each_components_functions_for_profilers() {
    // Off by default: a server writes no perf map.
    let plain = Server::start();
    let plain_map = PathBuf::from(format!("/tmp/perf-{}.map", plain.pid()));
    assert_eq!(plain.get("/api/search?term=x").status, 200);
    assert!(
        !plain_map.exists(),
        "{} without perf_map",
        plain_map.display()
    );
    drop(plain);

    let s = Server::with(Options {
        env: vec![("MARKETPLACE_PERF_MAP".into(), "true".into())],
        ..Options::default()
    });
    let map = PathBuf::from(format!("/tmp/perf-{}.map", s.pid()));
    assert_eq!(s.get("/api/search?term=x").status, 200);
    let text = std::fs::read_to_string(&map).unwrap_or_default();
    let _ = std::fs::remove_file(&map);
    // perf's format: `0x<start> <size> <name>` (hex), a line per function.
    let hex = |v: &str| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok();
    let named = |needle: &str| {
        text.lines().any(|l| {
            let mut f = l.splitn(3, ' ');
            let (start, size, name) = (f.next(), f.next(), f.next().unwrap_or(""));
            start.and_then(hex).is_some_and(|a| a > 0)
                && size.and_then(hex).is_some_and(|n| n > 0)
                && name.contains(needle)
        })
    };
    // Every component's exported handler, and the search plugin's own code.
    assert!(
        named("marketplace:plugin/handler@"),
        "no handler export in {} ({} bytes)",
        map.display(),
        text.len()
    );
    assert!(named("6search6search"), "no search::search in the perf map");
}

#[test]
fn the_admin_view_lists_imports_and_the_lean_plugins_import_no_wasi() {
    // The repository's plugins are built for wasm32-unknown-unknown (the
    // lean build, `.cargo/config.toml`): no C library, so their components
    // import only marketplace interfaces and each request's instance links
    // nothing else. mcp is a std build for wasm32-wasip2 and imports WASI.
    let s = Server::start();
    let imports = |family: &str| -> BTreeSet<String> {
        let p = plugin(&s, family).unwrap_or_else(|| panic!("{family} is mounted"));
        assert_eq!(p["status"], "ok", "{p}");
        names(&p["imports"])
    };
    for family in [
        "info",
        "identity",
        "timeline",
        "search",
        "contracts",
        "fees",
    ] {
        let imports = imports(family);
        assert!(
            imports
                .iter()
                .any(|i| i.starts_with("marketplace:plugin/types@")),
            "{family}: {imports:?}"
        );
        let foreign: Vec<&String> = imports
            .iter()
            .filter(|i| !i.starts_with("marketplace:plugin/"))
            .collect();
        assert!(
            foreign.is_empty(),
            "{family} imports {foreign:?}: is it built for wasm32-unknown-unknown?"
        );
    }
    let timeline = imports("timeline");
    for granted in ["payments", "auth"] {
        assert!(
            timeline
                .iter()
                .any(|i| i.starts_with(&format!("marketplace:plugin/{granted}@"))),
            "{timeline:?}"
        );
    }
    assert!(
        imports("mcp").iter().any(|i| i.starts_with("wasi:")),
        "mcp is a wasm32-wasip2 build"
    );
}

#[test]
fn capabilities_are_checked_when_a_family_is_mounted() {
    // No testing routes: the testing component is just some third-party
    // component here, mounted as the family `rogue`.
    let s = Server::start();
    let testing = wasm("testing.wasm");
    let imported = imported_capabilities(&testing);
    assert!(
        imported.contains("escrow")
            && imported.contains("payments")
            && imported.contains("dispatch"),
        "the testing component imports escrow, payments and dispatch: {imported:?}"
    );
    assert_eq!(s.get("/_testing/ok").status, 404);

    // No grants: refused, naming the family and every missing capability.
    let r = admin(&s, "PUT", "/admin/plugins/rogue", &testing);
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
    let msg = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("component refused: "), "{msg}");
    assert!(msg.contains("family rogue"), "{msg}");
    for cap in &imported {
        assert!(msg.contains(cap.as_str()), "names {cap}: {msg}");
    }
    for cap in ALL_GRANTS.iter().filter(|c| !imported.contains(**c)) {
        assert!(!msg.contains(cap), "names {cap}, not imported: {msg}");
    }
    assert!(plugin(&s, "rogue").is_none());
    assert_eq!(s.get("/_testing/ok").status, 404);

    // Everything but escrow: refused, naming escrow only.
    let r = admin(
        &s,
        "PUT",
        "/admin/plugins/rogue?grants=payments,signatures,host-info,limits,dispatch",
        &testing,
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
    let msg = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("family rogue"), "{msg}");
    assert!(msg.contains("escrow"), "{msg}");
    // What is missing names only what is not granted; the hint that
    // follows grants all the component needs (a grant given anew replaces
    // the family's).
    let (missing, hint) = msg.split_once(" (grant with ").unwrap_or((&msg, ""));
    for cap in ["payments", "signatures", "host-info", "limits", "dispatch"] {
        assert!(
            !missing.contains(cap),
            "names {cap}, which is granted: {msg}"
        );
    }
    assert!(
        hint.contains("--grants ") && hint.contains("escrow"),
        "{msg}"
    );
    assert!(plugin(&s, "rogue").is_none());

    // An unknown capability name is refused.
    let r = admin(&s, "PUT", "/admin/plugins/rogue?grants=money", &testing);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(plugin(&s, "rogue").is_none());

    // Granted everything, it mounts and serves.
    let r = admin(
        &s,
        "PUT",
        &format!("/admin/plugins/rogue?grants={}", ALL_GRANTS.join(",")),
        &testing,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let b = r.json();
    assert_eq!(b["mounted"], true, "{b}");
    assert_eq!(names(&b["grants"]), set(ALL_GRANTS), "{b}");
    let r = s.get("/_testing/ok");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"ok": true}));
    assert_eq!(
        openapi(&s)["paths"]["/_testing/ok"]["get"]["x-family"],
        "rogue"
    );
    let h = health(&s);
    assert_eq!(
        names(&h["plugins"]["rogue"]["grants"]),
        set(ALL_GRANTS),
        "{h}"
    );
    assert_eq!(
        names(&plugin(&s, "rogue").unwrap()["grants"]),
        set(ALL_GRANTS)
    );

    // Swapping it with fewer grants than it imports is refused and the
    // mounted one keeps serving.
    let r = admin(&s, "PUT", "/admin/plugins/rogue?grants=payments", &testing);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("escrow"), "{}", r.text());
    assert_eq!(s.get("/_testing/ok").status, 200);
    assert_eq!(
        names(&health(&s)["plugins"]["rogue"]["grants"]),
        set(ALL_GRANTS)
    );
}

#[test]
fn the_clients_credentials_reach_only_a_family_granted_them() {
    let sent = [
        ("authorization", "Bearer a-token"),
        ("proxy-authorization", "Basic cHJveHk6cHc="),
        ("cookie", "session=abc"),
        ("x-cash-secret", "e1:secret:00"),
        ("x-custom", "kept"),
    ];
    let seen = |s: &Server| -> BTreeSet<String> {
        let r = s.request("GET", "/_testing/headers", &sent, None);
        assert_eq!(r.status, 200, "{}", r.text());
        names(&r.json()["headers"])
    };
    // Not granted (the testing family's own grants): other headers only.
    let s = Server::testing();
    let got = seen(&s);
    assert!(got.contains("x-custom"), "{got:?}");
    for withheld in [
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-cash-secret",
    ] {
        assert!(!got.contains(withheld), "{withheld} reached it: {got:?}");
    }
    drop(s);

    // Granted `credentials`: they reach it; payment secrets never do.
    let config = format!("[families.testing]\ngrants = [{}]\n", toml_list(ALL_GRANTS));
    let s = Server::with(common::Options {
        testing_routes: true,
        config: Some(config),
        ..Default::default()
    });
    let got = seen(&s);
    for reached in ["authorization", "proxy-authorization", "cookie", "x-custom"] {
        assert!(got.contains(reached), "{reached} withheld: {got:?}");
    }
    assert!(!got.contains("x-cash-secret"), "{got:?}");
}

#[test]
fn a_rogue_family_cannot_pay_out_of_another_familys_escrow() {
    let s = Server::start();
    let d = deal(&s);
    let id = buy(&s, &d, "1");
    let refundable = buy(&s, &d, "1");
    let r = admin(
        &s,
        "PUT",
        &format!("/admin/plugins/rogue?grants={}", ALL_GRANTS.join(",")),
        &wasm("testing.wasm"),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    // The rogue family's own account of that contract id holds nothing.
    let r = s.get(&format!("/_testing/held?contract={id}"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"held": 0}));

    // Asking for the contract's money (held by the contracts family) is
    // refused, whatever the kind or amount.
    for (kind, amount) in [
        ("payout", 100_000_000u64),
        ("payout", 97_000_000),
        ("payout", 1),
        ("refund", 100_000_000),
        ("refund", 1),
    ] {
        for contract in [&id, &refundable] {
            let r = s.request(
                "POST",
                &format!("/_testing/payout?contract={contract}&kind={kind}&amount={amount}"),
                &[],
                Some(b""),
            );
            assert_eq!(
                (r.status, r.code().as_str()),
                (409, "conflict"),
                "rogue {kind} of {amount} from {contract}: {}",
                r.text()
            );
            assert!(!r.text().contains(":secret:"), "{}", r.text());
        }
    }
    let r = s.get(&format!("/_testing/held?contract={id}"));
    assert_eq!(r.json(), json!({"held": 0}));

    // Nothing moved: the contract pays its seller in full (amount - fee),
    // and the other one refunds the whole amount to its buyer.
    act_ok(&s, &d.seller, &id, "accept");
    act_ok(&s, &d.seller, &id, "deliver");
    let cert = act_ok(&s, &d.buyer, &id, "pickup");
    assert_eq!(cert["status"], "settled", "{cert}");
    let payout = act_ok(&s, &d.seller, &id, "pickup")["payout"]
        .as_str()
        .expect("a payout")
        .to_string();
    assert!(payout.starts_with("e0.97:secret:"), "{payout}");
    assert_eq!(s.cash_state(&payout), (json!(false), json!("0.97")));

    act_ok(&s, &d.buyer, &refundable, "refund");
    let refund = act_ok(&s, &d.buyer, &refundable, "pickup")["refund"]
        .as_str()
        .expect("a refund")
        .to_string();
    assert!(refund.starts_with("e1:secret:"), "{refund}");
    assert_eq!(s.cash_state(&refund), (json!(false), json!("1")));

    // And after settlement the rogue still gets nothing.
    let r = s.request(
        "POST",
        &format!("/_testing/payout?contract={id}&kind=payout&amount=1"),
        &[],
        Some(b""),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "conflict"),
        "{}",
        r.text()
    );
}

#[test]
fn a_family_named_in_the_config_is_mounted_at_start() {
    let config = format!(
        "[families.notes]\ncomponent = \"template.wasm\"\n\n\
         [families.rogue]\ncomponent = \"testing.wasm\"\ngrants = [{}]\nread = [\"timeline\"]\n",
        toml_list(ALL_GRANTS)
    );
    let s = Server::with(common::Options {
        config: Some(config),
        ..Default::default()
    });

    // `notes` serves the template's routes, with no grants.
    let r = write_note(&s, "from config");
    assert_eq!(r.status, 201, "{}", r.text());
    let r = notes(&s);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["count"], 1);
    let p = plugin(&s, "notes").expect("notes in GET /admin/plugins");
    assert_eq!(p["status"], "ok", "{p}");
    assert_eq!(p["component"], "template.wasm", "{p}");
    assert_eq!(names(&p["grants"]), set(&[]), "{p}");
    assert_eq!(names(&p["routes"]), set(TEMPLATE_ROUTES), "{p}");
    assert_eq!(
        openapi(&s)["paths"]["/api/template/notes"]["get"]["x-family"],
        "notes"
    );
    let h = health(&s);
    assert_eq!(h["plugins"]["notes"]["status"], "ok", "{h}");
    assert_eq!(names(&h["plugins"]["notes"]["grants"]), set(&[]), "{h}");

    // `rogue` got the configured grants and reads.
    assert_eq!(s.get("/_testing/ok").status, 200);
    assert_eq!(
        names(&h["plugins"]["rogue"]["grants"]),
        set(ALL_GRANTS),
        "{h}"
    );
    assert_eq!(
        names(&h["plugins"]["rogue"]["reads"]),
        set(&["timeline"]),
        "{h}"
    );
    let p = plugin(&s, "rogue").expect("rogue in GET /admin/plugins");
    assert_eq!(names(&p["grants"]), set(ALL_GRANTS), "{p}");
    assert_eq!(names(&p["reads"]), set(&["timeline"]), "{p}");

    // A config family unmounts like any other.
    let r = admin(&s, "DELETE", "/admin/plugins/notes", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(notes(&s).status, 404);
}

#[test]
fn the_watched_families_directory_mounts_swaps_and_unmounts() {
    let (_plugins_dir, s, families) = watching_families();
    let file = families.join("jotter.wasm");
    let template = wasm("template.wasm");
    assert_eq!(notes(&s).status, 404);

    // Dropping a component in mounts its family.
    install(&template, &file);
    eventually("families/jotter.wasm is mounted", &s, || {
        notes(&s).status == 200
    });
    let p = plugin(&s, "jotter").expect("jotter in GET /admin/plugins");
    assert_eq!(p["status"], "ok", "{p}");
    assert_eq!(p["hash"], sha256_hex(&template), "{p}");
    assert_eq!(names(&p["grants"]), set(&[]), "{p}");
    assert_eq!(names(&p["routes"]), set(TEMPLATE_ROUTES), "{p}");
    assert_eq!(
        openapi(&s)["paths"]["/api/template/notes"]["post"]["x-family"],
        "jotter"
    );
    assert_eq!(health(&s)["plugins"]["jotter"]["status"], "ok");
    let r = write_note(&s, "jotted");
    assert_eq!(r.status, 201, "{}", r.text());

    // Replacing the file swaps the component; the data stays.
    let changed = with_custom_section(&template, "families-test", b"v2");
    assert_ne!(sha256_hex(&changed), sha256_hex(&template));
    install(&changed, &file);
    eventually("families/jotter.wasm is swapped", &s, || {
        plugin(&s, "jotter").is_some_and(|p| p["hash"] == sha256_hex(&changed))
    });
    let r = notes(&s);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["count"], 1, "{}", r.text());

    // A broken file is refused and the mounted one keeps serving.
    install(b"not a component", &file);
    eventually("the broken file is refused", &s, || {
        s.log_text()
            .lines()
            .any(|l| l.contains("jotter") && l.contains("refused"))
    });
    assert_eq!(notes(&s).status, 200);
    assert_eq!(
        plugin(&s, "jotter").map(|p| p["hash"].clone()),
        Some(json!(sha256_hex(&changed)))
    );
    // The admin view says so beside the family that kept serving (nobody
    // got an answer to a file dropped into a directory), and so does the
    // CLI, on stderr.
    let p = plugin(&s, "jotter").unwrap();
    assert_eq!(p["status"], "ok", "{p}");
    assert_eq!(p["refused"]["file"], "families/jotter.wasm", "{p}");
    assert_eq!(p["refused"]["hash"], sha256_hex(b"not a component"), "{p}");
    assert!(!p["refused"]["error"].as_str().unwrap().is_empty(), "{p}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marketplace"))
        .args(["plugins", "list", "--admin", &format!("http://{}", s.admin)])
        .env("MARKETPLACE_ADMIN_TOKEN", common::ADMIN_TOKEN)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: families/jotter.wasm was not loaded"),
        "{stderr}"
    );
    // The file back as it serves: the refusal is history.
    install(&changed, &file);
    eventually("the restored file is seen", &s, || {
        plugin(&s, "jotter").is_some_and(|p| p.get("refused").is_none())
    });

    // Removing the file unmounts the family.
    std::fs::remove_file(&file).unwrap();
    eventually("jotter is unmounted", &s, || notes(&s).status == 404);
    assert_eq!(notes(&s).code(), "not_found");
    // Counted as the admin API's unmounts are (the count follows the
    // route table's change by a moment: its log line follows the count).
    eventually("the unmount is logged", &s, || {
        s.log_text()
            .contains("component file removed: family unmounted")
    });
    assert_eq!(
        s.metric(r#"marketplace_plugin_swaps_total{family="jotter",result="unmounted"}"#),
        1
    );
    assert!(plugin(&s, "jotter").is_none());
    assert!(openapi(&s)["paths"].get("/api/template/notes").is_none());
    assert!(health(&s)["plugins"].get("jotter").is_none());

    // Dropping it in again finds the old data.
    install(&template, &file);
    eventually("families/jotter.wasm is mounted again", &s, || {
        notes(&s).status == 200
    });
    assert_eq!(notes(&s).json()["count"], 1);

    // A component that imports capabilities its family was not granted is
    // not mounted from the directory either.
    install(&wasm("testing.wasm"), &families.join("rogue.wasm"));
    eventually("families/rogue.wasm is refused", &s, || {
        s.log_text()
            .lines()
            .any(|l| l.contains("rogue") && l.contains("not granted"))
    });
    // Listed as refused, with why, until its file is gone.
    let rogue = plugin(&s, "rogue").expect("the refused file is listed");
    assert_eq!(rogue["status"], "refused", "{rogue}");
    assert_eq!(rogue["component"], "families/rogue.wasm", "{rogue}");
    assert!(
        rogue["error"].as_str().unwrap().contains("not granted"),
        "{rogue}"
    );
    assert_eq!(rogue["refused"]["error"], rogue["error"], "{rogue}");
    assert!(health(&s)["plugins"].get("rogue").is_none());
    assert_eq!(s.get("/_testing/ok").status, 404);
    std::fs::remove_file(families.join("rogue.wasm")).unwrap();
    eventually("the refusal goes with its file", &s, || {
        plugin(&s, "rogue").is_none()
    });
    // Put back as it was, it is looked at, and refused, again.
    install(&wasm("testing.wasm"), &families.join("rogue.wasm"));
    eventually("the file put back is refused again", &s, || {
        plugin(&s, "rogue").is_some_and(|p| p["status"] == "refused")
    });
}

/// An admin unmount holds for a families-directory family whose file an
/// admin upload replaced first (README: it stays unmounted, its file
/// included, until that file changes). Before, the watcher forgot the file
/// while the upload served, and mounted it again right after the unmount.
#[test]
fn an_unmount_after_an_upload_holds_over_the_familys_file() {
    let (_plugins_dir, s, families) = watching_families();
    let template = wasm("template.wasm");
    install(&template, &families.join("jotter.wasm"));
    eventually("families/jotter.wasm is mounted", &s, || {
        notes(&s).status == 200
    });
    let uploaded = with_custom_section(&template, "upload", b"1");
    // As `marketplace plugins load jotter build/jotter_v1.wasm` sends it.
    let r = admin(
        &s,
        "PUT",
        "/admin/plugins/jotter?component=jotter_v1.wasm",
        &uploaded,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        plugin(&s, "jotter").map(|p| p["hash"].clone()),
        Some(json!(sha256_hex(&uploaded)))
    );
    // A file the watcher reports proves it has looked at the directory
    // (a second one, that it finished that look).
    let looked = |bad: &str| {
        install(&template, &families.join(format!("{bad}.wasm")));
        eventually("the watcher looked again", &s, || {
            s.log_text().contains(&format!("{bad}.wasm not mounted"))
        });
    };
    // The watcher looks while the upload serves...
    looked("Bad_Name_0");
    looked("Bad_Name_1");
    // (A file that can never mount is listed as refused, with why; the
    // family's own file, which the upload serves in place of, is not.)
    let bad = plugin(&s, "Bad_Name_0").expect("listed");
    assert_eq!(bad["status"], "refused", "{bad}");
    assert!(
        bad["error"].as_str().unwrap().contains("not a family name"),
        "{bad}"
    );
    assert!(plugin(&s, "jotter").unwrap().get("refused").is_none());
    let r = admin(&s, "DELETE", "/admin/plugins/jotter", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(notes(&s).status, 404);
    // ...and after the unmount: jotter's unchanged file stayed unmounted.
    looked("Bad_Name_2");
    looked("Bad_Name_3");
    assert_eq!(notes(&s).status, 404, "{}", s.log_text());
    // Listed as what the operator decided: its file there, serving nothing.
    let listed = plugin(&s, "jotter").expect("an unmounted family of the directory is listed");
    assert_eq!(listed["status"], "unmounted", "{listed}");
    assert_eq!(listed["component"], "families/jotter.wasm", "{listed}");
    // A changed file mounts it again.
    install(
        &with_custom_section(&template, "deploy", b"2"),
        &families.join("jotter.wasm"),
    );
    eventually("the changed file mounts", &s, || notes(&s).status == 200);
}

/// A families-directory file that changes (or appears) after an admin
/// upload of its family serves, as a configured family's changed file
/// does and as a restart would decide: with the grants a start gives it,
/// the kept upload dropped (on one host). The file the upload was made
/// over, removed and put back, is no change. An admin unmount after it
/// holds until the file changes again. Before, the running host ignored
/// the changed file, and mounted it right after the admin unmounted the
/// family.
#[test]
fn a_families_file_changed_after_an_upload_serves() {
    let (plugins_dir, s, families) = watching_families();
    let file = families.join("jotter.wasm");
    let template = wasm("template.wasm");
    let upload = |bytes: &[u8]| {
        let r = admin(
            &s,
            "PUT",
            "/admin/plugins/jotter?component=jotter_v1.wasm&grants=payments",
            bytes,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let p = plugin(&s, "jotter").unwrap();
        assert_eq!(p["hash"], sha256_hex(bytes), "{p}");
        assert_eq!(names(&p["grants"]), set(&["payments"]), "{p}");
    };
    let serves_file = |what: &str, bytes: &[u8]| {
        // (By its component too: an upload of the same bytes serves them.)
        eventually(what, &s, || {
            plugin(&s, "jotter").is_some_and(|p| {
                p["hash"] == sha256_hex(bytes) && p["component"] == "families/jotter.wasm"
            })
        });
        let p = plugin(&s, "jotter").unwrap();
        assert_eq!(p["component"], "families/jotter.wasm", "{p}");
        assert_eq!(names(&p["grants"]), set(&[]), "{p}");
        assert_eq!(notes(&s).status, 200);
    };
    // A misnamed file the watcher reports proves it has looked (a second
    // one, that it finished that look).
    let mut looks = 0;
    let mut look_twice = || {
        for _ in 0..2 {
            let bad = format!("Bad_Name_{looks}");
            looks += 1;
            install(&template, &families.join(format!("{bad}.wasm")));
            eventually("the watcher looked again", &s, || {
                s.log_text().contains(&format!("{bad}.wasm not mounted"))
            });
        }
    };
    // Uploaded first; then a file for it appears.
    let first = with_custom_section(&template, "upload", b"1");
    upload(&first);
    install(&template, &file);
    serves_file("the new file serves", &template);
    if !common::backend_is_postgres() {
        // (On a shared store the fleet's record stays: README "Scale-out".)
        s.wait_log("the kept upload dropped", |log| {
            log.contains("the admin upload kept for restarts is dropped")
        });
    }
    // Uploaded again over that file: the same file removed and put back
    // is no change.
    let second = with_custom_section(&template, "upload", b"2");
    upload(&second);
    std::fs::remove_file(&file).unwrap();
    look_twice();
    // (A broken file meanwhile is refused and listed; the file put back
    // makes that refusal history.)
    install(b"not a component", &file);
    eventually("the broken file is refused", &s, || {
        plugin(&s, "jotter").is_some_and(|p| p["refused"].is_object())
    });
    install(&template, &file);
    look_twice();
    let p = plugin(&s, "jotter").unwrap();
    assert_eq!(p["hash"], sha256_hex(&second), "{}", s.log_text());
    assert!(p.get("refused").is_none(), "{p}");
    // A changed file serves; and so does the file the upload was made
    // over, put back once the upload no longer serves (on a shared store
    // its record stays, but it is not what this host serves).
    let deployed = with_custom_section(&template, "deploy", b"3");
    install(&deployed, &file);
    serves_file("the changed file serves", &deployed);
    install(&template, &file);
    serves_file("the file rolled back serves", &template);
    // Unmounted: it stays so over two looks at the unchanged file.
    let r = admin(&s, "DELETE", "/admin/plugins/jotter", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    look_twice();
    assert_eq!(notes(&s).status, 404, "{}", s.log_text());
    let redeployed = with_custom_section(&template, "deploy", b"4");
    install(&redeployed, &file);
    serves_file("the file changed after the unmount serves", &redeployed);
    // An upload, then the file given the upload's own bytes: a changed
    // file, which serves (as a restart would decide: the configuration's
    // grants, the kept upload dropped), so the file the upload was made
    // over, put back, serves too. (The same bytes were taken for no
    // change: the upload stood, and the file put back was "the file it
    // was made over", so the operator could not go back.)
    let third = with_custom_section(&template, "upload", b"6");
    upload(&third);
    install(&third, &file);
    if common::backend_is_postgres() {
        // On a shared store the fleet's upload stays, with its grants (no
        // swap): the file is no change of what serves.
        look_twice();
        let p = plugin(&s, "jotter").unwrap();
        assert_eq!(p["component"], "jotter_v1.wasm", "{p}");
        assert_eq!(names(&p["grants"]), set(&["payments"]), "{p}");
    } else {
        serves_file("the file of the upload's bytes serves", &third);
        install(&redeployed, &file);
        serves_file("the file the upload was made over serves", &redeployed);
    }

    // A built-in family an admin unmounted: its changed file mounts it
    // again with the grants a start gives it (it was refused before, for
    // want of them).
    let r = admin(&s, "DELETE", "/admin/plugins/identity", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let identity = with_custom_section(&wasm("identity.wasm"), "deploy", b"5");
    install(&identity, &plugins_dir.path().join("identity.wasm"));
    eventually("the changed identity file mounts", &s, || {
        plugin(&s, "identity").is_some_and(|p| p["hash"] == sha256_hex(&identity))
    });
    let p = plugin(&s, "identity").unwrap();
    assert_eq!(p["status"], "ok", "{p}");
    assert_eq!(names(&p["grants"]), set(&["payments", "signatures"]), "{p}");
    assert_eq!(names(&p["reads"]), set(&["contracts", "timeline"]), "{p}");
}

/// A restart serves what the operator decided last, between the admin API
/// and the plugins directory: an admin unmount of a families-directory
/// family stays unmounted (until its file changes), and a component file
/// changed after an admin upload (while the host ran, or while it was
/// down) serves (the upload kept for restarts is dropped; on a shared
/// store the fleet's upload stays). Before, the old
/// upload came back and the unmounted family was mounted again by the
/// watcher.
#[test]
fn a_restart_serves_what_was_decided_last() {
    let plugins_dir = plugin_copy();
    let data = tempfile::tempdir().unwrap();
    let start = || {
        Server::with(common::Options {
            plugins_dir: Some(plugins_dir.path().to_path_buf()),
            data_dir: Some(data.path().join("data")),
            ..Default::default()
        })
    };
    let families = plugins_dir.path().join("families");
    std::fs::create_dir_all(&families).unwrap();
    let file = families.join("jotter.wasm");
    let template = wasm("template.wasm");
    install(&template, &file);
    let policy = |s: &Server| s.get("/api/fees").json()["arbitration"]["policy"].clone();
    let upload_pickup_paid = |s: &Server| {
        let r = common::deal::admin(
            s,
            "PUT",
            "/admin/plugins/fees",
            &wasm("fees_pickup_paid.wasm"),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(policy(s), "pickup-paid");
    };

    let mut s = start();
    // Mounted before the host said it was ready.
    assert_eq!(notes(&s).status, 200, "{}", s.log_text());
    assert_eq!(write_note(&s, "kept").status, 201);
    let r = common::deal::admin(&s, "DELETE", "/admin/plugins/jotter", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(notes(&s).status, 404);
    upload_pickup_paid(&s);
    // Then a deploy changes the configured fee component's file.
    let bid = with_custom_section(&wasm("fees_bid_inclusive.wasm"), "deploy", b"2");
    install(&bid, &plugins_dir.path().join("fees_bid_inclusive.wasm"));
    eventually("the changed file swaps in", &s, || {
        policy(&s) == "bid-inclusive"
    });
    s.stop();

    let mut s = start();
    // On a shared store the fleet's record decides over one host's
    // directory (README "Scale-out"): the upload stays.
    let decided = if common::backend_is_postgres() {
        "pickup-paid"
    } else {
        "bid-inclusive"
    };
    assert_eq!(policy(&s), decided, "{}", s.log_text());
    assert_eq!(notes(&s).status, 404, "the unmounted family came back");
    assert_eq!(
        plugin(&s, "jotter").map(|p| p["status"].clone()),
        Some(json!("unmounted"))
    );
    // Its file is there and serves nothing: said so.
    assert!(
        s.log_text()
            .lines()
            .any(|l| l.contains("jotter.wasm not mounted")
                && l.contains("unmounted through the admin API")),
        "{}",
        s.log_text()
    );
    // A new file mounts it again, with its data, and that holds.
    install(&with_custom_section(&template, "deploy", b"2"), &file);
    eventually("the changed file mounts", &s, || notes(&s).status == 200);
    assert_eq!(notes(&s).json()["count"], 1);
    s.stop();
    let mut s = start();
    // (On a shared store the fleet's unmount decides again at start.)
    let kept = if common::backend_is_postgres() {
        404
    } else {
        200
    };
    assert_eq!(notes(&s).status, kept, "{}", s.log_text());
    // A file the directory does not mount is said so in the log.
    install(&template, &families.join("Bad_Name.wasm"));
    eventually("the ignored file is logged", &s, || {
        s.log_text().contains("Bad_Name.wasm not mounted")
    });

    // While the host is down, a deploy writes the fee component's file
    // again: with the same bytes, the upload made before stays; with other
    // bytes, the file serves (one host; on a shared store the fleet's
    // upload stays).
    upload_pickup_paid(&s);
    s.stop();
    let fee_file = plugins_dir.path().join("fees_bid_inclusive.wasm");
    install(&std::fs::read(&fee_file).unwrap(), &fee_file);
    let mut s = start();
    assert_eq!(policy(&s), "pickup-paid", "{}", s.log_text());
    s.stop();
    install(&with_custom_section(&bid, "deploy", b"3"), &fee_file);
    let s = start();
    assert_eq!(policy(&s), decided, "{}", s.log_text());
    // An upgrade deploys every file anew, and so ends a policy swapped in
    // through the admin API: the start warns, naming what is dropped.
    if !common::backend_is_postgres() {
        assert!(
            s.log_text().lines().any(|l| l.contains("WARN")
                && l.contains("the upload fees-")
                && l.contains("is dropped")),
            "{}",
            s.log_text()
        );
    }
}

/// At start the built-in families mount before any other (README
/// "Start"), so a family uploaded through the admin API that declares a
/// built-in's path is refused at a restart too, as it would be while the
/// host runs. Before, the kept uploads mounted first and took the paths,
/// and the built-in family was the one refused.
#[test]
fn at_a_restart_a_built_in_family_keeps_its_paths() {
    let data = tempfile::tempdir().unwrap();
    let start = |testing_routes, config: Option<&str>| {
        Server::with(Options {
            testing_routes,
            data_dir: Some(data.path().join("data")),
            config: config.map(String::from),
            ..Default::default()
        })
    };
    // Testing routes off: the testing component mounts as `rogue`, whose
    // paths then no built-in family declares.
    let mut s = start(false, None);
    let r = admin(
        &s,
        "PUT",
        &format!("/admin/plugins/rogue?grants={}", ALL_GRANTS.join(",")),
        &wasm("testing.wasm"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.get("/_testing/ok").status, 200);
    s.stop();

    // Testing routes on: the built-in `testing` family declares them, and
    // it is the one that serves; the kept upload is refused, and said so.
    // Its settings are still its family's (no line calls them a typo);
    // a table for no family at all still is one.
    let s = start(
        true,
        Some("[settings.rogue]\nanything = 1\n[settings.nobody]\nanything = 1\n"),
    );
    let h = health(&s);
    assert_eq!(h["status"], "ok", "{h}\n{}", s.log_text());
    assert_eq!(h["plugins"]["testing"]["status"], "ok", "{h}");
    assert!(plugin(&s, "rogue").is_none(), "{}", s.log_text());
    let log = s.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("kept upload refused") && l.contains("rogue")),
        "{log}"
    );
    assert!(!log.contains("[settings.rogue] is for no family"), "{log}");
    assert!(log.contains("[settings.nobody] is for no family"), "{log}");
    assert_eq!(s.get("/_testing/ok").status, 200);
}

/// Uploads of one family at once are applied and kept one after the
/// other: the component kept for restarts is the one serving. Before, the
/// component and its record were written through one temp file, so the
/// kept `fees.wasm` could hold the record (refused at the next start,
/// which then served neither upload) or another upload than the one
/// serving. On a shared store, the host's poll of the fleet's records
/// could read one of its own just written, take it for another host's and
/// serve it again over the uploads after it (until its next poll; a
/// restart then served another than the one seen serving).
#[test]
fn uploads_of_one_family_at_once_keep_the_one_that_serves() {
    let data = tempfile::tempdir().unwrap();
    let start = || {
        Server::with(Options {
            data_dir: Some(data.path().join("data")),
            ..Default::default()
        })
    };
    let mut s = start();
    let base = wasm("fees_pickup_paid.wasm");
    let variants: Vec<Vec<u8>> = (0..8)
        .map(|i| with_custom_section(&base, "upload", format!("{i}").as_bytes()))
        .collect();
    std::thread::scope(|scope| {
        for v in &variants {
            let s = &s;
            scope.spawn(move || {
                let r = admin(s, "PUT", "/admin/plugins/fees", v);
                assert_eq!(r.status, 200, "{}", r.text());
            });
        }
    });
    let serving = plugin(&s, "fees").unwrap()["hash"]
        .as_str()
        .unwrap()
        .to_string();
    let sha = |b: &[u8]| {
        use sha2::Digest;
        marketplace_common::hex::encode(&sha2::Sha256::digest(b))
    };
    assert!(
        variants.iter().any(|v| sha(v) == serving),
        "serving {serving}, none of the uploads"
    );
    if common::backend_is_postgres() {
        // The host polls the fleet's records every 100 ms: none of its own
        // uploads is taken for another host's and served again.
        std::thread::sleep(std::time::Duration::from_millis(400));
        assert_eq!(
            plugin(&s, "fees").unwrap()["hash"],
            serving.as_str(),
            "{}",
            s.log_text()
        );
    } else {
        let kept = std::fs::read(data.path().join("data/uploads/fees.wasm")).unwrap();
        assert_eq!(
            sha(&kept),
            serving,
            "the kept upload is not the one serving"
        );
    }
    assert!(
        !s.log_text().contains("was not kept for restarts"),
        "{}",
        s.log_text()
    );
    s.stop();
    let s = start();
    assert_eq!(
        plugin(&s, "fees").unwrap()["hash"],
        serving.as_str(),
        "{}",
        s.log_text()
    );
    assert!(
        !s.log_text().contains("kept upload refused"),
        "{}",
        s.log_text()
    );
}

#[test]
fn the_watched_directory_uses_the_configured_grants() {
    let plugins_dir = plugin_copy();
    let families = plugins_dir.path().join("families");
    std::fs::create_dir_all(&families).unwrap();
    // The config names the family with its grants; its component arrives
    // in the families directory later.
    let config = format!(
        "[families.rogue]\ncomponent = \"families/rogue.wasm\"\ngrants = [{}]\n",
        toml_list(ALL_GRANTS)
    );
    let s = Server::with(common::Options {
        config: Some(config),
        plugins_dir: Some(plugins_dir.path().to_path_buf()),
        ..Default::default()
    });
    assert_eq!(s.get("/_testing/ok").status, 404);
    install(&wasm("testing.wasm"), &families.join("rogue.wasm"));
    eventually("families/rogue.wasm is mounted with its grants", &s, || {
        s.get("/_testing/ok").status == 200
    });
    assert_eq!(
        names(&health(&s)["plugins"]["rogue"]["grants"]),
        set(ALL_GRANTS)
    );
}

/// A `read` naming no family (a typo) reads nothing: said at start, once
/// every family is loaded, and only of that name.
#[test]
fn a_read_naming_no_family_is_logged_at_start() {
    let s = Server::with(Options {
        config: Some(
            "[families.jotter]\ncomponent = \"template.wasm\"\nread = [\"timelin\", \"timeline\"]\n"
                .into(),
        ),
        ..Default::default()
    });
    let warned = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("read names no family"))
            .map(str::to_string)
            .collect()
    };
    s.wait_log("the typo's warning", |log| !warned(log).is_empty());
    let lines = warned(&s.log_text());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("family=jotter"), "{lines:?}");
    assert!(
        lines[0].contains("read=timelin") && !lines[0].contains("read=timeline"),
        "{lines:?}"
    );
}

/// A kept upload is weighed against the file it was uploaded over: a
/// configuration that names another file since (or none, so the family's
/// file is one that does not exist) does not drop it. It used to: the
/// start took the change of configuration for a changed file, dropped the
/// upload and served the configured file, or nothing at all.
#[test]
fn a_kept_upload_survives_a_change_of_configuration() {
    let plugins_dir = plugin_copy();
    let data = tempfile::tempdir().unwrap();
    let template = wasm("template.wasm");
    install(&template, &plugins_dir.path().join("jot.wasm"));
    let start = |config: bool| {
        Server::with(Options {
            plugins_dir: Some(plugins_dir.path().to_path_buf()),
            data_dir: Some(data.path().join("data")),
            config: config.then(|| "[families.jot]\ncomponent = \"jot.wasm\"\n".to_string()),
            ..Default::default()
        })
    };
    let hash = |s: &Server| plugin(s, "jot").map(|p| p["hash"].as_str().unwrap().to_string());
    let mut s = start(true);
    let first = hash(&s).expect("jot mounted from the configuration");
    let upload = with_custom_section(&template, "upload", b"2");
    let r = admin(&s, "PUT", "/admin/plugins/jot", &upload);
    assert_eq!(r.status, 200, "{}", r.text());
    let uploaded = hash(&s).unwrap();
    assert_ne!(uploaded, first);
    s.stop();
    // Started without the configuration entry: the upload serves.
    let mut s = start(false);
    assert_eq!(
        hash(&s).as_deref(),
        Some(uploaded.as_str()),
        "{}",
        s.log_text()
    );
    assert_eq!(notes(&s).status, 200);
    s.stop();
    // And with it again (its file unchanged): still the upload.
    let s = start(true);
    assert_eq!(
        hash(&s).as_deref(),
        Some(uploaded.as_str()),
        "{}",
        s.log_text()
    );
}

/// A component checks the operator's settings of its family at every load
/// (`describe`): a value it cannot use refuses it, naming the setting; a
/// key it does not read is logged, and so is a `[settings.X]` table for no
/// family. A list is given to a component as its items joined by commas.
#[test]
fn settings_are_checked_when_a_component_loads() {
    let s = Server::with(Options {
        config: Some(
            "[settings.fee]\npost = \"0.3\"\n\
             [settings.search]\nwhole_reads = \"5\"\n\
             [settings.contracts]\nanything = 1\n\
             [settings.info]\nanything = 1\n\
             [settings.timeline]\nlegacy_updates = \"nope\"\n\
             [settings.mcp]\nallowed_origins = [\"https://a.example\", \"https://b.example\"]\n"
                .into(),
        ),
        ..Default::default()
    });
    let health = s.get("/api/health");
    assert_eq!(health.status, 503, "{}", health.text());
    let plugins = &health.json()["plugins"];
    assert_eq!(plugins["timeline"]["status"], "unavailable", "{plugins}");
    for family in ["search", "contracts", "mcp", "fees"] {
        assert_eq!(plugins[family]["status"], "ok", "{family}: {plugins}");
    }
    let listed = s.admin_raw("GET", "/admin/plugins", None);
    let timeline = listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["family"] == "timeline")
        .cloned()
        .unwrap();
    let error = timeline["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("setting legacy_updates = \"nope\" must be true or false"),
        "{timeline}"
    );
    let log = s.log_text();
    for line in [
        "[settings.fee] is for no family of this configuration",
        "setting \\\"whole_reads\\\" has no effect: this component reads whole_read",
        "setting \\\"anything\\\" has no effect: this component reads buys_per_day",
        "setting \\\"anything\\\" has no effect: this component reads no setting",
    ] {
        assert!(
            log.contains(line) || log.contains(&line.replace("\\\"", "\"")),
            "{line}: {log}"
        );
    }
    // The list reached the component as `a,b`: both origins are admitted.
    let host = s.addr.to_string();
    for origin in ["https://a.example", "https://b.example"] {
        let r = s.raw_post(
            "/mcp",
            &[
                ("host", host.as_bytes()),
                ("accept", b"application/json, text/event-stream"),
                ("origin", origin.as_bytes()),
            ],
            &json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
        );
        assert_eq!(r.status, 200, "{origin}: {}", r.text());
    }
}

/// A family's OpenAPI is held to what the `mcp` component can render for
/// everyone: examples 60 arrays deep within the family's byte caps (480
/// KiB of them about 32 MB as YAML) used to make `/openapi.yaml` 503 for
/// every client; now
/// that family is refused at load, saying why, and the documents are
/// served. Padding within the caps, as deep, is served in them.
#[test]
fn a_familys_openapi_too_large_to_render_is_refused() {
    let padded = |kib: u32, depth: u32| {
        Server::with(Options {
            testing_routes: true,
            config: Some(format!(
                "[settings.testing]\napi_padding_kib = \"{kib}\"\napi_padding_depth = \"{depth}\"\n"
            )),
            ..Default::default()
        })
    };
    // 30,720 small values, 60 arrays deep: within the family's byte and
    // value caps, past its YAML one.
    let s = padded(60, 60);
    let health = s.get("/api/health").json();
    assert_eq!(
        health["plugins"]["testing"]["status"], "unavailable",
        "{health}"
    );
    let log = s.log_text();
    assert!(
        log.contains("its OpenAPI would be too large to render"),
        "{log}"
    );
    for path in ["/openapi.yaml", "/docs", "/openapi.json"] {
        assert_eq!(s.get(path).status, 200, "{path}");
    }
    drop(s);
    let s = padded(5, 60);
    assert_eq!(s.get("/_testing/ok").status, 200);
    let yaml = s.get("/openapi.yaml");
    assert_eq!(yaml.status, 200, "{}", yaml.text());
    assert!(yaml.text().contains("\"TestingPadding\":"));
    assert_eq!(s.get("/docs").status, 200);
}

/// A fee component is held to what it publishes: a schedule (`GET
/// /api/fees`) that disagrees with its quotes is refused at load, naming
/// the action, since a client paying the published price would be refused.
/// The fees family takes no grants or reads (its world imports neither).
/// A fee component's panic is logged with its message, at load and on a
/// request. Found by a plugin author's walkthrough: the mismatch loaded,
/// the grants were listed, the panics' messages were lost.
#[test]
fn a_fee_component_says_what_it_charges_takes_no_grants_and_logs_its_panics() {
    // A host whose fee settings make the test component misbehave, and
    // its answer to that component's upload.
    let misbehaving = |setting: &str| {
        let s = Server::with(Options {
            config: Some(format!("[settings.fees]\n{setting}\n")),
            ..Default::default()
        });
        let r = admin(&s, "PUT", "/admin/plugins/fees", &wasm("testing_fees.wasm"));
        (s, r)
    };
    let (s, r) = misbehaving(r#"schedule_post = "0.05""#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text()
            .contains(r#"actions.post.price is \"0.05\", but quote(post) charges 0.3"#),
        "{}",
        r.text()
    );
    assert_eq!(
        s.get("/api/fees").json()["plugin"]["name"],
        "fees-bid-inclusive"
    );
    for (query, field) in [("grants=payments", "grants"), ("read=timeline", "read")] {
        let r = admin(
            &s,
            "PUT",
            &format!("/admin/plugins/fees?{query}"),
            &wasm("fees_pickup_paid.wasm"),
        );
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{query}: {}",
            r.text()
        );
        assert_eq!(r.json()["details"][0]["field"], field, "{}", r.text());
        assert!(
            r.text().contains("takes no grants or reads"),
            "{}",
            r.text()
        );
    }
    assert_eq!(
        s.get("/api/fees").json()["arbitration"]["policy"],
        "bid-inclusive"
    );
    // Without them it swaps (and lists none).
    let r = admin(
        &s,
        "PUT",
        "/admin/plugins/fees?grants=&read=",
        &wasm("fees_pickup_paid.wasm"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(names(&r.json()["grants"]), set(&[]), "{}", r.text());
    drop(s);

    // A panic at load: the refusal quotes it.
    let (s, r) = misbehaving(r#"panic_on = "post""#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("deliberate panic quoting post"),
        "{}",
        r.text()
    );
    drop(s);
    // A panic on a request: the buy is a 500, its secret unspent, and the
    // log says why before the host's `plugin trapped` line.
    let (s, r) = misbehaving(r#"panic_on = "arbitration""#);
    assert_eq!(r.status, 200, "{}", r.text());
    let d = deal(&s);
    let secret = s.mint("2");
    let r = s.post_paid(
        "/api/arbitration/contracts/buy",
        &secret,
        &common::deal::buy_body(&d, "2"),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (500, "internal"),
        "{}",
        r.text()
    );
    assert_eq!(s.cash_state(&secret).0, json!(false));
    s.wait_log("the fee component's panic", |log| {
        log.contains("plugin panicked: ") && log.contains("deliberate panic quoting arbitration")
    });
    drop(s);

    // What no policy may price otherwise (outside fee-policy probe: a buy
    // charged other than the contract amount stranded or lost escrow; a fee
    // over the amount let no party settle): refused at load...
    for (setting, rule) in [
        (
            r#"buy_plus = "1""#,
            "a buy moves the contract amount into escrow",
        ),
        (
            r#"arbitration_twice = "true""#,
            "a contract's fee is at most its amount",
        ),
    ] {
        let (s, r) = misbehaving(setting);
        assert_eq!(r.status, 400, "{setting}: {}", r.text());
        assert!(r.text().contains(rule), "{setting}: {}", r.text());
        assert_eq!(
            s.get("/api/fees").json()["plugin"]["name"],
            "fees-bid-inclusive"
        );
    }
    // ...and on the amounts the load did not try: the buy is refused,
    // its secret unspent.
    let (s, r) = misbehaving(r#"buy_plus_later = "1""#);
    assert_eq!(r.status, 200, "{}", r.text());
    let d = deal(&s);
    let secret = s.mint("3");
    let body = common::deal::buy_body(&d, "2");
    let r = s.post_paid("/api/arbitration/contracts/buy", &secret, &body);
    assert_eq!(
        (r.status, r.code().as_str()),
        (500, "internal"),
        "{}",
        r.text()
    );
    assert!(
        r.text().contains("the fee policy could not price buy"),
        "{}",
        r.text()
    );
    assert_eq!(s.cash_state(&secret).0, json!(false));
    s.wait_log("the broken rule", |log| {
        log.contains("fee policy cannot price buy")
            && log.contains("a buy moves the contract amount")
    });
}

/// What lands in the watched families directory is read only if it is a
/// component file: a FIFO (a blocking open of one held the watcher for
/// good: no swap or mount after it), a link to a device (read until
/// memory ran out) or a file over 64 MiB is refused with a log line, and
/// the next real component still mounts.
#[test]
fn the_families_dir_reads_only_regular_component_files() {
    let (_dir, s, families) = watching_families();
    let fifo = families.join("pipe.wasm");
    let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink("/dev/zero", families.join("zeros.wasm")).unwrap();
    // A /proc file says it is empty (some block when read: /proc/kmsg).
    std::os::unix::fs::symlink("/proc/self/status", families.join("proc.wasm")).unwrap();
    let huge = std::fs::File::create(families.join("huge.wasm")).unwrap();
    huge.set_len(65 << 20).unwrap();
    eventually("the three are refused", &s, || {
        let log = s.log_text();
        ["pipe.wasm", "zeros.wasm", "huge.wasm", "proc.wasm"]
            .iter()
            .all(|f| log.contains(&format!("{f} not read")))
    });
    install(&wasm("template.wasm"), &families.join("jotter.wasm"));
    eventually("a component dropped after them mounts", &s, || {
        notes(&s).status == 200
    });
    let log = s.log_text();
    assert!(
        log.contains("pipe.wasm not read: not a regular file"),
        "{log}"
    );
    assert!(
        log.contains("huge.wasm not read: 68157440 bytes, over the"),
        "{log}"
    );
    assert!(log.contains("proc.wasm not read: an empty file"), "{log}");
    assert_eq!(s.get("/api/health").json()["status"], "ok");
}

/// A request routed to a family that is unmounted while it waits to be
/// admitted (its address's long calls run meanwhile) is answered as the
/// family's routes are from then on, 404 naming the unmount, not as an
/// outage (503 without a time to retry): an outside audit found the 503.
#[test]
fn a_request_waiting_while_its_family_is_unmounted_is_404() {
    // Long enough calls that the unmount surely comes while they run.
    let s = Server::with(Options {
        testing_routes: true,
        env: vec![("MARKETPLACE_REQUEST_TIMEOUT_MS".into(), "20000".into())],
        ..Options::default()
    });
    let go = |s: &Server| {
        let addr = s.addr;
        std::thread::spawn(move || {
            common::request(addr, "GET", "/_testing/loop?spin_ms=6000", &[], None)
        })
    };
    // Two long calls of this address run; a third waits for one to end
    // (counted once it waits: then it is unmounted, not before).
    let running: Vec<_> = (0..2).map(|_| go(&s)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let waiting = go(&s);
    let until = Instant::now() + Duration::from_secs(20);
    while s.metric("marketplace_plugin_address_waits_total") < 1 {
        assert!(Instant::now() < until, "the third call never waited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = admin(&s, "DELETE", "/admin/plugins/testing", b"");
    assert_eq!(r.status, 200, "unmount: {}", r.text());
    for call in running {
        let r = call.join().unwrap();
        assert_eq!(
            r.status,
            200,
            "a call begun before the unmount: {}",
            r.text()
        );
    }
    let r = waiting.join().unwrap();
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("unmounted"), "{}", r.text());
    assert_eq!(s.get("/_testing/ok").status, 404);
}

/// A family granted only `payments` charges the fee policy's price and
/// nothing of its own choosing: a charge off a basis it names (what a
/// percentage fee is priced off) and `charge-price` are the escrow
/// holder's, a 500 that spends nothing (the testing-payer component).
#[test]
fn a_payments_grant_charges_the_policys_price_only() {
    let s = Server::start();
    let payer = wasm("testing_payer.wasm");
    let r = admin(&s, "PUT", "/admin/plugins/payer?grants=payments", &payer);
    assert_eq!(r.status, 200, "{}", r.text());

    let secret = s.mint("1");
    let r = s.post_paid("/_payer/fixed", &secret, &json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["payment"]["price"], "0.3", "{}", r.text());

    for how in ["basis", "price"] {
        let secret = s.mint("1");
        let r = s.post_paid(&format!("/_payer/{how}"), &secret, &json!({}));
        assert_eq!(
            (r.status, r.code().as_str()),
            (500, "internal"),
            "{how}: {}",
            r.text()
        );
        // Nothing spent: the whole secret is still the client's.
        assert_eq!(s.cash_state(&secret), (json!(false), json!("1")), "{how}");
    }
    let log = s.log_text();
    assert!(
        log.contains("a charge with a basis (a contract's amount) needs the escrow grant"),
        "{log}"
    );
    assert!(log.contains("charge-price needs the escrow grant"), "{log}");
}

/// A component copied into the families directory the plain way (created
/// empty, then written) is looked at once, whole: no "not read: an empty
/// file" line for its creation and one refusal, not one per write. A file
/// replacing an admin upload takes the configuration's grants, and the
/// refusal says so, naming the upload's that health still shows.
#[test]
fn a_copy_into_the_families_dir_is_refused_once_and_says_whose_grants() {
    use std::io::Write;
    let (_dir, s, families) = watching_families();
    let payer = wasm("testing_payer.wasm");
    let r = admin(&s, "PUT", "/admin/plugins/payer?grants=payments", &payer);
    assert_eq!(r.status, 200, "{}", r.text());
    let path = families.join("payer.wasm");
    let mut file = std::fs::File::create(&path).unwrap();
    file.flush().unwrap();
    // The watcher sees the empty file before its bytes come.
    std::thread::sleep(Duration::from_millis(300));
    file.write_all(&with_custom_section(&payer, "copy", b"2"))
        .unwrap();
    drop(file);
    let refused = "hot reload refused ";
    eventually("the copy is refused", &s, || s.log_text().contains(refused));
    // Another look (the next poll) finds nothing new.
    std::thread::sleep(Duration::from_millis(1500));
    let log = s.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("payer.wasm")).collect();
    assert_eq!(
        lines.iter().filter(|l| l.contains(refused)).count(),
        1,
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains("not read")), "{lines:#?}");
    let line = lines.iter().find(|l| l.contains(refused)).unwrap();
    assert!(
        line.contains("not granted the capability payments")
            && line.contains("gets the grants the configuration gives the family, [], not the upload's [payments]"),
        "{line}"
    );
    // The upload still serves.
    let secret = s.mint("1");
    assert_eq!(
        s.post_paid("/_payer/fixed", &secret, &json!({})).status,
        201
    );
}
