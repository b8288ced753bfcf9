//! Endpoint-family plugins: request/response helpers, typed storage and the
//! export macro.

use crate::endpoint_bindings::marketplace::plugin::log;
/// The raw WIT types (request, response, ...).
pub use crate::endpoint_bindings::marketplace::plugin::types;
use crate::error::ApiError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use crate::endpoint_bindings::marketplace::plugin::{
    arbiter, auth, clock, dispatch, escrow, host, ids, limits, memo, payments, storage,
};
pub use types::{PluginInfo, Refusal};

/// A routed request (see `types.request` in the WIT).
pub struct Request(pub types::Request);

/// A response (see `types.response` in the WIT).
pub type Response = types::Response;

/// What an endpoint-family plugin implements.
pub trait Endpoint {
    /// The plugin's name as reported by `describe`.
    const NAME: &'static str;
    /// The operator's settings this component reads: when declared, each
    /// load refuses a value a setting's check refuses and logs a key not
    /// among them ([`crate::settings`]); `None` checks nothing.
    const SETTINGS: Option<&'static [crate::Setting]> = None;
    /// Handle one request; an `Err` becomes the JSON error answer.
    fn handle(req: &Request) -> Result<Response, ApiError>;
    /// The routes this family serves and their OpenAPI, exported as
    /// `handler.describe-api` (called by the host at load, with no host
    /// interface available): usually [`crate::openapi::api`] over the
    /// family's operation table.
    fn api() -> types::Api;
}

impl Request {
    pub fn method(&self) -> &str {
        &self.0.method
    }
    pub fn route(&self) -> &str {
        &self.0.route
    }
    pub fn path(&self) -> &str {
        &self.0.path
    }
    pub fn body(&self) -> &[u8] {
        &self.0.body
    }

    /// A `{name}` path parameter (always present for the matched route).
    pub fn param(&self, name: &str) -> &str {
        find(&self.0.params, name).unwrap_or("")
    }

    /// A query parameter (first occurrence).
    pub fn query(&self, name: &str) -> Option<&str> {
        find(&self.0.query, name)
    }

    /// A header (lower-case name).
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.0.headers, name)
    }

    /// Every line of header `name` (lower case), in order: for a header
    /// that must come once, a second line is the client's error, not one
    /// for [`Request::header`]'s first to decide.
    pub fn header_lines<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers()
            .filter(move |(n, _)| *n == name)
            .map(|(_, v)| v)
    }

    /// Every header the host passed, in order (lower-case names; payment
    /// secrets never, the client's credentials only with the
    /// `credentials` grant).
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// An optional integer query parameter within `min..=max` (empty is
    /// absent); anything else is a 400 naming the parameter (never
    /// silently clamped).
    pub fn query_int(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        match self.query(name) {
            // Empty is absent, as PROTOCOL writes queries (`?limit=&...`)
            // and as a form sends a field left blank.
            None | Some("") => Ok(None),
            Some(raw) => match marketplace_common::uint::parse(raw) {
                Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
                _ => Err(ApiError::invalid(
                    name,
                    format!("must be an integer from {min} to {max}"),
                )),
            },
        }
    }

    /// The body as a JSON object (400 `invalid_request` otherwise).
    pub fn json_object(&self) -> Result<serde_json::Map<String, Value>, ApiError> {
        match serde_json::from_slice::<Value>(&self.0.body) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Err(ApiError::invalid("body", "must be a JSON object")),
            Err(e) => Err(ApiError::invalid("body", format!("invalid JSON: {e}"))),
        }
    }

    /// The body deserialized into `T`; field errors become 400 details.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let value = Value::Object(self.json_object()?);
        serde_json::from_value(value).map_err(|e| ApiError::invalid("body", e.to_string()))
    }
}

/// A JSON number that is a whole number: an integer, or a float without a
/// fraction (`37632671.0`, `2.0`: JSON Schema's integers) within the
/// doubles' exact range (+-2^53).
pub fn whole_number(n: &serde_json::Number) -> Option<i64> {
    n.as_i64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15)
            .map(|f| f as i64)
    })
}

/// A JSON number that is a non-negative whole number as a u64: an integer
/// up to 2^64 - 1, or a float without a fraction below 2^64.
pub fn whole_u64(n: &serde_json::Number) -> Option<u64> {
    // 2^64: a float at or past it is out of range (every float from 2^53
    // on is whole).
    const END: f64 = 18_446_744_073_709_551_616.0;
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < END)
            .map(|f| f as u64)
    })
}

