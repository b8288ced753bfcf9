//! Drives a running marketplace with the unmodified original client: the
//! `harmoniis-wallet` crate's `HarmoniisClient` for every marketplace call
//! it makes, and its webcash wallet (`webylib`) pointed at the service's
//! `/api/v1/replace` for every payment, as a user of the library would.
//!
//! `original-client-check BASE ADMIN_URL` with `ADMIN_TOKEN` in the
//! environment (two secrets are minted through the admin listener to fund
//! the wallets); `--direct` talks to `/api/v1/...` (`new_direct`) instead
//! of `/api/...` (`new`). Prints one line per step and exits non-zero when
//! any step did not go as PROTOCOL says.
use harmoniis_wallet::client::arbitration::{build_witness_commitment, BuyRequest};
use harmoniis_wallet::client::recovery::{RecoveryProbe, RecoveryScanRequest};
use harmoniis_wallet::client::storage::StoragePresignRequest;
use harmoniis_wallet::client::timeline::{
    DeleteIdentityRequest, DeletePostRequest, PublishPostRequest, RatePostRequest, RegisterRequest,
    UpdatePostRequest,
};
use harmoniis_wallet::client::HarmoniisClient;
use harmoniis_wallet::error::Error;
use harmoniis_wallet::types::WitnessSecret;
use harmoniis_wallet::{extract_webcash_secret, Identity};
use serde_json::Value;
use std::future::Future;
use std::str::FromStr;
use webylib::server::NetworkMode;
use webylib::{Amount, SecretWebcash, Wallet};

/// The steps' outcomes.
#[derive(Default)]
struct Report {
    failed: Vec<String>,
}

impl Report {
    /// A step that must succeed: its value, or None (and a failure).
    fn ok<T: std::fmt::Debug>(&mut self, step: &str, r: Result<T, Error>) -> Option<T> {
        match r {
            Ok(v) => {
                let shown: String = format!("{v:?}").chars().take(160).collect();
                println!("ok    {step}: {shown}");
                Some(v)
            }
            Err(e) => {
                self.fail(step, format!("{e:?}"));
                None
            }
        }
    }

    /// A cash secret taken into `wallet` (the wallet's replace runs
    /// against the service, so the secret must be live there).
    async fn take(&mut self, step: &str, wallet: &Wallet, secret: &str) {
        let secret = SecretWebcash::parse(secret).expect("a cash secret");
        let taken = wallet.insert(secret).await;
        self.ok(step, taken.map_err(|e| Error::Other(e.into())));
    }

    /// The secret `member` of a pickup's `answer`, taken into `wallet`.
    async fn take_member(
        &mut self,
        step: &str,
        wallet: &Wallet,
        answer: Option<Value>,
        member: &str,
    ) {
        match answer.as_ref().and_then(|a| a[member].as_str()) {
            Some(secret) => self.take(step, wallet, secret).await,
            None => self.fail(step, format!("no {member} in {answer:?}")),
        }
    }

    fn check(&mut self, step: &str, holds: bool, what: impl std::fmt::Display) {
        if holds {
            println!("ok    {step}: {what}");
        } else {
            self.fail(step, what.to_string());
        }
    }

    fn fail(&mut self, step: &str, what: String) {
        println!("FAIL  {step}: {what}");
        self.failed.push(step.to_string());
    }

    /// A paid call as the client's own flow makes it: first with an empty
    /// payment header, which must be 402 `payment_required` naming the
    /// price; then paid from `wallet` with exactly that amount.
    async fn paid<T, F, Fut>(
        &mut self,
        step: &str,
        wallet: &Wallet,
        price: &str,
        call: F,
    ) -> Option<T>
    where
        T: std::fmt::Debug,
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        match call(String::new()).await {
            Ok(v) => {
                self.fail(step, format!("unpaid call succeeded: {v:?}"));
                return None;
            }
            Err(Error::Api { status: 402, body }) => {
                let v: Value = serde_json::from_str(&body).unwrap_or_default();
                let holds = v["code"] == "payment_required" && v["required_amount"] == price;
                self.check(&format!("{step}, unpaid"), holds, format!("402 {body}"));
            }
            Err(e) => self.fail(&format!("{step}, unpaid"), format!("{e:?}")),
        }
        let secret = pay(wallet, price).await;
        self.ok(step, call(secret).await)
    }
}

