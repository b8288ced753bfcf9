//! The configuration built: embedded defaults, overlaid by a TOML file,
//! then by `MARKETPLACE_*` environment variables, then by flags; a value
//! overridden is still checked, and an error names where a setting was set.

use super::check::log_filter;
use super::*;

/// The command-line flag that sets `setting` (`--plugins` for
/// `plugins_dir`, else the setting's name with dashes).
pub(super) fn flag_of(setting: &str) -> String {
    match setting {
        "plugins_dir" => "plugins".into(),
        other => other.replace('_', "-"),
    }
}

/// ` (`name` where it was set)` for the first setting of `sources` an
/// error's `message` names (quoted in backticks as serde's errors do, or
/// as a whole word as ours do), or nothing. Of names found at one place,
/// the longest (`plugins.fees`, an environment variable's, over the
/// file's `plugins` table).
pub(super) fn named_source(
    message: &str,
    sources: &BTreeMap<String, String>,
    quoted: bool,
) -> String {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    sources
        .iter()
        .filter_map(|(name, source)| {
            let at = if quoted {
                // (A table's field is named `table.key`.)
                message
                    .find(&format!("`{name}`"))
                    .or_else(|| message.find(&format!("`{name}.")))
            } else {
                message
                    .match_indices(name.as_str())
                    .map(|(at, _)| at)
                    .find(|&at| {
                        !word(message[..at].chars().next_back())
                            && !word(message[at + name.len()..].chars().next())
                    })
            }?;
            Some((at, std::cmp::Reverse(name.len()), name, source))
        })
        .min()
        .map(|(_, _, name, source)| format!(" (`{name}` {source})"))
        .unwrap_or_default()
}

/// A value a flag or an environment variable overrode: still checked,
/// since it is set and would be read once what overrides it is gone (a
/// broken file found in an incident, when the variable is removed).
pub(super) struct Overridden {
    /// The setting (`plugins.{family}` for a family's component).
    key: String,
    value: toml::Value,
    /// Where the value was set, as errors say it.
    source: String,
    /// What overrode it: the flag or variable.
    by: String,
}

impl Overridden {
    /// The value `table` holds for `key` now, which `by` is about to
    /// override, if any.
    pub(super) fn of(
        table: &toml::Table,
        key: &str,
        sources: &BTreeMap<String, String>,
        by: String,
    ) -> Option<Overridden> {
        let value = match key.strip_prefix("plugins.") {
            Some(family) => table.get("plugins")?.as_table()?.get(family)?,
            None => table.get(key)?,
        };
        let source = sources
            .get(key)
            .or_else(|| key.strip_prefix("plugins.").and(sources.get("plugins")))
            .cloned()
            .unwrap_or_default();
        Some(Overridden {
            key: key.to_string(),
            value: value.clone(),
            source,
            by,
        })
    }

    /// Check the value in the final configuration (`table`, which holds)
    /// in place of what overrode it: the rules that read another setting
    /// (`plugin_memory_total_mib` at least `plugin_memory_mib`) read the
    /// others as they are in force.
    pub(super) fn check(&self, table: &toml::Table) -> Result<()> {
        let mut table = table.clone();
        match self.key.strip_prefix("plugins.") {
            Some(family) => {
                plugins_entry(&mut table)?.insert(family.to_string(), self.value.clone());
            }
            None => {
                table.insert(self.key.clone(), self.value.clone());
            }
        }
        let checked = toml::Value::Table(table)
            .try_into::<Config>()
            .map_err(|e| e.to_string().trim().replace('\n', " "))
            .and_then(|c| c.validate().map_err(|e| format!("{e:#}")));
        match checked {
            Ok(()) => Ok(()),
            Err(message) => bail!(
                "invalid configuration: {message} (`{}` {}, which {} overrides)",
                self.key,
                self.source,
                self.by
            ),
        }
    }
}

