//! Entity tags as conditional requests compare them (RFC 9110 8.8.3 and
//! 13.1): the host judges `If-Match` and `If-None-Match` by them, and a
//! plugin may answer `If-None-Match` itself before it reads what it would
//! send (the timeline's attachments).

/// Whether `tag` is in the comma-separated tag list `list` (`*` names
/// any), compared strongly (both tags strong and equal: `If-Match`) or
/// weakly (equal but for `W/`: `If-None-Match`).
pub fn listed(list: &str, tag: &str, strong: bool) -> bool {
    fn opaque(t: &str) -> &str {
        t.strip_prefix("W/").unwrap_or(t)
    }
    list.split(',').map(str::trim).any(|t| {
        t == "*"
            || if strong {
                !t.starts_with("W/") && !tag.starts_with("W/") && t == tag
            } else {
                opaque(t) == opaque(tag)
            }
    })
}

#[cfg(test)]
mod tests {
    use super::listed;

    #[test]
    fn tags_compare_strongly_or_weakly() {
        let tag = "\"t1\"";
        for (list, strong, weak) in [
            ("\"t1\"", true, true),
            ("W/\"t1\"", false, true),
            ("\"x\", W/\"t1\"", false, true),
            (" \"x\" ,\"t1\"", true, true),
            ("*", true, true),
            ("\"x\"", false, false),
            ("W/\"x\"", false, false),
            ("", false, false),
        ] {
            assert_eq!(listed(list, tag, true), strong, "{list}");
            assert_eq!(listed(list, tag, false), weak, "{list}");
        }
        // A weak tag of the answer's is never a strong match.
        assert!(!listed("W/\"t1\"", "W/\"t1\"", true));
        assert!(listed("\"t1\"", "W/\"t1\"", false));
    }
}
