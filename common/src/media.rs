//! Media types (RFC 6838 and RFC 9110 8.3.1), as clients name what they
//! upload or attach, and as the service serves them back in
//! `Content-Type`.

/// Longest media type taken, parameters included.
pub const MAX_MEDIA_TYPE: usize = 255;

/// [`is_media_type`] as an ECMA-262 regular expression (for OpenAPI
/// schemas), with the length checked apart.
pub const MEDIA_TYPE_PATTERN: &str = concat!(
    "^ *[A-Za-z0-9!#$%&'*+.^_`|~-]+/[A-Za-z0-9!#$%&'*+.^_`|~-]+ *",
    "(; *[A-Za-z0-9!#$%&'*+.^_`|~-]+=([A-Za-z0-9!#$%&'*+.^_`|~-]+|\"[ !#-:<-\\[\\]-~]*\") *)*$"
);

/// The characters of a type, subtype or parameter name (RFC 9110 `token`).
fn token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Whether `s` is a media type: `type/subtype`, then optional `; name=value`
/// parameters (a value a token or a quoted string of printable ASCII but
/// `"`, `;` and `\`, so no escapes to read), at
/// most [`MAX_MEDIA_TYPE`] bytes: `image/png`, `text/markdown;
/// charset=utf-8`. Anything else (`not a type`, a line break) is not.
pub fn is_media_type(s: &str) -> bool {
    if s.len() > MAX_MEDIA_TYPE || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return false;
    }
    let mut parts = s.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    token(kind)
        && token(sub)
        && parts.all(|p| {
            let Some((name, value)) = p.trim().split_once('=') else {
                return false;
            };
            let quoted = value.len() >= 2
                && value.starts_with('"')
                && value.ends_with('"')
                && !value[1..value.len() - 1].contains(['"', '\\']);
            token(name) && (token(value) || quoted)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_are_told_from_other_text() {
        for good in [
            "image/png",
            "text/markdown; charset=utf-8",
            "application/vnd.api+json",
            "text/plain;charset=\"utf-8\"",
            "multipart/form-data; boundary=abc; x=y",
            " image/png ",
            "image/png ;x=y",
        ] {
            assert!(is_media_type(good), "{good}");
        }
        for bad in [
            "",
            "not a type",
            "image",
            "/png",
            "image/",
            "image/png; charset",
            "image/png;",
            "ima ge/png",
            "image/png\r\nx-evil: 1",
            "text/plain; charset=\"a\"b\"",
            "text/plain; x=\"a;b\"",
            "text/plain; x=\"a\\\"",
            "bild/\u{e9}",
        ] {
            assert!(!is_media_type(bad), "{bad:?}");
        }
        assert!(!is_media_type(&format!("a/{}", "b".repeat(254))));
    }
}
