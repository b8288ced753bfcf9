//! The writes: a post, comment or private reply (paid, signed), and the
//! author's update and delete, each with its index entries.

use crate::attachments::{attachments_field, new_markdown, store_attachments, stored_markdown};
use crate::model::{self, Post};
use crate::{
    DELETED, MAX_CONTENT, MAX_KEYWORD_CHARS, MAX_KEYWORDS, MAX_METADATA, MAX_PAYLOAD, index,
};
use marketplace_common::hex;
use marketplace_guest::posts::{self, record_key};
use marketplace_guest::prelude::*;
use marketplace_guest::quota::Quota;
use marketplace_guest::{Body, ids};

/// The `keywords` member, validated (None when absent).
fn keywords_field(body: &mut Body) -> Option<Vec<String>> {
    let mut keywords = Vec::new();
    match body.raw("keywords").cloned() {
        None => return None,
        Some(Value::Array(list)) if list.len() <= MAX_KEYWORDS => {
            for k in list {
                match k.as_str() {
                    Some(s) if !marketplace_guest::is_blank(s) && s.chars().count() <= MAX_KEYWORD_CHARS => {
                        keywords.push(s.trim_matches(marketplace_guest::is_js_space).to_string())
                    }
                    _ => body.problem("keywords", format!("each keyword must be a non-empty string of at most {MAX_KEYWORD_CHARS} characters")),
                }
            }
        }
        Some(_) => body.problem(
            "keywords",
            format!("must be a list of at most {MAX_KEYWORDS} strings"),
        ),
    }
    Some(keywords)
}

/// The `activity_metadata` member, validated (None when absent).
fn metadata_field(body: &mut Body) -> Option<Value> {
    match body.raw("activity_metadata").cloned() {
        None => None,
        Some(v @ Value::Object(_)) if v.to_string().len() <= MAX_METADATA => Some(v),
        Some(Value::Object(_)) => {
            body.problem(
                "activity_metadata",
                format!("must be at most {MAX_METADATA} bytes as JSON"),
            );
            Some(Value::Null)
        }
        Some(_) => {
            body.problem("activity_metadata", "must be an object");
            Some(Value::Null)
        }
    }
}