impl Config {
    /// Build the configuration from an optional file, the environment and
    /// flag overrides (`key`, TOML-or-string value).
    pub fn load(
        file: Option<&Path>,
        env: &[(String, String)],
        flags: &[(String, String)],
    ) -> Result<Config> {
        let mut table = toml::Table::new();
        // Where each setting came from, for an error about it.
        let mut sources: BTreeMap<String, String> = BTreeMap::new();
        // The families named by `MARKETPLACE_PLUGIN_*`, as spelled there.
        let mut env_families: Vec<String> = Vec::new();
        // The values the environment and flags override, checked once the
        // final configuration is known.
        let mut overridden: Vec<Overridden> = Vec::new();
        let file = file.map(Path::to_path_buf).or_else(|| {
            env.iter()
                .find(|(k, _)| k == "MARKETPLACE_CONFIG")
                .map(|(_, v)| PathBuf::from(v))
        });
        if let Some(path) = file {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading config {}", path.display()))?;
            table = text
                .parse::<toml::Table>()
                .with_context(|| format!("parsing config {}", path.display()))?;
            for key in table.keys() {
                sources.insert(
                    key.clone(),
                    format!("in the config file {}", path.display()),
                );
            }
        }
        for (key, value) in env {
            let Some(name) = key.strip_prefix("MARKETPLACE_") else {
                continue;
            };
            let name = name.to_ascii_lowercase();
            // The test harness's own variables (README: `cargo xtask pg`
            // prints MARKETPLACE_TEST_PG) are not settings of a server
            // started beside them.
            if name == "config" || name.starts_with("test_") || name == "require_pg" {
                continue;
            }
            // An empty switch is an unset one (`X=${X:-}` in a compose
            // file), not a wrong value.
            if value.trim().is_empty()
                && (name == "log_json" || BOOL_SETTINGS.contains(&name.as_str()))
            {
                continue;
            }
            // `MARKETPLACE_PLUGIN_{FAMILY}` names a family's component,
            // except the settings whose own names start that way.
            let family = name.strip_prefix("plugin_").filter(|_| {
                !matches!(
                    name.as_str(),
                    "plugin_memory_mib" | "plugin_memory_total_mib"
                )
            });
            let overrides = match (name.as_str(), family) {
                ("log_json", _) => "log_format".to_string(),
                (_, Some(family)) => format!("plugins.{family}"),
                _ => name.clone(),
            };
            let by = format!("the environment variable {key}");
            overridden.extend(Overridden::of(&table, &overrides, &sources, by));
            sources.insert(
                name.clone(),
                format!("from the environment variable {key}{}", shown(&name, value)),
            );
            if name == "log_json" {
                // Either way it is the environment's word over the file's
                // `log_format`.
                let format = if boolean(key, value)? { "json" } else { "text" };
                table.insert("log_format".into(), toml::Value::String(format.into()));
                continue;
            }
            if let Some(family) = family {
                plugins_entry(&mut table)?
                    .insert(family.to_string(), toml::Value::String(value.clone()));
                env_families.push(family.to_string());
                sources.insert(
                    format!("plugins.{family}"),
                    format!("from the environment variable {key}"),
                );
                continue;
            }
            let value = scalar(&name, key, value)?;
            table.insert(name, value);
        }
        for (key, value) in flags {
            let key = key.replace('-', "_");
            let by = format!("the flag --{}", flag_of(&key));
            overridden.extend(Overridden::of(&table, &key, &sources, by));
            sources.insert(
                key.clone(),
                format!("from the flag --{}{}", flag_of(&key), shown(&key, value)),
            );
            let value = scalar(&key, &key, value)?;
            table.insert(key, value);
        }
        let in_force = table.clone();
        let mut config: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    let message = e.to_string().trim().replace('\n', " ");
                    let source = named_source(&message, &sources, true);
                    // (std's words for `localhost:8080` say nothing of why.)
                    let hint = match message.contains("invalid socket address syntax") {
                        true => ": a listener is an IP address and a port, e.g. 127.0.0.1:8080 or [::1]:8080 (a host name is not looked up)",
                        false => "",
                    };
                    anyhow::anyhow!("invalid configuration: {message}{source}{hint}")
                })?;
        config.dash_env_families(&env_families);
        config.plugins_dir_source = sources.get("plugins_dir").cloned();
        config
            .validate()
            .and_then(|()| config.validate_together())
            .map_err(|e| {
                let message = format!("{e:#}");
                let source = named_source(&message, &sources, false);
                anyhow::anyhow!("{message}{source}")
            })?;
        for value in &overridden {
            value.check(&in_force)?;
        }
        // RUST_LOG wins over `log`, so it is held to the same rule: a typo
        // would otherwise lose the access log for the life of the process.
        // (No setting: its error names no setting's source.)
        if let Ok(rust_log) = std::env::var("RUST_LOG")
            && let Err(e) = log_filter(&rust_log)
        {
            bail!(
                "RUST_LOG {rust_log:?} is not a log filter (e.g. info, or warn,marketplace=debug): {e}"
            );
        }
        if let Some(public) = &config.public_url {
            let mcp = config.settings.entry("mcp".into()).or_default();
            // (A blank one is an unset one, as the family reads it.)
            let unset = mcp
                .get("public_url")
                .is_none_or(|v| v.as_str().is_some_and(|u| u.trim().is_empty()));
            if unset {
                mcp.insert("public_url".into(), toml::Value::String(public.to_string()));
            }
        }
        Ok(config)
    }

    /// A shell cannot export a variable with `-` in its name, so
    /// `MARKETPLACE_PLUGIN_MY_FAM` names the family `my-fam` when there is
    /// no family `my_fam` (family names may hold either).
    fn dash_env_families(&mut self, named: &[String]) {
        let Ok(families) = self.try_families() else {
            return; // validate() reports it
        };
        let known = |name: &str| families.iter().any(|f| f.name == name);
        for name in named {
            let dashed = name.replace('_', "-");
            if !known(name)
                && dashed != *name
                && known(&dashed)
                && let Some(component) = self.plugins.remove(name)
            {
                self.plugins.insert(dashed, component);
            }
        }
    }
}