fn find<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A JSON response.
pub fn json<T: Serialize + ?Sized>(status: u16, value: &T) -> Response {
    Response {
        status,
        headers: vec![],
        body: serde_json::to_vec(value).unwrap_or_default(),
    }
}

/// A JSON object of `members` (name, value), the values moved in.
/// (`json!` copies every value it is given through a serializer: a
/// member that is a large `Value` costs a deep copy there, none here.)
pub fn object<const N: usize>(members: [(&str, Value); N]) -> Value {
    Value::Object(
        members
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect(),
    )
}

/// A JSON object response whose member values are already JSON text:
/// `members` as (name, value), written in the order given. Names are
/// written as they are (plain ASCII names, nothing to escape).
pub fn json_members(status: u16, members: &[(&str, &str)]) -> Response {
    let len: usize = members.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    let mut body = Vec::with_capacity(len + 2);
    body.push(b'{');
    for (i, (name, value)) in members.iter().enumerate() {
        debug_assert!(!name.contains(['"', '\\']), "member name {name:?}");
        if i > 0 {
            body.push(b',');
        }
        body.push(b'"');
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(b"\":");
        body.extend_from_slice(value.as_bytes());
    }
    body.push(b'}');
    Response {
        status,
        headers: vec![],
        body,
    }
}

/// JSON text of a value (`null` should it not serialize).
pub fn json_text<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

impl From<ApiError> for Response {
    fn from(e: ApiError) -> Response {
        json(e.status, &e.body())
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> ApiError {
        let mut e = ApiError::new(r.status, &r.code, "");
        if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&r.body) {
            for (k, v) in map {
                match k.as_str() {
                    "code" => {}
                    "message" => e.message = v.as_str().unwrap_or_default().to_string(),
                    _ => {
                        e.extra.insert(k, v);
                    }
                }
            }
        }
        e
    }
}

/// Log a line at error level into the host log.
pub fn log_error(message: &str) {
    log::log(log::Level::Error, message);
}

/// Log a line at info level into the host log.
pub fn log_info(message: &str) {
    log::log(log::Level::Info, message);
}

/// Log a panic's message through the host before the instance traps
/// (the default hook would write to a standard stream, which the host
/// does not give a plugin). Each export calls it first.
pub fn log_panics() {
    crate::log_panics_with(|line| log::log(log::Level::Error, line));
}

/// Run a handler: panics are logged through the host before the instance
/// traps (the host then answers 500), errors become JSON answers.
pub fn run(req: types::Request, handler: fn(&Request) -> Result<Response, ApiError>) -> Response {
    log_panics();
    match handler(&Request(req)) {
        Ok(resp) => resp,
        Err(e) => e.into(),
    }
}

/// Typed access to the host's transactional key-value storage.
pub mod kv {
    use super::*;
    use storage::StorageError;

    fn map_err(e: StorageError) -> ApiError {
        match e {
            StorageError::ReadOnly => ApiError::internal("write attempted in a read-only request"),
            StorageError::UnknownKeyspace(k) => ApiError::internal(format!("unknown keyspace {k}")),
            StorageError::Forbidden(k) => {
                ApiError::internal(format!("no read grant for keyspace {k}"))
            }
            StorageError::TooLarge(m) => ApiError::new(413, "payload_too_large", m),
            StorageError::Internal(m) => ApiError::internal(format!("storage: {m}")),
        }
    }

    /// Raw bytes of `key` in `keyspace` (None = own family).
    pub fn get_raw(keyspace: Option<&str>, key: &str) -> Result<Option<Vec<u8>>, ApiError> {
        storage::get(keyspace, key.as_bytes()).map_err(map_err)
    }