pub(crate) fn create(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let post_type = body
        .optional_str("post_type", 64)
        .unwrap_or_else(|| "general".into());
    if !posts::is_post_type(&post_type) {
        body.problem("post_type", posts::POST_TYPE_RULE);
    }
    let private = post_type == model::PRIVATE_REPLY;
    // A private reply's text is its opaque payload; its content is "".
    let content = if private {
        match body.raw("content") {
            None => Some(String::new()),
            Some(Value::String(s)) if s.is_empty() => Some(String::new()),
            Some(_) => {
                body.problem(
                    "content",
                    "must be empty for a private reply (the text goes in encrypted_payload)",
                );
                None
            }
        }
    } else {
        body.required_str("content", MAX_CONTENT)
    };
    // "" is no parent, as null is (and as for the other optional ids).
    let parent_id = body.optional_str("parent_id", 64).filter(|p| !p.is_empty());
    let (recipient, payload) = if private {
        if parent_id.is_none() {
            body.problem("parent_id", "is required for a private reply");
        }
        let recipient = body.required_str("recipient_fingerprint", 64);
        let recipient = match recipient {
            Some(r) if hex::is_fingerprint(&r) => Some(r.to_ascii_lowercase()),
            Some(_) => {
                body.problem("recipient_fingerprint", "must be 64 hex characters");
                None
            }
            None => None,
        };
        let payload = body.required_str("encrypted_payload", MAX_PAYLOAD);
        (recipient, payload)
    } else {
        (None, None)
    };
    let keywords = keywords_field(&mut body).unwrap_or_default();
    let activity_metadata = metadata_field(&mut body).unwrap_or_else(|| json!({}));
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("author_fingerprint")?;
    let attachments = attachments_field(&body, body.text("author_fingerprint").as_deref())?;
    let content = content.unwrap_or_default();

    // The signature check is the costly part: done before payment, which
    // opens the write transaction that concurrent posts take turns on.
    let (author, message, signature) = (
        body.text("author_fingerprint"),
        format!("post:{}", payload.as_deref().unwrap_or(&content)),
        body.text("signature"),
    );
    precheck(author.as_deref(), &message, signature.as_deref(), timestamp);
    let payment = charge(
        if parent_id.is_some() {
            "comment"
        } else {
            "post"
        },
        None,
    )?;
    let (author, reused) = verify_in_order(
        "author_fingerprint",
        author.as_deref(),
        &message,
        signature.as_deref(),
        timestamp,
        false,
        true,
    )?;
    require_identity(&author)?;
    let mut parent = match &parent_id {
        Some(pid) => Some(
            model::load(pid)?.ok_or_else(|| ApiError::not_found(format!("parent post {pid}")))?,
        ),
        None => None,
    };
    // A private reply to nobody could never be read by its addressee.
    if let Some(r) = &recipient
        && !marketplace_guest::registered(r)?
    {
        return Err(ApiError::not_found(format!("recipient identity {r}")));
    }
    reused.check()?;

    let post_id = ["post_", &ids::ulid()].concat();
    let meta = store_attachments(&post_id, &attachments)?;
    let post = Post {
        post_id: post_id.clone(),
        parent_id: parent_id.clone(),
        author_fingerprint: author.clone(),
        content,
        post_type: post_type.clone(),
        keywords,
        attachments: meta,
        activity_metadata,
        created_at: marketplace_guest::now_rfc3339(),
        comment_count: 0,
        recipient_fingerprint: recipient,
        encrypted_payload: payload,
        listing: Some(marketplace_guest::posts::listing(
            attachments.iter().map(|a| a.filename.as_str()),
        )),
    };
    let record = post.save()?;
    if let Some(p) = parent.as_mut() {
        kv::put_raw(&["children/", &p.post_id, "/", &post_id].concat(), b"")?;
        p.comment_count += 1;
        kv::put(&record_key(&p.post_id), p)?;
    }
    // A private reply is reachable by id and through its parent only.
    if !private {
        // Keys put together with `concat`: `format!` is dear in a component.
        kv::put_raw(&["type/", &post_type, "/", &post_id].concat(), b"")?;
        kv::put_raw(&["author/", &author, "/", &post_id].concat(), b"")?;
        let count_key = ["author_count/", &author].concat();
        let count: u64 = kv::get(&count_key)?.unwrap_or(0);
        kv::put(&count_key, &(count + 1))?;
        index::add(&post, &new_markdown(&attachments))?;
    }
    // Members in name order, as the answer has always listed them.
    Ok(json_members(
        201,
        &[
            ("payment", &json_text(&payment)),
            ("post", &model::render_one(&record)?),
            ("post_id", &json_text(&post_id)),
        ],
    ))
}

/// The post a signed author request names, checked in the protocol's
/// order: 400 (body), 401 (signature, identity), 404 (post), 403 (not the
/// author), 409 (a signature used already). `require_fresh`: a legacy
/// (untimestamped) signature is refused.
fn authored_post(
    body: &Body,
    post_id: &str,
    timestamp: Option<u64>,
    action: &str,
    require_fresh: bool,
) -> Result<Post, ApiError> {
    let (author, reused) = verify_in_order(
        "author_fingerprint",
        body.text("author_fingerprint").as_deref(),
        &format!("{action}:{post_id}"),
        body.text("signature").as_deref(),
        timestamp,
        require_fresh,
        false,
    )?;
    require_identity(&author)?;
    let post =
        model::load(post_id)?.ok_or_else(|| ApiError::not_found(format!("post {post_id}")))?;
    if post.author_fingerprint != author {
        return Err(ApiError::new(
            403,
            "forbidden_party",
            "only the post's author may change it",
        ));
    }
    reused.check()?;
    Ok(post)
}

/// Updates one author makes in an hour (`updates_per_hour`, 1 to a
/// million; default 120), freshly signed and legacy-signed counted apart. An update is free and re-indexes the post: an
/// outside probe sent one author's 1.5 MB update again and again from 32
/// addresses (a legacy signature is reusable) and held paid posts for
/// seconds.
pub(crate) const UPDATES: Quota = Quota {
    setting: "updates_per_hour",
    default: 120,
    max: 1_000_000,
    window_ms: 3_600_000,
};

