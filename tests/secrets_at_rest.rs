//! Black-box tests of the money the host holds for contracts and of the
//! secrets it hands out (PROTOCOL sections 3 and 7): escrow is per contract
//! and per family and never pays out more than it holds; a host whose
//! server key changed never pays twice nor shows a new secret for an old
//! answer; and no secret a client ever received is at rest in the data dir
//! or in the log.

mod common;

use common::deal::*;
use common::{Key, Resp, Server, now_s};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Mutex;

const ALL_GRANTS: &str = "payments,signatures,escrow,dispatch,host-info,limits,arbiter";

// ---------------------------------------------------------------- helpers

/// Mount the testing component as the family `rogue`, granted everything.
fn mount_rogue(s: &Server) {
    let testing = std::fs::read(common::plugins_dir().join("testing.wasm")).unwrap();
    let r = admin(
        s,
        "PUT",
        &format!("/admin/plugins/rogue?grants={ALL_GRANTS}"),
        &testing,
    );
    assert_eq!(r.status, 200, "mount rogue: {}", r.text());
}

fn rogue_payout(s: &Server, contract: &str, kind: &str, amount: u64) -> Resp {
    s.request(
        "POST",
        &format!("/_testing/payout?contract={contract}&kind={kind}&amount={amount}"),
        &[],
        Some(b""),
    )
}