    /// Raw bytes of several keys of `keyspace` (None = own family) in one
    /// host call, in the order given.
    pub fn get_many_raw(
        keyspace: Option<&str>,
        keys: &[String],
    ) -> Result<Vec<Option<Vec<u8>>>, ApiError> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        storage::get_many(keyspace, &keys).map_err(map_err)
    }

    /// Most keys one get-many names (the host refuses more).
    pub use marketplace_common::MAX_GET_MANY;

    /// Several keys' raw values in one buffer (`get-many-packed`): read
    /// them in place with [`Packed::values`].
    pub fn get_many_packed(keyspace: Option<&str>, keys: &[String]) -> Result<Packed, ApiError> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        storage::get_many_packed(keyspace, &keys)
            .map(Packed)
            .map_err(map_err)
    }

    /// [`get_many_packed`] of any number of keys: one host call per
    /// [`MAX_GET_MANY`] of them, the buffers in the keys' order.
    pub fn get_many_chunked(
        keyspace: Option<&str>,
        keys: &[String],
    ) -> Result<Vec<Packed>, ApiError> {
        keys.chunks(MAX_GET_MANY)
            .map(|chunk| get_many_packed(keyspace, chunk))
            .collect()
    }

    /// A range scan in one buffer (`scan-packed`): read it in place with
    /// [`Packed::entries`].
    pub fn scan_packed(
        keyspace: Option<&str>,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: u32,
    ) -> Result<Packed, ApiError> {
        storage::scan_packed(keyspace, start, end, reverse, limit)
            .map(Packed)
            .map_err(map_err)
    }

    /// [`get_many_packed`] of the first keys of `keys`: at most `*chunk` of
    /// them, fewer when their values would pass the host's byte budget for
    /// one call (`max_call_bytes`): `*chunk` is then halved until the
    /// answer fits, and stays so for the caller's next calls. The answer
    /// and how many keys it covers; a single value over the budget is the
    /// error (413). For reads of records whose size a stranger chooses.
    pub fn get_many_fitting(
        keyspace: Option<&str>,
        keys: &[String],
        chunk: &mut usize,
    ) -> Result<(Packed, usize), ApiError> {
        loop {
            let n = (*chunk).max(1).min(keys.len());
            let named: Vec<Vec<u8>> = keys[..n].iter().map(|k| k.as_bytes().to_vec()).collect();
            match storage::get_many_packed(keyspace, &named) {
                Ok(b) => return Ok((Packed(b), n)),
                Err(StorageError::TooLarge(_)) if n > 1 => *chunk = n / 2,
                Err(e) => return Err(map_err(e)),
            }
        }
    }

    /// [`scan_packed`] of at most `*limit` rows, fewer when they would pass
    /// the host's byte budget for one call: `*limit` is halved until the
    /// answer fits (see [`get_many_fitting`]).
    pub fn scan_fitting(
        keyspace: Option<&str>,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: &mut u32,
    ) -> Result<Packed, ApiError> {
        loop {
            match storage::scan_packed(keyspace, start, end, reverse, *limit) {
                Ok(b) => return Ok(Packed(b)),
                Err(StorageError::TooLarge(_)) if *limit > 1 => *limit /= 2,
                Err(e) => return Err(map_err(e)),
            }
        }
    }

    /// A packed storage answer: length-prefixed parts (little-endian u32;
    /// `u32::MAX` marks an absent value).
    pub struct Packed(Vec<u8>);

    impl Packed {
        fn parts(&self) -> impl Iterator<Item = Option<&[u8]>> {
            let mut rest = self.0.as_slice();
            std::iter::from_fn(move || {
                let (len, tail) = rest.split_first_chunk::<4>()?;
                let len = u32::from_le_bytes(*len);
                if len == u32::MAX {
                    rest = tail;
                    return Some(None);
                }
                let (part, tail) = tail.split_at_checked(len as usize)?;
                rest = tail;
                Some(Some(part))
            })
        }

        /// The values of a packed get-many, in the order of the keys.
        pub fn values(&self) -> impl Iterator<Item = Option<&[u8]>> {
            self.parts()
        }

        /// The (key, value) entries of a packed scan, in scan order.
        pub fn entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
            let mut parts = self.parts();
            std::iter::from_fn(move || Some((parts.next()??, parts.next()??)))
        }
    }

    /// A JSON value from the own keyspace.
    pub fn get<T: DeserializeOwned>(key: &str) -> Result<Option<T>, ApiError> {
        get_in(None, key)
    }

    /// A JSON value from another family's keyspace (read-only).
    pub fn get_in<T: DeserializeOwned>(
        keyspace: Option<&str>,
        key: &str,
    ) -> Result<Option<T>, ApiError> {
        get_raw(keyspace, key)?
            .map(|bytes| parse(key, &bytes))
            .transpose()
    }

    /// A stored JSON value read back (500 `internal` naming `key` when it
    /// does not parse).
    pub fn parse<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, ApiError> {
        serde_json::from_slice(bytes)
            .map_err(|e| ApiError::internal(format!("corrupt value at {key}: {e}")))
    }

    /// Store raw bytes in the own keyspace.
    pub fn put_raw(key: &str, value: &[u8]) -> Result<(), ApiError> {
        storage::put(key.as_bytes(), value).map_err(map_err)
    }

    /// The largest piece [`put_large`] stores under one key: a MiB, less
    /// room for the key and redb's leaf header, so that a piece takes one
    /// 1 MiB allocation. (redb gives a value of its own a power of two of
    /// pages: an 8 MiB upload in one value took 16 MiB of the file.)
    pub const PIECE_BYTES: usize = (1 << 20) - 1024;

    /// Store a large value (an upload) in the own keyspace, in pieces of
    /// [`PIECE_BYTES`]: the first at `key`, the next at `key/1`, `key/2`...
    /// (so `key` must not be one of whose `key/N` another value is kept).
    /// Read it back with [`get_large`], given its size.
    pub fn put_large(key: &str, value: &[u8]) -> Result<(), ApiError> {
        let mut pieces = value.chunks(PIECE_BYTES);
        put_raw(key, pieces.next().unwrap_or_default())?;
        for (n, piece) in pieces.enumerate() {
            put_raw(&format!("{key}/{}", n + 1), piece)?;
        }
        Ok(())
    }

    /// A value of `size` bytes [`put_large`] stored (or one stored whole
    /// by [`put_raw`] before: its first piece is all of it), read into one
    /// buffer of that size, a piece at a time. A piece missing, or bytes
    /// other than `size` in all, is a 500: never a short file served as
    /// whole. (`size` 0, unknown, takes what the first key holds.)
    pub fn get_large(
        keyspace: Option<&str>,
        key: &str,
        size: u64,
    ) -> Result<Option<Vec<u8>>, ApiError> {
        let Some(first) = get_raw(keyspace, key)? else {
            return Ok(None);
        };
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size <= first.len() {
            return Ok(Some(first));
        }
        let mut value = Vec::with_capacity(size);
        value.extend_from_slice(&first);
        drop(first);
        let mut n = 1;
        while value.len() < size {
            let piece = get_raw(keyspace, &format!("{key}/{n}"))?
                .filter(|p| !p.is_empty())
                .ok_or_else(|| ApiError::internal(format!("{key}: piece {n} missing")))?;
            value.extend_from_slice(&piece);
            n += 1;
        }
        if value.len() != size {
            return Err(ApiError::internal(format!(
                "{key}: {} bytes stored, {size} recorded",
                value.len()
            )));
        }
        Ok(Some(value))
    }

    /// Store a JSON value in the own keyspace.
    pub fn put<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<(), ApiError> {
        let bytes = serde_json::to_vec(value).map_err(|e| ApiError::internal(e.to_string()))?;
        put_raw(key, &bytes)
    }

    /// Delete a key from the own keyspace; true when it existed.
    pub fn delete(key: &str) -> Result<bool, ApiError> {
        storage::delete(key.as_bytes()).map_err(map_err)
    }

    /// Entries whose key starts with `prefix`, in key order (or reversed),
    /// starting at or below `from` when given, at most `limit`.
    pub fn scan_prefix(
        keyspace: Option<&str>,
        prefix: &str,
        reverse: bool,
        limit: u32,
    ) -> Result<Vec<(String, Vec<u8>)>, ApiError> {
        let start = prefix.as_bytes().to_vec();
        let end = prefix_end(prefix.as_bytes());
        let entries =
            storage::scan(keyspace, &start, end.as_deref(), reverse, limit).map_err(map_err)?;
        Ok(entries
            .into_iter()
            .map(|e| (String::from_utf8_lossy(&e.key).into_owned(), e.value))
            .collect())
    }

    /// The smallest key greater than every key with this prefix.
    pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
        let mut end = prefix.to_vec();
        while let Some(last) = end.pop() {
            if last < 0xff {
                end.push(last + 1);
                return Some(end);
            }
        }
        None
    }

    #[cfg(test)]
    mod tests {
        use super::Packed;

        #[test]
        fn packed_parts_read_back_in_place() {
            let mut buf = Vec::new();
            for part in [&b"k1"[..], b"v1", b"", b"value two"] {
                buf.extend_from_slice(&(part.len() as u32).to_le_bytes());
                buf.extend_from_slice(part);
            }
            let packed = Packed(buf.clone());
            let entries: Vec<_> = packed.entries().collect();
            assert_eq!(
                entries,
                [(&b"k1"[..], &b"v1"[..]), (&b""[..], &b"value two"[..])]
            );
            buf.extend_from_slice(&u32::MAX.to_le_bytes());
            let with_absent = Packed(buf.clone());
            let values: Vec<_> = with_absent.values().collect();
            assert_eq!(values.len(), 5);
            assert_eq!(values[4], None);
            // A truncated buffer ends the parts instead of reading past it.
            buf.extend_from_slice(&9u32.to_le_bytes());
            buf.extend_from_slice(b"abc");
            assert_eq!(Packed(buf).values().count(), 5);
        }
    }
}