pub(super) fn plugins_entry(table: &mut toml::Table) -> Result<&mut toml::Table> {
    table
        .entry("plugins")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .context("`plugins` must be a table")
}

/// Settings that are strings whatever they look like (an all-digit token
/// stays a string).
pub(super) const STRING_SETTINGS: &[&str] = &[
    "listen",
    "data_dir",
    "plugins_dir",
    "cache_dir",
    "admin_listen",
    "admin_token",
    "arbiter_key",
    "log",
    "log_format",
    "metrics_listen",
    "cash_upstream",
    "store",
    "store_schema",
    "server_key",
    "trusted_proxies",
    "public_url",
];

/// Settings that are on or off.
pub(super) const BOOL_SETTINGS: &[&str] = &[
    "testing_routes",
    "watch_plugins",
    "perf_map",
    "heap_huge_pages",
    "group_commit",
];

/// An env/flag value (`given` names it in an error): a string for
/// [`STRING_SETTINGS`], a boolean for [`BOOL_SETTINGS`]; else a TOML scalar
/// when it parses as one, else a string.
pub(super) fn scalar(name: &str, given: &str, raw: &str) -> Result<toml::Value> {
    if STRING_SETTINGS.contains(&name) {
        return Ok(toml::Value::String(raw.to_string()));
    }
    if BOOL_SETTINGS.contains(&name) {
        return Ok(toml::Value::Boolean(boolean(given, raw)?));
    }
    if let Ok(v) = raw.parse::<i64>() {
        return Ok(toml::Value::Integer(v));
    }
    Ok(match raw {
        "true" => toml::Value::Boolean(true),
        "false" => toml::Value::Boolean(false),
        _ => toml::Value::String(raw.to_string()),
    })
}

/// ` = "VALUE"` of a setting named in an error, unless the value may hold
/// a secret (a token, a key, a URL with a password).
pub(super) fn shown(name: &str, value: &str) -> String {
    // A token, a key, a URL that may hold credentials.
    const SECRET: &[&str] = &[
        "admin_token",
        "server_key",
        "arbiter_key",
        "store",
        "cash_upstream",
    ];
    if SECRET.contains(&name) || value.len() > 200 {
        String::new()
    } else {
        format!(" = {value:?}")
    }
}

/// An on/off value as environments spell it: `true`/`false`, `1`/`0`,
/// `yes`/`no`, `on`/`off`, in any case; anything else is refused, not
/// read as off.
pub(crate) fn boolean(given: &str, raw: &str) -> Result<bool> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!("{given} must be true or false (or 1/0, yes/no, on/off), got {raw:?}"),
    }
}