/// A secret of exactly `amount` from `wallet` (the wallet's replace runs
/// against the service).
async fn pay(wallet: &Wallet, amount: &str) -> String {
    let out = wallet
        .pay(
            Amount::from_str(amount).expect("amount"),
            "original client check",
        )
        .await
        .expect("wallet pays");
    extract_webcash_secret(&out).expect("a secret in the wallet's payment")
}

async fn mint(admin: &str, token: &str, amount: &str) -> String {
    let answer: Value = reqwest::Client::new()
        .post(format!("{admin}/admin/cash/mint"))
        .bearer_auth(token)
        .json(&serde_json::json!({ "amount": amount }))
        .send()
        .await
        .expect("admin mint")
        .json()
        .await
        .expect("mint answer");
    answer["secret"]
        .as_str()
        .expect("minted secret")
        .to_string()
}

fn is_404<T>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(Error::Api { status: 404, .. }))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let direct = args.iter().any(|a| a == "--direct");
    let mut urls = args.iter().filter(|a| !a.starts_with("--"));
    let (Some(base), Some(admin)) = (urls.next(), urls.next()) else {
        eprintln!("usage: original-client-check BASE ADMIN_URL [--direct] (ADMIN_TOKEN set)");
        std::process::exit(2);
    };
    let token = std::env::var("ADMIN_TOKEN").expect("ADMIN_TOKEN");
    let mut report = Report::default();
    let client = if direct {
        HarmoniisClient::new_direct(base)
    } else {
        HarmoniisClient::new(base)
    };

    // Two webcash wallets on this service, funded with 5 each.
    let network = NetworkMode::Custom(base.clone());
    let buyer_cash = Wallet::open_memory_with_network(network.clone()).expect("wallet");
    let seller_cash = Wallet::open_memory_with_network(network).expect("wallet");
    for (who, wallet) in [("buyer", &buyer_cash), ("seller", &seller_cash)] {
        let seed = mint(admin, &token, "5").await;
        let step = format!("{who}'s wallet takes a minted secret (/api/v1/replace)");
        report.take(&step, wallet, &seed).await;
    }

    let buyer = Identity::generate();
    let seller = Identity::generate();
    let (bfp, sfp) = (buyer.fingerprint(), seller.fingerprint());
    let bnick = format!("buyer_{}", &bfp[..8]);
    let snick = format!("seller_{}", &sfp[..8]);
    for (id, nick, wallet) in [
        (&buyer, &bnick, &buyer_cash),
        (&seller, &snick, &seller_cash),
    ] {
        let req = RegisterRequest {
            nickname: nick.clone(),
            pgp_public_key: id.public_key_hex(),
            signature: id.sign(&format!("register:{nick}")),
            about: Some("original client check".into()),
        };
        let fp = report
            .paid("register_identity", wallet, "0.6", |s| {
                let req = req.clone();
                let client = &client;
                async move { client.register_identity(&req, &s).await }
            })
            .await;
        report.check(
            "register_identity answers the fingerprint",
            fp.as_deref() == Some(id.fingerprint().as_str()),
            format!("{fp:?}"),
        );
    }

    let content = "Write a haiku about Rust";
    let offer = PublishPostRequest {
        author_fingerprint: sfp.clone(),
        author_nick: snick.clone(),
        content: content.into(),
        post_type: "service_offer".into(),
        witness_proof: None,
        contract_id: None,
        parent_id: None,
        keywords: vec!["haiku".into()],
        attachments: vec![],
        activity_metadata: None,
        signature: seller.sign(&format!("post:{content}")),
        accept_terms: Some(true),
    };
    let post = report
        .paid("publish_post (offer)", &seller_cash, "0.3", |s| {
            let (req, client) = (offer.clone(), &client);
            async move { client.publish_post(&req, &s).await }
        })
        .await
        .expect("the offer post");
    let doc = report.ok("get_post", client.get_post(&post).await);
    report.check(
        "the post's author nickname comes from the profile",
        doc.is_some_and(|d| d["post"]["author_nick"] == snick.as_str()),
        &snick,
    );

    // Three contracts bought as the client's own integration flow buys them.
    let stamp = chrono::Utc::now().timestamp() % 1_000_000;
    let mut contracts = Vec::new();
    for (n, amount) in [(1, "0.001"), (2, "0.25"), (3, "0.5")] {
        let id = format!("CTR_{}_{stamp:06}{n}", chrono::Utc::now().format("%Y"));
        let witness = WitnessSecret::generate(&id);
        let proof = witness.public_proof();
        let (encrypted, zkp) = build_witness_commitment(
            &witness,
            &proof,
            &bfp,
            Some(&sfp),
            Some(&seller.public_key_hex()),
            |m| buyer.sign(m),
        );
        let req = BuyRequest {
            buyer_fingerprint: bfp.clone(),
            buyer_public_key: buyer.public_key_hex(),
            contract_type: "service".into(),
            amount: amount.into(),
            contract_id: id.clone(),
            witness_proof: proof.display(),
            encrypted_witness_secret: encrypted,
            witness_zkp: zkp,
            reference_post: post.clone(),
            signature: buyer.sign(&format!(
                "buy_contract:{bfp}:{post}:{id}:{}",
                proof.display()
            )),
            accept_terms: true,
        };
        let answer = report
            .paid("buy_contract", &buyer_cash, amount, |s| {
                let (req, client) = (req.clone(), &client);
                async move { client.buy_contract(&req, &s).await }
            })
            .await;
        report.check(
            "buy_contract keeps the client's contract id",
            answer
                .as_ref()
                .is_some_and(|a| a["contract_id"] == id.as_str()),
            &id,
        );
        contracts.push((id, witness));
    }

    // 1: bid post, accept, witness replace, deliver, the buyer's pickup,
    // the arbiter's signature, the seller's payout into their wallet.
    let (c1, w1) = contracts[0].clone();
    let bid_text = format!("I bid on contract {c1}");
    let bid = PublishPostRequest {
        author_fingerprint: bfp.clone(),
        author_nick: bnick.clone(),
        content: bid_text.clone(),
        post_type: "bid".into(),
        witness_proof: Some(w1.public_proof().display()),
        contract_id: Some(c1.clone()),
        parent_id: None,
        keywords: vec!["bid".into()],
        attachments: vec![],
        activity_metadata: None,
        signature: buyer.sign(&format!("post:{bid_text}")),
        accept_terms: None,
    };
    report
        .paid("publish_post (bid)", &buyer_cash, "0.3", |s| {
            let (req, client) = (bid.clone(), &client);
            async move { client.publish_post(&req, &s).await }
        })
        .await;
    let sign_accept = |c: &str| seller.sign(&format!("accept:{c}:{sfp}"));
    report.ok(
        "accept_contract",
        client.accept_contract(&c1, &sfp, &sign_accept(&c1)).await,
    );
    let w1b = WitnessSecret::generate(&c1);
    report.ok("witness_replace", client.witness_replace(&w1, &w1b).await);
    let old_live = client.witness_is_live(&w1.public_proof()).await;
    report.check(
        "the replaced proof is not live",
        matches!(old_live, Ok(false)),
        format!("{old_live:?}"),
    );
    let new_live = client.witness_is_live(&w1b.public_proof()).await;
    report.check(
        "the new proof is live",
        matches!(new_live, Ok(true)),
        format!("{new_live:?}"),
    );
    let text = "Ownership without a GC";
    let deliver_sig = seller.sign(&format!("deliver:{c1}:{text}"));
    report.ok(
        "deliver",
        client
            .deliver(&c1, &w1b.display(), text, &sfp, &deliver_sig)
            .await,
    );
    let pickup = report.ok(
        "pickup (buyer)",
        client.pickup(&c1, &bfp, &buyer.sign(&c1)).await,
    );
    report.check(
        "the buyer's pickup carries a certificate",
        pickup.is_some_and(|p| p["certificate_secret"].is_string()),
        "certificate_secret",
    );
    let status = client.contract_status(&c1).await;
    report.check(
        "contract_status is settled",
        matches!(&status, Ok(s) if s == "settled"),
        format!("{status:?}"),
    );
    if let Some(d) = report.ok("get_contract", client.get_contract(&c1).await) {
        let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
        let units = Amount::from_str(&s("amount")).map_or(0, |a| a.wats as u64);
        let verified = client
            .verify_contract_signature(
                &c1,
                &bfp,
                units,
                &s("delivery_deadline"),
                &s("contract_type"),
                &s("work_spec"),
                &s("reference_post"),
                &buyer.public_key_hex(),
                &s("arbiter_signature"),
            )
            .await;
        report.check(
            "verify_contract_signature",
            matches!(verified, Ok(true)),
            format!("{verified:?}"),
        );
    }
    let payout = report.ok(
        "pickup (seller's payout)",
        client.pickup(&c1, &sfp, &seller.sign(&c1)).await,
    );
    let step = "the seller's wallet takes the payout";
    report
        .take_member(step, &seller_cash, payout, "payout")
        .await;
    let again = client.pickup(&c1, &sfp, &seller.sign(&c1)).await;
    report.check(
        "a second legacy payout pickup is 409 already_picked_up",
        matches!(&again, Err(Error::Api { status: 409, body }) if body.contains("already_picked_up")),
        format!("{again:?}"),
    );
    let spent = client.witness_check(&[w1.public_proof().display()]).await;
    report.check(
        "witness_check: the first proof is spent",
        matches!(&spent, Ok(v) if v["results"][w1.public_proof().display()]["spent"] == true),
        format!("{spent:?}"),
    );

    // 2: the seller refunds; the buyer's refund goes into their wallet.
    let (c2, w2) = contracts[1].clone();
    report.ok(
        "accept_contract (2)",
        client.accept_contract(&c2, &sfp, &sign_accept(&c2)).await,
    );
    let refund_sig = seller.sign(&format!("REFUND:{c2}"));
    report.ok(
        "refund (seller)",
        client
            .refund(&c2, &sfp, Some(&w2.display()), &refund_sig)
            .await,
    );
    let refund = report.ok(
        "pickup (buyer's refund)",
        client.pickup(&c2, &bfp, &buyer.sign(&c2)).await,
    );
    let step = "the buyer's wallet takes the refund";
    report
        .take_member(step, &buyer_cash, refund, "refund")
        .await;

    // 3: the seller's release with tracking, then the buyer's pickup.
    let (c3, w3) = contracts[2].clone();
    report.ok(
        "accept_contract (3)",
        client.accept_contract(&c3, &sfp, &sign_accept(&c3)).await,
    );
    let release_sig = seller.sign(&format!("release:{c3}"));
    let released = client
        .request_release(&c3, "TRK-1", Some("DHL"), &sfp, &w3.display(), &release_sig)
        .await;
    report.check(
        "request_release (seller, tracking) delivers",
        matches!(&released, Ok(v) if v["status"] == "delivered"),
        format!("{released:?}"),
    );
    report.ok(
        "pickup (buyer, 3)",
        client.pickup(&c3, &bfp, &buyer.sign(&c3)).await,
    );

    // Posts and profiles.
    let rate = RatePostRequest {
        post_id: post.clone(),
        actor_fingerprint: bfp.clone(),
        vote: "up".into(),
        signature: buyer.sign(&format!("vote:{post}:up")),
    };
    report
        .paid("rate_post", &buyer_cash, "0.001", |s| {
            let (req, client) = (rate.clone(), &client);
            async move { client.rate_post(&req, &s).await }
        })
        .await;
    let update = UpdatePostRequest {
        post_id: post.clone(),
        author_fingerprint: sfp.clone(),
        signature: seller.sign(&format!("update_post:{post}")),
        content: Some("Write two haiku".into()),
        keywords: Some(vec!["haiku".into(), "poetry".into()]),
        attachments: None,
        activity_metadata: None,
    };
    report.ok("update_post", client.update_post(&update).await);
    let updated = client.get_post(&post).await;
    report.check(
        "the post shows the update",
        matches!(&updated, Ok(d) if d["post"]["content"] == "Write two haiku"),
        format!("{updated:?}"),
    );
    let payload = "opaque ciphertext";
    let reply_sig = buyer.sign(&format!("post:{payload}"));
    report
        .paid("publish_encrypted_reply", &buyer_cash, "0.01", |s| {
            let (client, post, bfp, bnick, sfp, sig) =
                (&client, &post, &bfp, &bnick, &sfp, &reply_sig);
            async move {
                client
                    .publish_encrypted_reply(bfp, bnick, sfp, post, payload, sig, &s)
                    .await
            }
        })
        .await;
    let file = "avatars/me.png";
    let presign = StoragePresignRequest {
        fingerprint: sfp.clone(),
        file_path: file.into(),
        content_type: "image/png".into(),
        is_public: true,
        signature: seller.sign(&format!("presign:{file}")),
    };
    if let Some(p) = report.ok("storage_presign", client.storage_presign(&presign).await) {
        let bytes = b"\x89PNG\r\n\x1a\n picture".to_vec();
        report.ok(
            "upload_presigned_bytes",
            client
                .upload_presigned_bytes(&p.presigned_url, bytes.clone(), "image/png")
                .await,
        );
        let sig = seller.sign(&format!("update_profile:{sfp}"));
        report.ok(
            "update_profile_picture",
            client.update_profile_picture(&sfp, &p.s3_key, &sig).await,
        );
        let profile = client.get_profile(&sfp).await;
        report.check(
            "the profile shows the picture",
            matches!(&profile, Ok(v) if v["profile"]["profile_picture"] == p.s3_key.as_str()),
            format!("{profile:?}"),
        );
        let served = match &p.public_url {
            Some(u) => reqwest::get(u).await.ok().map(|r| r.status().as_u16()),
            None => None,
        };
        report.check(
            "public_url serves the upload",
            served == Some(200),
            format!("{served:?}"),
        );
    }
    let challenge = format!("recover:{sfp}:{}", chrono::Utc::now().to_rfc3339());
    let scan = RecoveryScanRequest {
        challenge: challenge.clone(),
        probes: vec![RecoveryProbe {
            key_index: 0,
            fingerprint: sfp.clone(),
            signature: seller.sign(&challenge),
        }],
        include_contracts: true,
        contract_limit: 10,
    };
    let found = client.recovery_scan(&scan).await;
    report.check(
        "recovery_scan finds the identity and its three contracts",
        matches!(&found, Ok(r) if r.identities.len() == 1 && r.contracts.len() == 3),
        format!("{found:?}"),
    );
    report.ok("fetch_arbiter_pubkey", client.fetch_arbiter_pubkey().await);
    let delete = DeletePostRequest {
        post_id: post.clone(),
        author_fingerprint: sfp.clone(),
        signature: seller.sign(&format!("delete_post:{post}")),
    };
    report.ok("delete_post", client.delete_post(&delete).await);
    report.check(
        "the deleted post is 404",
        is_404(&client.get_post(&post).await),
        "404",
    );
    let forget = DeleteIdentityRequest {
        fingerprint: bfp.clone(),
        signature: buyer.sign(&format!("delete_identity:{bfp}")),
    };
    report.ok("delete_identity", client.delete_identity(&forget).await);
    report.check(
        "the deleted profile is 404",
        is_404(&client.get_profile(&bfp).await),
        "404",
    );

    // Money: what each wallet holds is what it paid and was paid, to the unit.
    let buyer_end = buyer_cash.balance().await.unwrap_or_default();
    let seller_end = seller_cash.balance().await.unwrap_or_default();
    // Buyer: 5 - 0.6 - (0.001 + 0.25 + 0.5) - 0.3 - 0.001 - 0.01 + 0.25.
    report.check(
        "the buyer's wallet holds 3.588",
        buyer_end == "3.588",
        &buyer_end,
    );
    // Seller: 5 - 0.6 - 0.3 + the payout (0.001 less the 3 % fee).
    report.check(
        "the seller's wallet holds 4.10097",
        seller_end == "4.10097",
        &seller_end,
    );

    if report.failed.is_empty() {
        println!("original client: every step passed");
    } else {
        println!(
            "original client: {} steps failed: {:?}",
            report.failed.len(),
            report.failed
        );
        std::process::exit(1);
    }
}
