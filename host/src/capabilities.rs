//! Capabilities: which host interfaces a family may import.
//!
//! Every family gets its own keyspace (`storage`), `clock`, `ids`, `log`,
//! `settings` and `memo`. Everything else is granted by the operator, per family
//! (`[families.NAME] grants = [...]`, `read = [...]`). A component that
//! imports an interface its family was not granted is refused at load, with
//! a message naming the capability and the family; the interfaces it was
//! not granted are not even linked, so a call could only trap. Reading
//! another family's keyspace needs that keyspace in `read`; without it the
//! storage call fails closed (`forbidden`) and the host logs it.

use std::collections::BTreeSet;

/// A capability the operator grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// `payments`: quote and charge the caller (HTTP 402).
    Payments,
    /// `auth`: Ed25519 signature checks (single-use records).
    Signatures,
    /// `escrow`: hold a contract's money, pay it out, earn fees, issue
    /// certificates.
    Escrow,
    /// `dispatch`: run other routes in-process.
    Dispatch,
    /// `host`: service facts (storage counters, families, rails, OpenAPI).
    HostInfo,
    /// `limits`: choose the answer to one's own fault, shorten one's
    /// deadline (for plugins running user code).
    Limits,
    /// `arbiter`: sign with the service's arbiter key.
    Arbiter,
    /// `credentials`: receive the client's `Authorization`,
    /// `Proxy-Authorization` and `Cookie` headers (withheld otherwise). It
    /// opens no interface.
    Credentials,
}

/// Request headers that reach only families granted
/// [`Capability::Credentials`] (lower-case, as hyper names them).
const CREDENTIAL_HEADERS: &[&str] = &["authorization", "proxy-authorization", "cookie"];

/// Whether a header named `name` (any case: a plugin names the headers of
/// a request it dispatches) is one of [`CREDENTIAL_HEADERS`].
pub fn is_credential(name: &str) -> bool {
    CREDENTIAL_HEADERS
        .iter()
        .any(|c| c.eq_ignore_ascii_case(name))
}

/// Every grantable capability, with its name and the WIT interface it opens.
pub const ALL: &[(Capability, &str, &str)] = &[
    (Capability::Payments, "payments", "payments"),
    (Capability::Signatures, "signatures", "auth"),
    (Capability::Escrow, "escrow", "escrow"),
    (Capability::Dispatch, "dispatch", "dispatch"),
    (Capability::HostInfo, "host-info", "host"),
    (Capability::Limits, "limits", "limits"),
    (Capability::Arbiter, "arbiter", "arbiter"),
    // No interface: no import names it.
    (Capability::Credentials, "credentials", ""),
];

/// Interfaces every family may import.
pub const BASE: &[&str] = &[
    "types", "storage", "clock", "ids", "log", "settings", "memo",
];

impl Capability {
    pub fn name(self) -> &'static str {
        ALL.iter()
            .find(|(c, ..)| *c == self)
            .map_or("", |(_, n, _)| n)
    }

    pub fn parse(name: &str) -> Option<Capability> {
        ALL.iter().find(|(_, n, _)| *n == name).map(|(c, ..)| *c)
    }

    fn of_interface(interface: &str) -> Option<Capability> {
        ALL.iter()
            .find(|(.., i)| !i.is_empty() && *i == interface)
            .map(|(c, ..)| *c)
    }
}

/// What one family may do beyond its own keyspace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    pub capabilities: BTreeSet<Capability>,
    /// Other families' keyspaces it may read.
    pub reads: BTreeSet<String>,
}