/// Export a type implementing [`Endpoint`] as the component's `handler`.
#[macro_export]
macro_rules! endpoint_plugin {
    ($ty:ty) => {
        struct __MarketplaceExport;
        impl $crate::endpoint_bindings::exports::marketplace::plugin::handler::Guest
            for __MarketplaceExport
        {
            fn handle(
                req: $crate::endpoint_bindings::marketplace::plugin::types::Request,
            ) -> $crate::Response {
                $crate::run(req, <$ty as $crate::Endpoint>::handle)
            }
            fn describe() -> $crate::PluginInfo {
                $crate::log_panics();
                $crate::settings::check_endpoint(<$ty as $crate::Endpoint>::SETTINGS);
                $crate::PluginInfo {
                    name: <$ty as $crate::Endpoint>::NAME.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                }
            }
            fn describe_api() -> $crate::endpoint_bindings::marketplace::plugin::types::Api {
                $crate::log_panics();
                <$ty as $crate::Endpoint>::api()
            }
        }
        $crate::endpoint_bindings::export_endpoint!(__MarketplaceExport);
    };
}

/// Whether a text holds no character the published schemas' `\S` (the
/// `nonblank` pattern, an ECMAScript regular expression) would match:
/// ECMAScript's white space is Unicode's, plus U+FEFF, less U+0085.
pub fn is_blank(s: &str) -> bool {
    s.chars().all(is_js_space)
}