fn rogue_held(s: &Server, contract: &str) -> Value {
    let r = s.get(&format!("/_testing/held?contract={contract}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The ledger's totals, read from the database file of a stopped server.
fn totals(data_dir: &Path) -> marketplace::money::ledger::Totals {
    let db =
        marketplace::store::Storage::open(&data_dir.join("marketplace.redb"), Default::default())
            .expect("opening the stopped server's database");
    let read = db.begin_read().expect("a read transaction");
    marketplace::money::ledger::Ledger::totals(&read).expect("ledger totals")
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Send `text` to the A2A agent as a user's message; the text of that
/// message as the task it answered keeps it (its history).
fn a2a_kept_text(s: &Server, text: &str) -> String {
    let r = s.post_json(
        "/a2a",
        &json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
            "messageId": "m-pasted", "role": "ROLE_USER", "parts": [{"text": text}]}}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let task = &r.json()["result"]["task"];
    task["history"][0]["parts"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no kept text: {task}"))
        .to_string()
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Every secret a client received, with where it came from.
#[derive(Default)]
struct Wallet {
    secrets: Mutex<Vec<(String, String)>>,
}

impl Wallet {
    fn keep(&self, origin: &str, secret: &str) {
        let mut v = self.secrets.lock().unwrap();
        if !v.iter().any(|(_, s)| s == secret) {
            v.push((origin.to_string(), secret.to_string()));
        }
    }

    /// A freshly minted secret (an operator hands it to a client).
    fn mint(&self, s: &Server, amount: &str) -> String {
        let secret = s.mint(amount);
        self.keep("minted", &secret);
        secret
    }

    /// Keep every secret an answer carries: cash secrets anywhere in its
    /// headers or body, and any 64-hex member named like a secret.
    fn received(&self, origin: &str, r: &Resp) {
        let mut texts: Vec<String> = r.headers.iter().map(|(_, v)| v.clone()).collect();
        texts.push(r.text());
        for text in &texts {
            let mut rest = text.as_str();
            while let Some(i) = rest.find(":secret:") {
                let after = &rest[i + ":secret:".len()..];
                if after.len() >= 64 && is_hex64(&after[..64]) {
                    // Keep the whole secret string: `e<amount>:secret:<hex>`.
                    let start = rest[..i]
                        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
                        .map_or(0, |j| j + 1);
                    self.keep(
                        &format!("{origin} (cash)"),
                        &format!("{}:secret:{}", &rest[start..i], &after[..64]),
                    );
                }
                rest = after;
            }
        }
        if let Ok(v) = serde_json::from_slice::<Value>(&r.body) {
            self.walk(origin, &v);
        }
    }

    fn walk(&self, origin: &str, v: &Value) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k.contains("secret")
                        && let Some(s) = x.as_str()
                        && is_hex64(s.rsplit(":secret:").next().unwrap_or(s))
                    {
                        self.keep(&format!("{origin} ({k})"), s);
                    }
                    self.walk(origin, x);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| self.walk(origin, x)),
            _ => {}
        }
    }

    /// A paid answer that must carry change worth `change`: the header and
    /// `payment.change` agree; every secret in it is kept.
    fn paid(&self, origin: &str, r: &Resp, status: u16, change: &str) -> String {
        assert_eq!(r.status, status, "{origin}: {}", r.text());
        self.received(origin, r);
        let header = r
            .header("x-cash-change")
            .unwrap_or_else(|| panic!("{origin}: no X-Cash-Change header; {:?}", r.headers))
            .to_string();
        assert!(
            header.starts_with(&format!("e{change}:secret:")),
            "{origin}: change {header}"
        );
        assert_eq!(
            r.json()["payment"]["change"],
            header.as_str(),
            "{origin}: payment.change is the header's secret: {}",
            r.text()
        );
        header
    }

    /// (origin, 64-hex part) of every secret kept.
    fn hexes(&self) -> Vec<(String, String)> {
        self.secrets
            .lock()
            .unwrap()
            .iter()
            .map(|(o, s)| {
                let hex = s.rsplit(":secret:").next().unwrap().to_string();
                assert!(is_hex64(&hex), "{o}: {s}");
                (format!("{o}: {s}"), hex)
            })
            .collect()
    }

    fn count(&self, origin_part: &str) -> usize {
        self.secrets
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| o.contains(origin_part))
            .count()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Where a secret shows in `bytes`: as lower- or upper-case hex, or as its
/// raw 32 bytes.
fn leaks(bytes: &[u8], hex: &str) -> Option<&'static str> {
    let raw: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    if find(bytes, hex.to_ascii_lowercase().as_bytes()) {
        Some("lower-case hex")
    } else if find(bytes, hex.to_ascii_uppercase().as_bytes()) {
        Some("upper-case hex")
    } else if find(bytes, &raw) {
        Some("raw bytes")
    } else {
        None
    }
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

// ------------------------------------------------------------------ tests

#[test]
fn escrow_never_pays_out_more_than_a_contract_holds() {
    let s = Server::start();
    mount_rogue(&s);
    // The rogue family's own, empty, account.
    assert_eq!(rogue_held(&s, "CTR_rogue_own"), json!({"held": 0}));
    for kind in ["payout", "refund"] {
        let r = rogue_payout(&s, "CTR_rogue_own", kind, 1);
        assert_eq!(
            (r.status, r.code().as_str()),
            (409, "conflict"),
            "{kind} of 1 unit from an empty account: {}",
            r.text()
        );
        assert!(!r.text().contains(":secret:"), "{}", r.text());
    }
    let r = rogue_payout(&s, "CTR_rogue_own", "payout", u64::MAX);
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "conflict"),
        "{}",
        r.text()
    );
    // Only payouts and refunds are paid out.
    let r = rogue_payout(&s, "CTR_rogue_own", "fee", 1);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(rogue_held(&s, "CTR_rogue_own"), json!({"held": 0}));

    // A real contract holding 1.0 in the contracts family's account: the
    // rogue's account of that id holds nothing and pays nothing.
    let d = deal(&s);
    let id = buy(&s, &d, "1");
    assert_eq!(rogue_held(&s, &id), json!({"held": 0}));
    for amount in [100_000_000u64, 1] {
        let r = rogue_payout(&s, &id, "payout", amount);
        assert_eq!(
            (r.status, r.code().as_str()),
            (409, "conflict"),
            "rogue payout of {amount} from {id}: {}",
            r.text()
        );
    }
    // The contract itself pays exactly what it holds less the fee, once.
    act_ok(&s, &d.seller, &id, "accept");
    act_ok(&s, &d.seller, &id, "deliver");
    act_ok(&s, &d.buyer, &id, "pickup");
    let payout = act_ok(&s, &d.seller, &id, "pickup")["payout"]
        .as_str()
        .expect("a payout")
        .to_string();
    assert!(payout.starts_with("e0.97:secret:"), "{payout}");
    assert_eq!(s.cash_state(&payout), (json!(false), json!("0.97")));
    let again = act_ok(&s, &d.seller, &id, "pickup");
    assert_eq!(
        again["payout"],
        payout.as_str(),
        "a repeat shows the same payout"
    );
    // What is left (the fee) is not the rogue's either.
    let r = rogue_payout(&s, &id, "payout", 3_000_000);
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "conflict"),
        "{}",
        r.text()
    );
}

