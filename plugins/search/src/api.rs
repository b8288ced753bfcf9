//! The routes of the `search` family and their OpenAPI.

use marketplace_guest::openapi::{self, LIMIT, Op, op};
use marketplace_guest::prelude::*;

/// Every operation of the family.
pub const OPS: &[Op] = &[Op {
    query: &[
        ("term", "string", true, "words to find (case-insensitive)"),
        LIMIT,
        ("post_type", "string", false, "filter"),
    ],
    ok: (200, "SearchResults"),
    errors: &[400],
    ..op(
        "GET",
        "/api/search",
        "search",
        "search",
        "Search posts",
        "BM25 ranking over content, keywords and markdown attachments (case-insensitive words; several words match any, a post's score sums its words' parts; equal scores newest first). The page is the top `limit` of that ranking: when the words' postings number at most 1,000 in all (the operator's `[settings.search] whole_read`) they are read whole; otherwise each word's postings are read best first until no post unread could enter the page (a posting placed by its score when indexed), within bounds on the work of one query: several words without `post_type` read at most 1,200 postings, one word or a filtered query 5,000, and a post's other words are looked up for at most 160 posts of up to 1,024 weighted words; past them the page is the best of what was read. `total` is exact for a one-word query without `post_type` and when every word's postings were read to the end (always when read whole); otherwise it is at least the posts found. A post is found by its first 128 KiB of text and 16,384 words (keywords first, then content, then markdown attachments) and, of their distinct words, the 2,048 it uses most. `results` holds at most 4 MiB of stored posts (at least one): a page of very large posts may list fewer than `limit`.",
    )
}];

/// The component schemas the operations reference (besides the host's).
pub fn schemas() -> Value {
    json!({
        "SearchResults": openapi::search_results(),
        "Post": openapi::post(),
    })
}

/// What the family serves (its `describe-api` export): the operations and
/// the schemas they reference.
pub fn api() -> marketplace_guest::types::Api {
    openapi::api(OPS, schemas())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_resolve() {
        assert_eq!(openapi::check(OPS, &schemas()), Ok(()));
    }

    #[test]
    fn routes_are_the_familys() {
        let expected = [("GET", "/api/search", false)];
        assert_eq!(openapi::routes_of(&api()), expected);
    }
}