/// A character ECMAScript's `\s` matches (see [`is_blank`]); for trimming
/// as the schemas read a text.
pub fn is_js_space(c: char) -> bool {
    (c.is_whitespace() && c != '\u{85}') || c == '\u{feff}'
}

/// The upload id of an `s3_key` (`files/{id}`, id ASCII alphanumeric, at
/// most 128), as the identity family hands them out; the schemas'
/// [`UPLOAD_KEY_PATTERN`].
pub fn upload_id(s3_key: &str) -> Option<&str> {
    s3_key.strip_prefix("files/").filter(|id| is_upload_id(id))
}

/// Whether `id` has the form of an upload's id (ASCII alphanumeric, 1 to
/// 128), as the identity family hands them out.
pub fn is_upload_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// What [`upload_id`] takes, as a published schema's pattern.
pub const UPLOAD_KEY_PATTERN: &str = "files/[A-Za-z0-9]{1,128}";

/// A JSON object body with field-level validation: problems accumulate and
/// [`Body::finish`] turns them into one 400 `invalid_request` with details.
pub struct Body {
    map: serde_json::Map<String, Value>,
    problems: Vec<crate::Detail>,
}

impl Body {
    /// Parse the request body as a JSON object (400 otherwise).
    pub fn parse(req: &Request) -> Result<Body, ApiError> {
        Ok(Body {
            map: req.json_object()?,
            problems: Vec::new(),
        })
    }

    /// Record a problem with a field.
    pub fn problem(&mut self, field: &str, problem: impl Into<String>) {
        self.problems.push(crate::Detail {
            field: field.to_string(),
            problem: problem.into(),
        });
    }

    /// The raw value of a member.
    pub fn raw(&self, field: &str) -> Option<&Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    /// A string member as sent, without validation (e.g. signatures, whose
    /// absence is a 401 rather than a 400).
    pub fn text(&self, field: &str) -> Option<String> {
        self.raw(field).and_then(|v| v.as_str()).map(str::to_string)
    }

    fn string(&mut self, field: &str, max_chars: usize, required: bool) -> Option<String> {
        match self.raw(field) {
            None if required => {
                self.problem(field, "is required");
                None
            }
            None => None,
            Some(Value::String(s)) => {
                if required && is_blank(s) {
                    self.problem(field, "must not be empty or blank");
                    None
                } else if s.chars().count() > max_chars {
                    self.problem(field, format!("must be at most {max_chars} characters"));
                    None
                } else {
                    Some(s.clone())
                }
            }
            Some(_) => {
                self.problem(field, "must be a string");
                None
            }
        }
    }