#[test]
fn a_changed_server_key_never_pays_twice() {
    if common::skip_on_postgres(
        "a_changed_server_key_never_pays_twice",
        "the server key is in the store, not server.key",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let opts = common::Options {
        data_dir: Some(data.clone()),
        ..Default::default()
    };
    let mut s = Server::with(opts.clone());
    let d = deal(&s);
    let id = buy(&s, &d, "1");
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
    s.kill();
    let before = totals(&data);
    assert_eq!(
        before.minted,
        before.unspent + before.fees + before.escrow,
        "value conserved: {before:?}"
    );

    // A new server key.
    let key_file = data.join("server.key");
    let old_key = std::fs::read_to_string(&key_file).expect("server.key in the data dir");
    std::fs::remove_file(&key_file).unwrap();
    let mut s = Server::with(opts.clone());
    let new_key = std::fs::read_to_string(&key_file).expect("a new server.key");
    assert_ne!(old_key.trim(), new_key.trim());
    // The operator is told, once, at the start.
    let changed = "this database ran with another server-key before";
    s.wait_log("the changed key", |log| log.contains(changed));
    assert!(log_level_of(&s.log_text(), changed) == "ERROR");
    // And a monitor is, without reading the log: health (still ok: the
    // host serves) lists it, and the alerts gauge counts it.
    let h = s.get("/api/health");
    assert_eq!(h.status, 200, "{}", h.text());
    assert_eq!(
        h.json()["alerts"][0]["kind"],
        "server_key_changed",
        "{}",
        h.text()
    );
    assert_eq!(s.metric("marketplace_alerts"), 1);

    // The payout was issued already: the host cannot show it again and
    // must not issue another one.
    for _ in 0..2 {
        let r = act(&s, &d.seller, &id, "pickup");
        assert_eq!(
            (r.status, r.code().as_str()),
            (409, "conflict"),
            "payout pickup under a new server key: {}",
            r.text()
        );
        assert!(!r.text().contains(":secret:"), "{}", r.text());
        assert!(r.header("x-cash-change").is_none());
    }
    // The original payout is still live and unspent; nothing new exists.
    assert_eq!(s.cash_state(&payout), (json!(false), json!("0.97")));
    s.kill();
    let after = totals(&data);
    assert_eq!(before, after, "the ledger's value changed");
    // Every start with the other key says so again (the log file goes on
    // from the earlier starts)...
    let mut s = Server::with(opts.clone());
    assert_eq!(s.get("/api/health").status, 200);
    s.wait_log("the third start", |log| {
        log.matches("starting marketplace").count() == 3
    });
    s.wait_log("the changed key, again", |log| {
        log.matches(changed).count() == 2
    });
    s.kill();
    // ...until the right key file is back.
    std::fs::write(&key_file, &old_key).unwrap();
    let mut s = Server::with(opts.clone());
    let h = s.get("/api/health");
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["alerts"], json!([]), "{}", h.text());
    assert_eq!(s.metric("marketplace_alerts"), 0);
    s.wait_log("the fourth start", |log| {
        log.matches("starting marketplace").count() == 4
    });
    assert_eq!(s.log_text().matches(changed).count(), 2, "{}", s.log_text());
    s.kill();
    // A configured key overrides the file: another one is told as the
    // setting to mend, not the file (which is right already).
    let mut configured = opts;
    configured
        .env
        .push(("MARKETPLACE_SERVER_KEY".into(), "ab".repeat(32)));
    let s = Server::with(configured);
    s.wait_log("the changed configured key", |log| {
        log.matches(changed).count() == 3
    });
    let log = s.log_text();
    let line = log.lines().filter(|l| l.contains(changed)).nth(2).unwrap();
    assert!(
        line.contains("the configured `server_key` (MARKETPLACE_SERVER_KEY")
            && !line.contains("back from a backup"),
        "{line}"
    );
}