impl Grants {
    /// From capability names and keyspace names (configuration, admin API).
    pub fn parse<'a>(
        capabilities: impl IntoIterator<Item = &'a str>,
        reads: impl IntoIterator<Item = &'a str>,
    ) -> Result<Grants, String> {
        let mut g = Grants::default();
        for name in capabilities {
            let name = name.trim();
            if name.is_empty() {
                continue;
            }
            g.capabilities
                .insert(Capability::parse(name).ok_or_else(|| {
                    format!(
                        "unknown capability {name:?}; known: {}",
                        ALL.iter()
                            .map(|(_, n, _)| *n)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?);
        }
        for k in reads {
            let k = k.trim();
            if k.is_empty() {
                continue;
            }
            if !valid_family(k) {
                return Err(format!("read: {k:?} is not a family name"));
            }
            g.reads.insert(k.to_string());
        }
        Ok(g)
    }

    pub fn has(&self, c: Capability) -> bool {
        self.capabilities.contains(&c)
    }

    /// Capability names, for health and the admin view.
    pub fn names(&self) -> Vec<String> {
        self.capabilities
            .iter()
            .map(|c| c.name().to_string())
            .collect()
    }

    /// Check a component's imports: `Err` names every capability it
    /// imports but `family` was not granted. `unconfigured`: the
    /// component's file name, when the configuration does not name the
    /// family (its hint then names the file too, as a `[families.NAME]`
    /// table must).
    pub fn admit<'a>(
        &self,
        family: &str,
        unconfigured: Option<&str>,
        imports: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), String> {
        let mut missing: BTreeSet<&'static str> = BTreeSet::new();
        // Every grant the component needs, for the hint: a grant given
        // anew replaces the family's grants.
        let mut needed: BTreeSet<&'static str> = BTreeSet::new();
        if self.has(Capability::Credentials) {
            needed.insert(Capability::Credentials.name());
        }
        let mut unknown = Vec::new();
        for import in imports {
            let Some(rest) = import.strip_prefix("marketplace:plugin/") else {
                continue;
            };
            let interface = rest.split('@').next().unwrap_or(rest);
            if BASE.contains(&interface) {
                continue;
            }
            match Capability::of_interface(interface) {
                Some(c) if self.has(c) => {
                    needed.insert(c.name());
                }
                Some(c) => {
                    missing.insert(c.name());
                    needed.insert(c.name());
                }
                None => unknown.push(interface.to_string()),
            }
        }
        if !unknown.is_empty() {
            return Err(format!(
                "family {family}: the component imports unknown host interfaces: {}",
                unknown.join(", ")
            ));
        }
        if !missing.is_empty() {
            let names: Vec<&str> = missing.into_iter().collect();
            let all: Vec<&str> = needed.into_iter().collect();
            let quoted: Vec<String> = all.iter().map(|n| format!("\"{n}\"")).collect();
            let file = unconfigured
                .map(|c| format!(" component = \"{c}\" and"))
                .unwrap_or_default();
            return Err(format!(
                "family {family} is not granted the capabilit{} {} that the component imports (grant with [families.{family}]{file} grants = [{}], `marketplace plugins load {family} FILE --grants {}` or PUT /admin/plugins/{family}?grants={})",
                if names.len() == 1 { "y" } else { "ies" },
                names.join(", "),
                quoted.join(", "),
                all.join(","),
                all.join(","),
            ));
        }
        Ok(())
    }
}

/// What [`valid_family`] accepts, for messages.
pub const FAMILY_NAME_RULE: &str =
    "1 to 32 of a-z, 0-9, _ and -, starting with a letter; not `host`";

/// A family name: lower-case letters, digits, `_` and `-`, 1 to 32, starting
/// with a letter; not `host`, the name logs and metrics give the host's own
/// routes.
pub fn valid_family(name: &str) -> bool {
    name != "host"
        && name.len() <= 32
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// What each built-in family is granted unless the operator says otherwise:
/// exactly what it needs (only `contracts` holds escrow, only `mcp`
/// dispatches and limits itself).
pub fn builtin(family: &str) -> Grants {
    use Capability::*;
    let (caps, reads): (&[Capability], &[&str]) = match family {
        "info" => (&[HostInfo, Payments], &[]),
        // `contracts`: the wallet recovery scan lists an identity's contracts.
        "identity" => (&[Payments, Signatures], &["timeline", "contracts"]),
        "timeline" => (&[Payments, Signatures], &["identity"]),
        "search" => (&[], &["timeline", "identity"]),
        "contracts" => (
            &[Payments, Signatures, Escrow, Arbiter],
            &["timeline", "identity"],
        ),
        "mcp" => (
            &[Dispatch, HostInfo, Limits, Signatures],
            &["timeline", "identity"],
        ),
        "testing" => (
            &[
                Payments, Signatures, Escrow, Dispatch, HostInfo, Limits, Arbiter,
            ],
            &["timeline", "identity", "contracts"],
        ),
        _ => (&[], &[]),
    };
    Grants {
        capabilities: caps.iter().copied().collect(),
        reads: reads.iter().map(|s| s.to_string()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_named_in_any_case_and_open_no_interface() {
        assert!(is_credential("authorization") && is_credential("Cookie"));
        assert!(is_credential("PROXY-AUTHORIZATION"));
        assert!(!is_credential("x-cash-secret") && !is_credential("authorization2"));
        assert_eq!(
            Capability::parse("credentials"),
            Some(Capability::Credentials)
        );
        assert_eq!(Capability::of_interface(""), None);
        let g = Grants::parse(["credentials"], []).unwrap();
        assert!(
            g.admit("f", None, ["marketplace:plugin/storage@0.2.0"])
                .is_ok()
        );
    }

    #[test]
    fn imports_beyond_the_grants_are_named() {
        let g = Grants::parse(["payments"], []).unwrap();
        let imports = [
            "marketplace:plugin/storage@0.2.0",
            "marketplace:plugin/payments@0.2.0",
            "marketplace:plugin/escrow@0.2.0",
            "marketplace:plugin/dispatch@0.2.0",
            "wasi:random/insecure-seed@0.2.0",
        ];
        let err = g.admit("rogue", None, imports).unwrap_err();
        assert!(err.contains("family rogue"), "{err}");
        assert!(err.contains("dispatch, escrow"), "{err}");
        // The hint grants all it needs, the grant it has too (a grant given
        // anew replaces the family's).
        assert!(
            err.contains(r#"grants = ["dispatch", "escrow", "payments"]"#)
                && err.contains("--grants dispatch,escrow,payments")
                && err.contains("?grants=dispatch,escrow,payments"),
            "{err}"
        );
        // A family the configuration does not name: its table needs the
        // file too, or the host refuses to start.
        let err = g
            .admit("rogue", Some("families/rogue.wasm"), imports)
            .unwrap_err();
        assert!(
            err.contains(r#"[families.rogue] component = "families/rogue.wasm" and grants = ["#),
            "{err}"
        );
        assert!(
            Grants::parse(["payments", "escrow", "dispatch"], [])
                .unwrap()
                .admit("rogue", None, imports)
                .is_ok()
        );
        assert!(
            Grants::default()
                .admit("x", None, ["marketplace:plugin/log@0.2.0"])
                .is_ok()
        );
        assert!(Grants::parse(["money"], []).is_err());
        assert!(Grants::parse([], ["Bad Name"]).is_err());
        // `host` names the host's own routes in logs and metrics.
        assert!(!valid_family("host") && valid_family("hosted") && valid_family("a-1_b"));
    }

    #[test]
    fn only_contracts_holds_escrow_and_only_mcp_dispatches() {
        for f in ["info", "identity", "timeline", "search", "contracts", "mcp"] {
            assert_eq!(builtin(f).has(Capability::Escrow), f == "contracts", "{f}");
            assert_eq!(builtin(f).has(Capability::Dispatch), f == "mcp", "{f}");
        }
        assert_eq!(builtin("template"), Grants::default());
    }
}