    /// A required, non-empty string of at most `max_chars`.
    pub fn required_str(&mut self, field: &str, max_chars: usize) -> Option<String> {
        self.string(field, max_chars, true)
    }

    /// An optional string of at most `max_chars`.
    pub fn optional_str(&mut self, field: &str, max_chars: usize) -> Option<String> {
        self.string(field, max_chars, false)
    }

    /// An optional non-negative integer (a JSON number or a decimal string).
    pub fn optional_u64(&mut self, field: &str) -> Option<u64> {
        let parsed = match self.raw(field)? {
            Value::Number(n) => whole_u64(n),
            Value::String(s) => marketplace_common::uint::parse(s),
            _ => None,
        };
        if parsed.is_none() {
            self.problem(field, "must be a non-negative integer");
        }
        parsed
    }

    /// 400 with every recorded problem, if any. Members a route does not
    /// read are ignored (PROTOCOL 1), whatever their name: a signed route
    /// checks its own signer with [`Body::finish_signed`].
    pub fn finish(&mut self) -> Result<(), ApiError> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid_many(std::mem::take(&mut self.problems)))
        }
    }

    /// [`Body::finish`] for a signed route: its `signer` member (say
    /// `actor_fingerprint`) and `signature`, when present, must be strings,
    /// so that a malformed one is the body's 400 rather than a missing
    /// one's 401 or the 402 that comes before it (PROTOCOL 1's order). The
    /// other routes' signer members are unknown members here, and ignored.
    /// (A `timestamp` far from the clock, say one in milliseconds, is
    /// well-formed: the host answers it 401 `auth_expired`, PROTOCOL 2.)
    pub fn finish_signed(&mut self, signer: &str) -> Result<(), ApiError> {
        for field in [signer, "signature"] {
            let malformed = self.raw(field).is_some_and(|v| !v.is_string());
            // A route that checked the member itself said so already.
            if malformed && !self.problems.iter().any(|p| p.field == field) {
                self.problem(field, "must be a string");
            }
        }
        self.finish()
    }
}

/// Charge this request for `action` (402 refusals pass through unchanged).
/// Returns the `payment` member for the success body.
pub fn charge(action: &str, basis: Option<u64>) -> Result<Value, ApiError> {
    receipt_doc(payments::charge(action, basis)?)
}

/// Charge this request a price fixed earlier (e.g. a fee fixed at buy)
/// rather than a new quote. Returns the `payment` member.
pub fn charge_price(action: &str, price: u64) -> Result<Value, ApiError> {
    receipt_doc(payments::charge_price(action, price)?)
}

/// What an identical retry of this paid request (PROTOCOL 3) is answered
/// instead of this request's own answer, once it commits: `e`, for an
/// answer that must not be handed out twice (the host keeps the payment's
/// change in it).
pub fn answer_retries_with(e: &ApiError) {
    payments::retry_answer(e.status, &e.body().to_string());
}

fn receipt_doc(r: payments::Receipt) -> Result<Value, ApiError> {
    Ok(serde_json::json!({
        "action": r.action,
        "price": marketplace_common::amount::format(r.price),
        "paid": marketplace_common::amount::format(r.paid),
        "change": r.change,
    }))
}

/// Whether the operator lets a legacy (untimestamped) signature update a
/// post or a profile (`[settings.timeline]` and `[settings.identity]`
/// `legacy_updates`): yes unless set otherwise, since the original client
/// signs only that form; false (or no, off, 0; another value refuses the
/// load, see [`LEGACY_UPDATES`]) requires the fresh form (401
/// `auth_expired`), since a legacy update
/// signature signs neither the new content nor a time, so whoever holds
/// one could update again with other content.
pub fn legacy_updates() -> bool {
    crate::endpoint_bindings::marketplace::plugin::settings::get("legacy_updates")
        .is_none_or(|v| crate::settings::switch(&v).unwrap_or(false))
}

/// The `legacy_updates` setting, for [`Endpoint::SETTINGS`].
pub const LEGACY_UPDATES: crate::Setting = crate::Setting {
    key: "legacy_updates",
    check: |v| crate::settings::switch(v).map(drop),
};