/// `POST /api/posts/update`: the author replaces members of a post (free).
pub(crate) fn update(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let post_id = body.required_str("post_id", 64).unwrap_or_default();
    let timestamp = body.optional_u64("timestamp");
    let content = match body.raw("content") {
        None => None,
        Some(_) => body.required_str("content", MAX_CONTENT),
    };
    let keywords = keywords_field(&mut body);
    let activity_metadata = metadata_field(&mut body);
    body.finish_signed("author_fingerprint")?;
    let attachments = match body.raw("attachments") {
        None => None,
        Some(_) => Some(attachments_field(
            &body,
            body.text("author_fingerprint").as_deref(),
        )?),
    };
    // An update's legacy signature signs no content: the operator may
    // require the fresh form for it.
    let fresh = !marketplace_guest::legacy_updates();
    let mut post = authored_post(&body, &post_id, timestamp, "update_post", fresh)?;
    // A legacy signature is reusable by whoever holds it: its updates are
    // counted apart, so that they cannot use up the author's own.
    let bucket = if timestamp.is_some() { "" } else { "legacy/" };
    let key = format!("updates/{bucket}{}", post.author_fingerprint);
    let counted = UPDATES.take(&key, |count, next| {
        format!(
            "this identity has updated posts {count} times this hour, the most one identity may an hour; it may update again from {next}"
        )
    })?;
    if let Some(refused) = counted {
        return Ok(refused);
    }
    if post.is_private() && content.is_some() {
        return Err(ApiError::invalid(
            "content",
            "a private reply has no content (its text is the encrypted_payload)",
        ));
    }
    // The index follows what it is made of: an update of the metadata
    // alone leaves it (re-indexing reads the stored attachments again).
    // One that sends any of them re-indexes, even unchanged: that is how
    // a post indexed under older rules is brought up to date.
    let reindex =
        !post.is_private() && (content.is_some() || keywords.is_some() || attachments.is_some());
    if reindex {
        index::remove(&post, || stored_markdown(&post))?;
    }
    if let Some(c) = content {
        post.content = c;
    }
    if let Some(k) = keywords {
        post.keywords = k;
    }
    if let Some(m) = activity_metadata {
        post.activity_metadata = m;
    }
    if let Some(list) = &attachments {
        for a in post.attachments.iter().filter(|a| a.s3_key.is_none()) {
            kv::delete(&format!("att/{}/{:04}", post.post_id, a.index))?;
        }
        post.attachments = store_attachments(&post.post_id, list)?;
        post.listing = Some(marketplace_guest::posts::listing(
            list.iter().map(|a| a.filename.as_str()),
        ));
    }
    let record = post.save()?;
    if reindex {
        match &attachments {
            Some(list) => index::add(&post, &new_markdown(list))?,
            None => {
                let texts = stored_markdown(&post)?;
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                index::add(&post, &texts)?;
            }
        }
    }
    Ok(json_members(200, &[("post", &model::render_one(&record)?)]))
}

/// `POST /api/posts/delete`: the author removes a post from everywhere.
pub(crate) fn delete(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let post_id = body.required_str("post_id", 64).unwrap_or_default();
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("author_fingerprint")?;
    let post = authored_post(&body, &post_id, timestamp, "delete_post", false)?;
    let id = &post.post_id;
    if !post.is_private() {
        index::remove(&post, || stored_markdown(&post))?;
        kv::delete(&format!("type/{}/{id}", post.post_type))?;
        kv::delete(&format!("author/{}/{id}", post.author_fingerprint))?;
        let count_key = format!("author_count/{}", post.author_fingerprint);
        let count: u64 = kv::get(&count_key)?.unwrap_or(0);
        kv::put(&count_key, &count.saturating_sub(1))?;
    }
    if let Some(pid) = &post.parent_id {
        // Its `children/` entry stays, marked deleted, and so do its
        // replies' under it: a thread walks through a deleted comment to
        // the replies below it.
        // (None when the thread's root went first: no entry to mark.)
        let entry = format!("children/{pid}/{id}");
        if kv::get_raw(None, &entry)?.is_some() {
            kv::put_raw(&entry, DELETED)?;
        }
        if let Some(mut parent) = model::load(pid)? {
            parent.comment_count = parent.comment_count.saturating_sub(1);
            kv::put(&record_key(pid), &parent)?;
        }
    }
    // Uploads stay with the identity family.
    for a in post.attachments.iter().filter(|a| a.s3_key.is_none()) {
        kv::delete(&format!("att/{id}/{:04}", a.index))?;
    }
    // A top-level post's thread goes with it; its replies stay readable by
    // id.
    if post.parent_id.is_none() {
        for (key, _) in kv::scan_prefix(None, &format!("children/{id}/"), false, 100_000)? {
            kv::delete(&key)?;
        }
    }
    kv::delete(&record_key(id))?;
    Ok(json(200, &json!({"post_id": id, "deleted": true})))
}