/// The level of the first log line containing `what` (text format).
fn log_level_of<'a>(log: &'a str, what: &str) -> &'a str {
    let line = log.lines().find(|l| l.contains(what)).unwrap_or_default();
    ["ERROR", "WARN", "INFO", "DEBUG"]
        .into_iter()
        .find(|level| line.contains(level))
        .unwrap_or("")
}

#[test]
fn a_changed_server_key_never_shows_a_new_change_secret_on_replay() {
    if common::skip_on_postgres(
        "a_changed_server_key_never_shows_a_new_change_secret_on_replay",
        "the server key is in the store, not server.key",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let opts = common::Options {
        data_dir: Some(data.clone()),
        ..Default::default()
    };
    let mut s = Server::with(opts.clone());
    // A paid request answered with change.
    let key = Key::random();
    let secret = s.mint("1");
    let name = nick("replayer");
    let ts = now_s();
    let body = json!({
        "nickname": name, "pgp_public_key": key.fp(),
        "signature": key.sign(&format!("register:{name}:{ts}")), "timestamp": ts,
    });
    let first = s.post_paid("/api/identity", &secret, &body);
    assert_eq!(first.status, 201, "{}", first.text());
    let change = first.header("x-cash-change").expect("change").to_string();
    assert!(change.starts_with("e0.4:secret:"), "{change}");
    // An identical retry shows the same answer.
    let again = s.post_paid("/api/identity", &secret, &body);
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.header("x-cash-change"), Some(change.as_str()));
    s.kill();
    let before = totals(&data);

    std::fs::remove_file(data.join("server.key")).unwrap();
    let mut s = Server::with(opts);
    let r = s.post_paid("/api/identity", &secret, &body);
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "conflict"),
        "identical retry under a new server key: {}",
        r.text()
    );
    assert!(r.header("x-cash-change").is_none(), "{:?}", r.headers);
    assert!(!r.text().contains(":secret:"), "{}", r.text());
    assert_eq!(s.cash_state(&change), (json!(false), json!("0.4")));
    s.kill();
    assert_eq!(before, totals(&data), "the ledger's value changed");
}