/// Verify a signed statement from a request body. A missing actor (the
/// body's `signer` member) or signature is 401 `auth_required`, naming
/// that member; the rest is decided by the host.
pub fn verify(
    signer: &str,
    actor: Option<&str>,
    message: &str,
    signature: Option<&str>,
    timestamp: Option<u64>,
    require_fresh: bool,
    legacy_single_use: bool,
) -> Result<String, ApiError> {
    let (Some(actor), Some(signature)) = (actor, signature) else {
        return Err(unsigned(signer));
    };
    let statement = auth::Signed {
        actor: actor.to_string(),
        message: message.to_string(),
        signature: signature.to_string(),
        timestamp,
    };
    auth::verify(&statement, require_fresh, legacy_single_use)?;
    Ok(actor.to_string())
}

/// [`verify`] in PROTOCOL 1's order of checks (401, 404, 403, 409): a
/// signature already used (409) is held back, as `Ok((actor, Some(409)))`,
/// for the caller to answer once its 404 and 403 checks passed
/// ([`Reused::check`]); every 401 comes first, as from `verify`. The actor
/// is lower case.
pub fn verify_in_order(
    signer: &str,
    actor: Option<&str>,
    message: &str,
    signature: Option<&str>,
    timestamp: Option<u64>,
    require_fresh: bool,
    legacy_single_use: bool,
) -> Result<(String, Reused), ApiError> {
    match verify(
        signer,
        actor,
        message,
        signature,
        timestamp,
        require_fresh,
        legacy_single_use,
    ) {
        Ok(actor) => Ok((actor.to_ascii_lowercase(), Reused(None))),
        // Only a statement with its signer gets this far.
        Err(e) if e.status == 409 => Ok((
            actor.unwrap_or_default().to_ascii_lowercase(),
            Reused(Some(e)),
        )),
        Err(e) => Err(e),
    }
}

/// A used signature's 409 held back by [`verify_in_order`].
#[must_use = "answer the held-back 409 with `check()` after the 404 and 403 checks"]
pub struct Reused(Option<ApiError>);

