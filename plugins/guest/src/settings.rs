//! The operator's settings a component reads (`[settings.<family>]` in the
//! host's configuration), declared so that every load checks them: a value
//! the component cannot use refuses the load, naming the setting and what
//! it must be, and a key the component does not read is logged as having
//! no effect. Settings change only when the host restarts, so `describe`
//! (the first call of every load) sees them as requests will.

/// One setting a component reads.
pub struct Setting {
    pub key: &'static str,
    /// Reads a value as the component does: `Err` says what it must be.
    pub check: fn(&str) -> Result<(), String>,
}

/// What the operator's settings hold that the component declaring
/// `declared` cannot use: `Err` names the first unusable value, `Ok` the
/// keys it does not read (each a line to log).
pub fn review(
    declared: &[Setting],
    keys: Vec<String>,
    get: impl Fn(&str) -> Option<String>,
) -> Result<Vec<String>, String> {
    let mut unread = Vec::new();
    for key in keys {
        match declared.iter().find(|s| s.key == key) {
            Some(setting) => {
                let value = get(&key).unwrap_or_default();
                (setting.check)(&value)
                    .map_err(|must| format!("setting {key} = {value:?} must be {must}"))?;
            }
            None => {
                let known: Vec<&str> = declared.iter().map(|s| s.key).collect();
                let reads = if known.is_empty() {
                    "no setting".to_string()
                } else {
                    known.join(", ")
                };
                unread.push(format!(
                    "setting {key:?} has no effect: this component reads {reads}"
                ));
            }
        }
    }
    Ok(unread)
}

/// Check the operator's settings against `declared` at `describe` (none
/// declared: nothing is checked): `keys` and `get` are the world's
/// settings functions, `warn` and `error` its log at those levels. A key
/// not declared is a warning; an unusable value refuses the load: the
/// host quotes `why` (a line logged as the panic hook writes one) in its
/// refusal, then the instance traps.
fn check(
    declared: Option<&[Setting]>,
    keys: impl FnOnce() -> Vec<String>,
    get: impl Fn(&str) -> Option<String>,
    warn: impl Fn(&str),
    error: impl Fn(&str),
) {
    let Some(declared) = declared else { return };
    match review(declared, keys(), get) {
        Ok(unread) => unread.iter().for_each(|line| warn(line)),
        Err(why) => {
            error(&format!("plugin panicked: {why}"));
            std::process::abort()
        }
    }
}

/// [`check`] for an endpoint family's component.
#[cfg(feature = "endpoint")]
pub fn check_endpoint(declared: Option<&[Setting]>) {
    use crate::endpoint_bindings::marketplace::plugin::{log, settings};
    check(
        declared,
        settings::keys,
        settings::get,
        |line| log::log(log::Level::Warn, line),
        |line| log::log(log::Level::Error, line),
    );
}

/// [`check`] for a fee policy.
#[cfg(feature = "fee-policy")]
pub fn check_fees(declared: Option<&[Setting]>) {
    use crate::fee_bindings::marketplace::plugin::{log, settings};
    check(
        declared,
        settings::keys,
        settings::get,
        |line| log::log(log::Level::Warn, line),
        |line| log::log(log::Level::Error, line),
    );
}

/// A switch: true, yes, on or 1; false, no, off or 0 (any case).
pub fn switch(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err("true or false".into()),
    }
}

/// A whole number from `min` to `max`.
pub fn whole(value: &str, min: u64, max: u64) -> Result<u64, String> {
    match value.trim().parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("a whole number from {min} to {max}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECLARED: &[Setting] = &[
        Setting {
            key: "flag",
            check: |v| switch(v).map(drop),
        },
        Setting {
            key: "count",
            check: |v| whole(v, 0, 10).map(drop),
        },
    ];

    fn review_of(pairs: &[(&str, &str)]) -> Result<Vec<String>, String> {
        let keys = pairs.iter().map(|(k, _)| k.to_string()).collect();
        review(DECLARED, keys, |k| {
            pairs
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn usable_values_pass() {
        assert_eq!(review_of(&[("flag", "Yes"), ("count", " 10")]), Ok(vec![]));
        assert_eq!(review_of(&[]), Ok(vec![]));
    }

    #[test]
    fn an_unusable_value_is_named() {
        assert_eq!(
            review_of(&[("flag", "nope")]),
            Err("setting flag = \"nope\" must be true or false".into())
        );
        assert_eq!(
            review_of(&[("count", "11")]),
            Err("setting count = \"11\" must be a whole number from 0 to 10".into())
        );
    }

    #[test]
    fn an_unknown_key_is_reported() {
        assert_eq!(
            review_of(&[("flags", "true"), ("count", "2")]),
            Ok(vec![
                "setting \"flags\" has no effect: this component reads flag, count".into()
            ])
        );
        let keys = vec!["x".to_string()];
        assert_eq!(
            review(&[], keys, |_| None),
            Ok(vec![
                "setting \"x\" has no effect: this component reads no setting".into()
            ])
        );
    }

    #[test]
    fn switches_and_numbers() {
        assert_eq!(switch("ON"), Ok(true));
        assert_eq!(switch("0"), Ok(false));
        assert!(switch("").is_err());
        assert_eq!(whole("4000", 0, 4000), Ok(4000));
        assert!(whole("-1", 0, 4000).is_err());
        assert!(whole("1.5", 0, 4000).is_err());
    }
}