/// Every secret of a full buy-to-pickup flow and a buy-to-refund flow, under
/// one fee policy: none of them is in the data dir or the log.
fn no_secret_at_rest(pickup_paid: bool) {
    let mut opts = common::Options::default();
    if pickup_paid {
        opts.env.push((
            "MARKETPLACE_PLUGIN_FEES".into(),
            "fees_pickup_paid.wasm".into(),
        ));
    }
    let mut s = Server::with(opts);
    let policy = if pickup_paid {
        "pickup-paid"
    } else {
        "bid-inclusive"
    };
    assert_eq!(s.get("/api/fees").json()["arbitration"]["policy"], policy);
    let data = s.data_dir.clone();
    assert_eq!(mode(&data), 0o700, "data dir mode");
    if !common::backend_is_postgres() {
        assert_eq!(mode(&data.join("marketplace.redb")), 0o600, "database mode");
        assert_eq!(mode(&data.join("server.key")), 0o600, "server key mode");
    }

    let w = Wallet::default();
    // Identities and a listing, each paid with change.
    let seller = Key::random();
    let r = s.register(&seller, &nick("seller"), &w.mint(&s, "1"));
    w.paid("register seller", &r, 201, "0.4");
    let buyer = Key::random();
    let r = s.register(&buyer, &nick("buyer"), &w.mint(&s, "1"));
    w.paid("register buyer", &r, 201, "0.4");
    let r = s.post(
        &seller,
        "Logo design, delivered in 3 days",
        json!({"post_type": "service"}),
        &w.mint(&s, "0.5"),
    );
    w.paid("post", &r, 201, "0.2");
    let d = Deal {
        buyer,
        seller,
        post: r.json()["post_id"].as_str().unwrap().to_string(),
    };

    // A user who pastes a secret into a message to the A2A agent: the task
    // it keeps (history) does not hold it.
    let pasted = w.mint(&s, "0.3");
    let text = a2a_kept_text(&s, &format!("logo {pasted}"));
    assert!(text.ends_with(":secret:{redacted}"), "{text}");

    // Buy with change; an identical retry replays the same answer (same
    // change secret), another body with the spent secret is refused.
    let secret = w.mint(&s, "1.5");
    let body = buy_body(&d, "1");
    let bought = s.post_paid("/api/arbitration/contracts/buy", &secret, &body);
    let change = w.paid("buy", &bought, 201, "0.5");
    let id = bought.json()["contract_id"].as_str().unwrap().to_string();
    let replayed = s.post_paid("/api/arbitration/contracts/buy", &secret, &body);
    let change_again = w.paid("buy (identical retry)", &replayed, 201, "0.5");
    assert_eq!(change_again, change, "the retry shows the same change");
    assert_eq!(
        replayed.json(),
        bought.json(),
        "the retry shows the same answer"
    );
    assert_eq!(s.cash_state(&change), (json!(false), json!("0.5")));
    let r = s.post_paid(
        "/api/arbitration/contracts/buy",
        &secret,
        &buy_body(&d, "1"),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_spent"),
        "{}",
        r.text()
    );

    act_ok(&s, &d.seller, &id, "accept");
    act_ok(&s, &d.seller, &id, "deliver");

    // The buyer's settling pickup: the certificate (paid with change under
    // pickup-paid).
    let cert = if pickup_paid {
        let r = act(&s, &d.buyer, &id, "pickup");
        assert_eq!(
            (r.status, r.code().as_str()),
            (402, "payment_required"),
            "{}",
            r.text()
        );
        let fee = w.mint(&s, "0.5");
        let body = action_body(&d.buyer, &id, "pickup");
        let r = s.post_paid(&action_path(&id, "pickup"), &fee, &body);
        w.paid("paid pickup", &r, 200, "0.47");
        // An identical retry of the paid pickup: the same answer.
        let again = s.post_paid(&action_path(&id, "pickup"), &fee, &body);
        w.paid("paid pickup (identical retry)", &again, 200, "0.47");
        assert_eq!(again.json(), r.json());
        r.json()
    } else {
        let r = act(&s, &d.buyer, &id, "pickup");
        assert_eq!(r.status, 200, "{}", r.text());
        w.received("certificate pickup", &r);
        r.json()
    };
    assert_eq!(cert["status"], "settled", "{cert}");
    let cert_secret = cert["certificate_secret"].as_str().unwrap_or_default();
    // (A bearer witness: n:{certificate_id}:secret:{64 hex}.)
    assert!(
        cert_secret.starts_with("n:CRT_")
            && is_hex64(cert_secret.rsplit(":secret:").next().unwrap()),
        "a certificate secret: {cert}"
    );
    let r = act(&s, &d.buyer, &id, "pickup");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["certificate_secret"], cert_secret);
    // Pasted into a message to the A2A agent, as a cash secret was above:
    // whoever holds it can take the certificate over, so the kept task
    // does not hold it either (the scan below checks the files).
    let text = a2a_kept_text(&s, &format!("transfer {cert_secret}"));
    assert!(text.ends_with(":secret:{redacted}"), "{text}");

    // The seller's payout.
    let r = act(&s, &d.seller, &id, "pickup");
    assert_eq!(r.status, 200, "{}", r.text());
    w.received("payout pickup", &r);
    let payout = r.json()["payout"].as_str().expect("a payout").to_string();
    let (payout_amount, parts) = if pickup_paid {
        ("1", ["0.9", "0.1"])
    } else {
        ("0.97", ["0.9", "0.07"])
    };
    assert!(
        payout.starts_with(&format!("e{payout_amount}:secret:")),
        "{payout}"
    );
    let r = act(&s, &d.seller, &id, "pickup");
    assert_eq!(r.json()["payout"], payout.as_str());
    // The seller swaps it for secrets of their own.
    let mine: Vec<String> = parts
        .iter()
        .map(|a| {
            let mut raw = [0u8; 32];
            getrandom::fill(&mut raw).unwrap();
            format!("e{a}:secret:{}", common::hex(&raw))
        })
        .collect();
    for m in &mine {
        w.keep("client-made (replace)", m);
    }
    let r = s.post_json(
        "/api/cash/replace",
        &json!({"webcashes": [payout], "new_webcashes": mine}),
    );
    assert_eq!(r.status, 200, "replace the payout: {}", r.text());

    // Buy-to-refund, paid with change.
    let body = buy_body(&d, "1");
    let r = s.post_paid("/api/arbitration/contracts/buy", &w.mint(&s, "1.2"), &body);
    w.paid("buy (refunded)", &r, 201, "0.2");
    let refunded = r.json()["contract_id"].as_str().unwrap().to_string();
    act_ok(&s, &d.buyer, &refunded, "refund");
    let r = act(&s, &d.buyer, &refunded, "pickup");
    assert_eq!(r.status, 200, "{}", r.text());
    w.received("refund pickup", &r);
    let refund = r.json()["refund"].as_str().expect("a refund").to_string();
    assert!(refund.starts_with("e1:secret:"), "{refund}");
    assert_eq!(s.cash_state(&refund), (json!(false), json!("1")));

    // Everything a client received was seen.
    assert!(w.count("(cash)") >= 7, "{:?}", w.secrets.lock().unwrap());
    assert!(
        w.count("certificate_secret") >= 1,
        "{:?}",
        w.secrets.lock().unwrap()
    );
    for s in [&change, &payout, &refund] {
        assert!(
            w.secrets.lock().unwrap().iter().any(|(_, x)| x == s),
            "{s} not collected"
        );
    }

    // Stopped (every log line written), nothing of it is at rest or in
    // the log.
    s.stop();
    // The redb file, or every row of the shared store's schema.
    let db = common::stored_bytes(&data);
    let log = s.log_text();
    assert!(!log.is_empty(), "the server log is empty");
    // The scan reads real data: the payout's public hash is in the file.
    let payout_hex = payout.rsplit(":secret:").next().unwrap();
    let payout_public = {
        use sha2::{Digest, Sha256};
        common::hex(&Sha256::digest(payout_hex.as_bytes()))
    };
    assert!(
        leaks(&db, &payout_public).is_some(),
        "the database does not hold the payout's public hash"
    );
    let mut found = Vec::new();
    for (origin, hex) in w.hexes() {
        if let Some(how) = leaks(&db, &hex) {
            found.push(format!("the database holds {origin} as {how}"));
        }
        if let Some(how) = leaks(log.as_bytes(), &hex) {
            found.push(format!("the server log holds {origin} as {how}"));
        }
        for file in files(&data) {
            let bytes = std::fs::read(&file).unwrap_or_default();
            if let Some(how) = leaks(&bytes, &hex) {
                found.push(format!("{} holds {origin} as {how}", file.display()));
            }
        }
    }
    found.dedup();
    assert!(
        found.is_empty(),
        "{policy}: secrets at rest:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_secret_at_rest_under_bid_inclusive() {
    no_secret_at_rest(false);
}

#[test]
fn no_secret_at_rest_under_pickup_paid() {
    no_secret_at_rest(true);
}

#[test]
fn key_files_made_readable_are_private_again_at_start() {
    if common::skip_on_postgres(
        "key_files_made_readable_are_private_again_at_start",
        "the keys are in the store",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let opts = common::Options {
        data_dir: Some(data.clone()),
        ..Default::default()
    };
    let mut s = Server::with(opts.clone());
    s.kill();
    use std::os::unix::fs::PermissionsExt;
    let mut loosened = Vec::new();
    for name in ["server.key", "arbiter.key", "admin.token"] {
        let path = data.join(name);
        if path.is_file() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            loosened.push(path);
        }
    }
    assert!(!loosened.is_empty(), "no key file in {}", data.display());
    let s = Server::with(opts);
    assert_eq!(s.get("/api/health").status, 200);
    for path in loosened {
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
}