impl Reused {
    /// The held-back 409, if any: call once the 404 and 403 checks passed.
    pub fn check(self) -> Result<(), ApiError> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Do the costly signature check of a statement ahead of [`verify`] (for
/// example before taking payment, which waits for the write transaction);
/// the later `verify` of the same statement then skips it. Errors still
/// come from `verify`, in the usual order.
pub fn precheck(
    actor: Option<&str>,
    message: &str,
    signature: Option<&str>,
    timestamp: Option<u64>,
) {
    if let (Some(actor), Some(signature)) = (actor, signature) {
        auth::precheck(&auth::Signed {
            actor: actor.to_string(),
            message: message.to_string(),
            signature: signature.to_string(),
            timestamp,
        });
    }
}

/// 401 `auth_invalid` unless `fingerprint` has a registered identity (the
/// identity family's `id/{fingerprint}`).
pub fn require_identity(fingerprint: &str) -> Result<(), ApiError> {
    if !registered(fingerprint)? {
        return Err(unregistered());
    }
    Ok(())
}

/// Whether `fingerprint` names a registered identity (read in the
/// `identity` keyspace: the family needs that read grant).
pub fn registered(fingerprint: &str) -> Result<bool, ApiError> {
    Ok(kv::get_raw(Some("identity"), &["id/", fingerprint].concat())?.is_some())
}

/// The error for a request without a signature or its signer's
/// fingerprint (the body's `signer` member, named: it differs between
/// routes, and between a contract's actions): 401 `auth_required`
/// (PROTOCOL section 2).
pub fn unsigned(signer: &str) -> ApiError {
    ApiError::new(
        401,
        "auth_required",
        format!(
            "a signature and the signer's fingerprint are required (`signature` and `{signer}`)"
        ),
    )
}

/// The error for a signer with no registered identity: 401 `auth_invalid`
/// (PROTOCOL section 2).
pub fn unregistered() -> ApiError {
    ApiError::new(
        401,
        "auth_invalid",
        "the signer has no registered identity (register the key with POST /api/identity first; a deleted identity may register again with the same key to act on its posts and contracts)",
    )
}

/// Milliseconds since the epoch as RFC 3339 UTC (second precision).
pub use marketplace_common::time::rfc3339;

/// The current host time as RFC 3339.
pub fn now_rfc3339() -> String {
    rfc3339(clock::now_ms())
}

/// From here on, should this call trap, run past its deadline or exceed its
/// memory, the host answers with `answer` instead of 500/503 (and discards
/// the call's writes). For running code a user supplied.
pub fn on_fault(answer: &Response) {
    limits::on_fault(answer);
}

/// Back to the host's own answers to a fault (after [`on_fault`]).
pub fn clear_on_fault() {
    limits::on_fault(&Response {
        status: 0,
        headers: vec![],
        body: vec![],
    });
}

/// Let the rest of this call run at most `ms` milliseconds (the host's
/// deadline is never lengthened). With [`on_fault`], a budget for user code.
pub fn limit_time(ms: u32) {
    limits::limit_time(ms);
}

/// Text kept in the family's memo under `key` (see the WIT `memo`), or
/// `render`'s, kept there for the next request. For text derived only from
/// what stays the same until the next load of components: a request that
/// began after a load never reads what was kept before it.
pub fn memoized(
    key: &str,
    render: impl FnOnce() -> Result<String, ApiError>,
) -> Result<String, ApiError> {
    if let Some(text) = memo::get(key).and_then(|b| String::from_utf8(b).ok()) {
        return Ok(text);
    }
    let text = render()?;
    memo::put(key, text.as_bytes());
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::{Body, is_blank};
    use serde_json::json;

    fn finished(body: serde_json::Value, signer: Option<&str>) -> Vec<String> {
        let mut b = Body {
            map: body.as_object().unwrap().clone(),
            problems: Vec::new(),
        };
        let finished = match signer {
            Some(signer) => b.finish_signed(signer),
            None => b.finish(),
        };
        match finished {
            Ok(()) => vec![],
            Err(e) => e.message.split("; ").map(str::to_string).collect(),
        }
    }

    #[test]
    fn whole_u64_takes_every_whole_number_in_range_integer_or_float() {
        let of = |text: &str| super::whole_u64(&serde_json::from_str(text).unwrap());
        assert_eq!(of("7"), Some(7));
        assert_eq!(of("7.0"), Some(7));
        assert_eq!(of("-0.0"), Some(0));
        assert_eq!(of("18446744073709551615"), Some(u64::MAX));
        // Floats past 2^53 are whole: taken while below 2^64.
        assert_eq!(of("9007199254740994.0"), Some(9_007_199_254_740_994));
        assert_eq!(of("1e19"), Some(10_000_000_000_000_000_000));
        assert_eq!(of("1.8446744073709552e19"), None);
        assert_eq!(of("18446744073709551616"), None);
        assert_eq!(of("7.5"), None);
        // Read exactly (serde_json's `float_roundtrip`): without it some
        // sixteen-digit whole numbers read half a unit off (a fraction).
        for whole in [
            4_066_452_749_427_722u64,
            4_204_811_195_382_938,
            4_162_850_254_820_186,
        ] {
            assert_eq!(of(&format!("{whole}.0")), Some(whole));
        }
        assert_eq!(of("-1"), None);
        assert_eq!(of("-1.0"), None);
    }

    #[test]
    fn a_signed_route_checks_its_own_signer_and_ignores_the_others() {
        // Unknown members are ignored, whatever their name (PROTOCOL 1),
        // other routes' signer members included.
        let foreign = json!({"referrer_fingerprint": 5, "seller_fingerprint": [[]], "extra": [1]});
        assert!(finished(foreign.clone(), None).is_empty());
        assert!(finished(foreign, Some("actor_fingerprint")).is_empty());
        // A null signer is an absent one (401 later, not 400).
        assert!(
            finished(
                json!({"actor_fingerprint": null}),
                Some("actor_fingerprint")
            )
            .is_empty()
        );
        for member in ["actor_fingerprint", "signature"] {
            let problems = finished(json!({ member: 5 }), Some("actor_fingerprint"));
            assert_eq!(problems.len(), 1, "{member}: {problems:?}");
            assert!(problems[0].starts_with(member), "{problems:?}");
            // An unsigned route does not read either.
            assert!(finished(json!({ member: 5 }), None).is_empty());
        }
    }

    #[test]
    fn blank_as_the_schemas_nonblank_pattern_reads_it() {
        for blank in ["", " ", "\t\n\r", "\u{a0}\u{3000}", "\u{feff}", "\u{2028}"] {
            assert!(is_blank(blank), "{blank:?}");
        }
        // ECMAScript's \S matches these.
        for text in ["a", " x ", "\u{85}", "\u{200b}"] {
            assert!(!is_blank(text), "{text:?}");
        }
    }
}
