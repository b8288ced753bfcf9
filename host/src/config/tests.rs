use super::check::{log_filter, same_socket, without_credentials};
use super::*;

#[test]
fn a_drain_lingers_at_most_half_its_time_and_a_longer_linger_is_said() {
    let config = |linger, timeout| Config {
        drain_linger_ms: linger,
        drain_timeout_ms: timeout,
        ..Config::default()
    };
    assert_eq!(
        config(500, 10_000).drain_linger(),
        (Duration::from_millis(500), None)
    );
    assert_eq!(config(5_000, 10_000).drain_linger().1, None);
    let (linger, said) = config(9_000, 10_000).drain_linger();
    assert_eq!(linger, Duration::from_secs(5));
    assert_eq!(
        said.as_deref(),
        Some(
            "drain_linger_ms 9000 is more than half of drain_timeout_ms 10000: a drain lingers 5000 ms"
        )
    );
    assert_eq!(
        config(500, 300).drain_linger().0,
        Duration::from_millis(150)
    );
}

#[test]
fn a_url_in_an_error_shows_no_credentials() {
    let shown = without_credentials("Postgres://u:SECRETPW@h/db");
    assert!(
        !shown.contains("SECRETPW") && shown.contains("h/db"),
        "{shown}"
    );
    assert_eq!(without_credentials("http://h:1"), "\"http://h:1\"");
    let shown = without_credentials("postgres://h/db?user=u&password=SECRETPW");
    assert!(
        !shown.contains("SECRETPW") && shown.contains("h/db"),
        "{shown}"
    );
    let bad = Config {
        store: "redis://u:SECRETPW@h/db".into(),
        ..Config::default()
    };
    let e = bad.validate().unwrap_err().to_string();
    assert!(
        !e.contains("SECRETPW") && e.contains("store must be"),
        "{e}"
    );
}

#[test]
fn a_misspelt_level_is_not_taken_for_a_target() {
    for ok in [
        "info",
        "WARN",
        "off",
        "warn,marketplace=debug",
        "marketplace",
        "marketplace::store",
        "info,hyper=warn",
    ] {
        assert!(log_filter(ok).is_ok(), "{ok}");
    }
    for bad in ["wran", "info,debgu", "zz?z", "hyper"] {
        assert!(log_filter(bad).is_err(), "{bad}");
    }
}

#[test]
fn listeners_clash_on_one_socket_only() {
    let clash = |a: &str, b: &str| same_socket(a.parse().unwrap(), b.parse().unwrap());
    for (a, b) in [
        ("127.0.0.1:80", "127.0.0.1:80"),
        ("0.0.0.0:80", "127.0.0.1:80"),
        ("[::]:80", "127.0.0.1:80"),
        ("[::]:80", "[::1]:80"),
        ("[::ffff:127.0.0.1]:80", "127.0.0.1:80"),
        ("0.0.0.0:80", "[::ffff:127.0.0.1]:80"),
    ] {
        assert!(clash(a, b) && clash(b, a), "{a} {b}");
    }
    for (a, b) in [
        ("127.0.0.1:80", "127.0.0.1:81"),
        ("127.0.0.1:0", "127.0.0.1:0"),
        ("127.0.0.1:80", "127.0.0.2:80"),
        ("0.0.0.0:80", "[::1]:80"),
    ] {
        assert!(!clash(a, b) && !clash(b, a), "{a} {b}");
    }
}

fn s(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn defaults_are_valid() {
    let c = Config::load(None, &[], &[]).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.families().len(), DEFAULT_PLUGINS.len());
    assert_eq!(
        c.family("contracts").unwrap().grants,
        crate::capabilities::builtin("contracts")
    );
}

/// README's Configuration gives every range a start holds a setting
/// to, as the code has it.
#[test]
fn readme_lists_every_settings_range() {
    let readme = include_str!("../../../README.md").replace('\n', " ");
    for (name, _, min, max) in Config::default().ranges() {
        let least = match name {
            "plugin_memory_total_mib" => "plugin_memory_mib".to_string(),
            _ => min.to_string(),
        };
        let listed = format!("`{name}` {least}..={max}");
        assert!(readme.contains(&listed), "README lacks {listed}");
    }
}

#[test]
fn file_then_env_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "listen = \"127.0.0.1:1\"\nrequest_timeout_ms = 500\n[plugins]\nfees = \"fees_pickup_paid.wasm\"\n").unwrap();
    let env = s(&[
        ("MARKETPLACE_LISTEN", "127.0.0.1:2"),
        ("MARKETPLACE_TESTING_ROUTES", "true"),
        ("OTHER", "x"),
    ]);
    let flags = s(&[("listen", "127.0.0.1:3")]);
    let c = Config::load(Some(&file), &env, &flags).unwrap();
    assert_eq!(c.listen.port(), 3);
    assert_eq!(c.request_timeout_ms, 500);
    assert!(c.testing_routes);
    assert_eq!(c.family("fees").unwrap().component, "fees_pickup_paid.wasm");
    let c = Config::load(Some(&file), &env, &[]).unwrap();
    assert_eq!(c.listen.port(), 2);
    // A file's bad value that a variable overrides is refused as one a
    // flag overrides: it would be read once the variable is gone. So
    // are the file's log_format under MARKETPLACE_LOG_JSON and a
    // family's component under MARKETPLACE_PLUGIN_<FAMILY>.
    for (text, var, value, says) in [
        (
            "max_body_bytes = 0",
            "MARKETPLACE_MAX_BODY_BYTES",
            "100",
            "max_body_bytes",
        ),
        (
            "data_dir = \"\"",
            "MARKETPLACE_DATA_DIR",
            "/d",
            "data_dir must not be empty",
        ),
        (
            "log_format = \"yaml\"",
            "MARKETPLACE_LOG_JSON",
            "1",
            "`log_format`",
        ),
        (
            "[plugins]\nfees = \"../x.wasm\"",
            "MARKETPLACE_PLUGIN_FEES",
            "fees_pickup_paid.wasm",
            "`plugins.fees`",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let e = format!(
            "{:#}",
            Config::load(Some(&file), &s(&[(var, value)]), &[]).unwrap_err()
        );
        assert!(
            e.contains(says)
                && e.contains("in the config file")
                && e.contains(&format!("which the environment variable {var} overrides")),
            "{text}: {e}"
        );
    }
    // An overridden value is checked with the others in force: a rule
    // that reads another setting reads the one the server runs with.
    std::fs::write(
        &file,
        "plugin_memory_mib = 16\nplugin_memory_total_mib = 32\n",
    )
    .unwrap();
    let c = Config::load(
        Some(&file),
        &s(&[("MARKETPLACE_PLUGIN_MEMORY_TOTAL_MIB", "48")]),
        &[],
    )
    .unwrap();
    assert_eq!((c.plugin_memory_mib, c.plugin_memory_total_mib), (16, 48));
}

#[test]
fn an_error_names_where_the_setting_came_from() {
    let err = |env: &[(&str, &str)], flags: &[(&str, &str)]| {
        format!("{:#}", Config::load(None, &s(env), &s(flags)).unwrap_err())
    };
    let e = err(
        &[("MARKETPLACE_MAX_CONNECTIONS", "many")],
        &[("data_dir", "d")],
    );
    assert!(
        e.contains("from the environment variable MARKETPLACE_MAX_CONNECTIONS = \"many\""),
        "{e}"
    );
    // An unknown variable is named, not a setting the error lists.
    let e = err(&[("MARKETPLACE_ZZZ", "1")], &[("data_dir", "d")]);
    assert!(
        e.contains("(`zzz` from the environment variable MARKETPLACE_ZZZ"),
        "{e}"
    );
    let e = err(&[], &[("listen", "127.0.0.1:99999")]);
    assert!(
        e.contains("from the flag --listen = \"127.0.0.1:99999\""),
        "{e}"
    );
    // A host name is no listener: the error says what is.
    let e = err(&[], &[("listen", "localhost:8080")]);
    assert!(
        e.contains("from the flag --listen = \"localhost:8080\"")
            && e.ends_with("(a host name is not looked up)"),
        "{e}"
    );
    // So do the checks made once it is read (ranges, formats); a key's
    // value is not repeated.
    let e = err(&[("MARKETPLACE_MAX_BODY_BYTES", "0")], &[]);
    assert!(
        e.contains(
            "(`max_body_bytes` from the environment variable MARKETPLACE_MAX_BODY_BYTES = \"0\")"
        ),
        "{e}"
    );
    let e = err(&[("MARKETPLACE_ARBITER_KEY", "zz")], &[]);
    assert!(
        e.contains("arbiter_key must be 64 hex characters (`arbiter_key` from the environment variable MARKETPLACE_ARBITER_KEY)"),
        "{e}"
    );
    // A value that may be a secret is not repeated.
    let e = err(
        &[
            ("MARKETPLACE_STORE", "postgres://u:pw@h/db"),
            ("MARKETPLACE_STORE_TIMEOUT_MS", "x"),
        ],
        &[],
    );
    assert!(!e.contains("pw@"), "{e}");
    // A store's other settings hold no secret: their values are shown.
    assert!(e.contains("MARKETPLACE_STORE_TIMEOUT_MS = \"x\""), "{e}");
    // A store URL no connection can use is said at start, naming the
    // setting, without its password.
    let e = err(
        &[("MARKETPLACE_STORE", "postgres://u:pw@h:99999999/db")],
        &[],
    );
    assert!(
        e.contains("is not a PostgreSQL URL")
            && e.contains("(`store` from the environment variable MARKETPLACE_STORE)")
            && !e.contains("pw@"),
        "{e}"
    );
    // A family's component names the variable that set it, and the
    // flag by its own name (`--plugins`, not `--plugins-dir`).
    let e = err(
        &[("MARKETPLACE_PLUGIN_FEES", "../x.wasm")],
        &[("plugins_dir", "/p")],
    );
    assert!(
        e.ends_with("(`plugins.fees` from the environment variable MARKETPLACE_PLUGIN_FEES)"),
        "{e}"
    );
    // A bad value a flag overrides is refused too, named where it was.
    let e = err(&[("MARKETPLACE_LISTEN", "5")], &[("listen", "127.0.0.1:1")]);
    assert!(
        e.contains("(`listen` from the environment variable MARKETPLACE_LISTEN = \"5\", which the flag --listen overrides)"),
        "{e}"
    );
    let e = err(&[("MARKETPLACE_PLUGINS_DIR", "")], &[("plugins_dir", "/p")]);
    assert!(
        e.contains("plugins_dir must not be empty")
            && e.contains("which the flag --plugins overrides"),
        "{e}"
    );
    let e = err(&[], &[("plugins_dir", "")]);
    assert!(e.contains("from the flag --plugins = \"\""), "{e}");
    // Two listeners on one socket, named where they were set; a value
    // a flag overrides is not held against the others' (it is
    // checked alone).
    let e = err(
        &[("MARKETPLACE_ADMIN_LISTEN", "127.0.0.1:9000")],
        &[("listen", "127.0.0.1:9000")],
    );
    assert!(
        e.contains("admin_listen 127.0.0.1:9000 would bind where listen 127.0.0.1:9000 does")
            && e.contains("from the environment variable MARKETPLACE_ADMIN_LISTEN"),
        "{e}"
    );
    let c = Config::load(
        None,
        &s(&[
            ("MARKETPLACE_LISTEN", "127.0.0.1:9000"),
            ("MARKETPLACE_ADMIN_LISTEN", "127.0.0.1:8080"),
        ]),
        &s(&[("admin_listen", "127.0.0.1:9001")]),
    )
    .unwrap();
    assert_eq!(c.admin_listen, Some("127.0.0.1:9001".parse().unwrap()));
    // Of two families' variables, the unknown one's.
    let e = err(
        &[
            ("MARKETPLACE_PLUGIN_MY_FAM", "template.wasm"),
            ("MARKETPLACE_PLUGIN_FEES", "fees_pickup_paid.wasm"),
        ],
        &[],
    );
    assert!(
        e.contains("unknown plugin family \"my_fam\"")
            && e.ends_with(
                "(`plugins.my_fam` from the environment variable MARKETPLACE_PLUGIN_MY_FAM)"
            ),
        "{e}"
    );
    // The test harness's variables are not settings.
    let c = Config::load(
        None,
        &s(&[
            ("MARKETPLACE_TEST_PG", "postgres://x"),
            ("MARKETPLACE_REQUIRE_PG", "1"),
        ]),
        &[],
    );
    assert!(c.is_ok(), "{:?}", c.err());
}

#[test]
fn a_bad_component_in_the_file_names_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "[families.notes]\ncomponent = \"../t.wasm\"\n").unwrap();
    let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
    assert!(
        e.starts_with("[families.notes] component: \"../t.wasm\" must be a file name")
            && e.contains("(`families` in the config file"),
        "{e}"
    );
    std::fs::write(&file, "[plugins]\nfees = \"/abs.wasm\"\n").unwrap();
    let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
    assert!(
        e.starts_with("plugins.fees: the component of family fees")
            && e.contains("(`plugins` in the config file"),
        "{e}"
    );
}

#[test]
fn plugin_settings_are_plain_values_and_cash_has_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    let load = |text: &str| {
        std::fs::write(&file, text).unwrap();
        Config::load(Some(&file), &[], &[]).map_err(|e| format!("{e:#}"))
    };
    let c = load(
        "[settings.mcp]\nallowed_origins = [\"https://a\", \"https://b\"]\nunsigned_macros = 7\n\
         [settings.fees]\npost = 0.5\n[settings.fee]\npost = \"1\"\n",
    )
    .unwrap();
    let mcp = c.family_settings("mcp");
    assert_eq!(mcp["allowed_origins"], "https://a,https://b");
    assert_eq!(mcp["unsigned_macros"], "7");
    assert_eq!(c.family_settings("fees")["post"], "0.5");
    let unused = c.settings_for_no_family(&[]);
    assert_eq!(unused.len(), 1, "{unused:?}");
    assert!(
        unused[0].starts_with("[settings.fee] is for no family"),
        "{unused:?}"
    );
    // A family mounted at start (an upload kept, the families
    // directory) is one.
    assert!(c.settings_for_no_family(&["fee".into()]).is_empty());
    // What a component could not read as a text is refused at start,
    // naming the file.
    for (text, named) in [
        (
            "[settings.mcp]\nx = { a = 1 }\n",
            "[settings.mcp] x: a setting is",
        ),
        (
            "[settings.mcp]\nx = [[1]]\n",
            "[settings.mcp] x: a setting is",
        ),
        (
            "[settings.cash]\nterm = \"t\"\n",
            "[settings.cash] term: unknown setting",
        ),
    ] {
        let e = load(text).unwrap_err();
        assert!(e.contains(named), "{text}: {e}");
        assert!(e.contains("in the config file"), "{text}: {e}");
    }
    assert!(load("[settings.cash]\nterms = \"t\"\n").is_ok());
    // A misspelt field of a family's table names the file too.
    let e = load("[families.timeline]\ngrant = [\"payments\"]\n").unwrap_err();
    assert!(e.contains("unknown field `grant`"), "{e}");
    assert!(e.contains("(`families` in the config file"), "{e}");
}

#[test]
fn bad_values_are_refused() {
    assert!(Config::load(None, &[], &s(&[("admin_listen", "0.0.0.0:9")])).is_err());
    assert!(Config::load(None, &[], &s(&[("nonsense", "1")])).is_err());
    let e = Config::load(None, &s(&[("MARKETPLACE_PLUGIN_NOPE", "x.wasm")]), &[]).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("MARKETPLACE_PLUGIN_NOPE") && e.contains("timeline"),
        "{e}"
    );
    // A setting whose name starts like a family's component.
    let c = Config::load(
        None,
        &s(&[
            ("MARKETPLACE_PLUGIN_MEMORY_MIB", "16"),
            ("MARKETPLACE_PLUGIN_MEMORY_TOTAL_MIB", "32"),
        ]),
        &[],
    )
    .unwrap();
    assert_eq!((c.plugin_memory_mib, c.plugin_memory_total_mib), (16, 32));
    let err = |env: &[(&str, &str)]| format!("{:#}", Config::load(None, &s(env), &[]).unwrap_err());
    assert!(err(&[("MARKETPLACE_MAX_BODY_BYTES", "0")]).contains("max_body_bytes"));
    // Room for one body of the largest size, or none could be received.
    assert!(err(&[("MARKETPLACE_MAX_PENDING_BODY_BYTES", "1")]).contains("33554432.."));
    // It holds at least two bodies of the largest size a route takes.
    let c = |env: &[(&str, &str)]| Config::load(None, &s(env), &[]).unwrap();
    assert_eq!(c(&[]).pending_body_budget(), 256 << 20);
    let big = c(&[("MARKETPLACE_MAX_BODY_BYTES", "268435456")]);
    assert_eq!(big.pending_body_budget(), 512 << 20);
    assert!(err(&[("MARKETPLACE_ADMIN_TOKEN", "short")]).contains("admin_token"));
    // A reservation holds the memory cap.
    assert!(
        err(&[("MARKETPLACE_MEMORY_RESERVATION_MIB", "32")])
            .contains("memory_reservation_mib must be at least plugin_memory_mib (64)")
    );
    assert_eq!(
        c(&[("MARKETPLACE_MEMORY_RESERVATION_MIB", "64")]).memory_reservation_mib,
        Some(64)
    );
    assert_eq!(c(&[]).memory_reservation_mib, None);
    assert!(err(&[("MARKETPLACE_PLUGIN_FEES", "../x.wasm")]).contains("fees"));
    assert!(err(&[("MARKETPLACE_PLUGIN_FEES", "/etc/x.wasm")]).contains("fees"));
    assert!(err(&[("MARKETPLACE_LOG_FORMAT", "xml")]).contains("log_format"));
    assert!(err(&[("MARKETPLACE_LOG", "info,=[")]).contains("log \"info,=[\""));
    assert!(
        Config::load(
            None,
            &s(&[("MARKETPLACE_LOG", "warn,marketplace=debug")]),
            &[]
        )
        .is_ok()
    );
    assert!(err(&[("MARKETPLACE_MAX_CONNECTIONS", "many")]).contains("max_connections"));
    for bad in [
        "ftp://x",
        "https://mint.example",
        "http://",
        "not a url",
        "http://h/?q=1",
        "http://user:pw@127.0.0.1:9",
    ] {
        assert!(
            err(&[("MARKETPLACE_CASH_UPSTREAM", bad)]).contains("cash_upstream"),
            "{bad}"
        );
    }
    assert!(
        err(&[("MARKETPLACE_CASH_UPSTREAM_TIMEOUT_MS", "0")]).contains("cash_upstream_timeout_ms")
    );
    let c = Config::load(
        None,
        &s(&[("MARKETPLACE_CASH_UPSTREAM", "http://127.0.0.1:9/")]),
        &[],
    )
    .unwrap();
    assert_eq!(c.cash_upstream.as_deref(), Some("http://127.0.0.1:9/"));
    assert_eq!(c.cash_upstream_timeout_ms, 5000);
}

#[test]
fn tokens_are_strings_and_json_logs_are_a_switch() {
    let digits = "1".repeat(40);
    let c = Config::load(
        None,
        &s(&[
            ("MARKETPLACE_ADMIN_TOKEN", &digits),
            ("MARKETPLACE_LOG_JSON", "1"),
        ]),
        &[],
    )
    .unwrap();
    assert_eq!(c.admin_token.as_deref(), Some(digits.as_str()));
    assert_eq!(c.log_format, LogFormat::Json);
    let c = Config::load(None, &[], &s(&[("plugins_dir", "123")])).unwrap();
    assert_eq!(c.plugins_dir, PathBuf::from("123"));
    confined("families/notes.wasm").unwrap();
}

#[test]
fn switches_read_as_environments_spell_them_and_nothing_else() {
    let load = |env: &[(&str, &str)]| Config::load(None, &s(env), &[]);
    for (on, off) in [("1", "0"), ("TRUE", "False"), ("yes", "no"), ("On", "off")] {
        let c = load(&[
            ("MARKETPLACE_WATCH_PLUGINS", off),
            ("MARKETPLACE_TESTING_ROUTES", on),
            ("MARKETPLACE_LOG_JSON", on),
        ])
        .unwrap();
        assert!(!c.watch_plugins && c.testing_routes, "{on} {off}");
        assert_eq!(c.log_format, LogFormat::Json, "{on}");
        let c = load(&[("MARKETPLACE_LOG_JSON", off)]).unwrap();
        assert_eq!(c.log_format, LogFormat::Text, "{off}");
    }
    // A flag as the CLI passes it.
    let c = Config::load(None, &[], &s(&[("testing-routes", "true")])).unwrap();
    assert!(c.testing_routes);
    for name in ["MARKETPLACE_GROUP_COMMIT", "MARKETPLACE_LOG_JSON"] {
        let e = format!("{:#}", load(&[(name, "enabled")]).unwrap_err());
        assert!(e.contains(name) && e.contains("true or false"), "{e}");
    }
    // An empty switch is unset.
    let c = load(&[
        ("MARKETPLACE_LOG_JSON", ""),
        ("MARKETPLACE_GROUP_COMMIT", " "),
    ])
    .unwrap();
    assert_eq!(c.log_format, LogFormat::Text);
    assert!(c.group_commit);
    // Off in the environment wins over a file's json.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "log_format = \"json\"\n").unwrap();
    let c = Config::load(Some(&file), &s(&[("MARKETPLACE_LOG_JSON", "0")]), &[]).unwrap();
    assert_eq!(c.log_format, LogFormat::Text);
    // An empty path is refused, not taken as the working directory.
    for name in ["DATA_DIR", "PLUGINS_DIR", "CACHE_DIR"] {
        let e = format!(
            "{:#}",
            load(&[(&format!("MARKETPLACE_{name}"), "")]).unwrap_err()
        );
        let said = format!("{} must not be empty", name.to_ascii_lowercase());
        assert!(e.contains(&said), "{e}");
    }
}

#[test]
fn families_mount_and_grant() {
    use crate::capabilities::Capability;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "[families.notes]\ncomponent = \"notes.wasm\"\ngrants = [\"payments\"]\nread = [\"timeline\"]\n[families.search]\ngrants = []\n[families.timeline]\nread = []\n",
    )
    .unwrap();
    let c = Config::load(Some(&file), &[], &[]).unwrap();
    let notes = c.family("notes").unwrap();
    assert_eq!(notes.component, "notes.wasm");
    assert!(notes.grants.has(Capability::Payments));
    assert!(notes.grants.reads.contains("timeline"));
    // A built-in family named with grants takes exactly those, and
    // keeps its reads; named with reads, it keeps its capabilities.
    let search = c.family("search").unwrap();
    assert_eq!(search.component, "search.wasm");
    assert!(search.grants.capabilities.is_empty());
    assert_eq!(
        search.grants.reads,
        crate::capabilities::builtin("search").reads
    );
    let timeline = c.family("timeline").unwrap();
    assert!(timeline.grants.reads.is_empty());
    assert_eq!(
        timeline.grants.capabilities,
        crate::capabilities::builtin("timeline").capabilities
    );
    std::fs::write(&file, "[families.x]\ngrants = [\"payments\"]\n").unwrap();
    let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
    assert!(e.contains(r#"component = "x.wasm""#), "{e}");
    for bad in [
        "[families.x]\ngrants = [\"payments\"]\n",
        "[families.x]\ncomponent = \"x.wasm\"\ngrants = [\"money\"]\n",
        "[families.Bad]\ncomponent = \"x.wasm\"\n",
    ] {
        std::fs::write(&file, bad).unwrap();
        assert!(Config::load(Some(&file), &[], &[]).is_err(), "{bad}");
    }
}

#[test]
fn an_environment_variable_names_a_family_with_a_dash() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    let env = s(&[("MARKETPLACE_PLUGIN_MY_FAM", "v2.wasm")]);
    std::fs::write(&file, "[families.my-fam]\ncomponent = \"v1.wasm\"\n").unwrap();
    let c = Config::load(Some(&file), &env, &[]).unwrap();
    assert_eq!(c.family("my-fam").unwrap().component, "v2.wasm");
    // A family spelled with `_` is named as it is, beside one with `-`.
    std::fs::write(
        &file,
        "[families.my-fam]\ncomponent = \"v1.wasm\"\n[families.my_fam]\ncomponent = \"u1.wasm\"\n",
    )
    .unwrap();
    let c = Config::load(Some(&file), &env, &[]).unwrap();
    assert_eq!(c.family("my-fam").unwrap().component, "v1.wasm");
    assert_eq!(c.family("my_fam").unwrap().component, "v2.wasm");
    // An unknown family is named as a shell would spell its variable.
    std::fs::write(&file, "[plugins]\nno-such = \"x.wasm\"\n").unwrap();
    let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
    assert!(e.contains("MARKETPLACE_PLUGIN_NO_SUCH"), "{e}");
}

#[test]
fn trusted_proxies_are_a_list_or_a_comma_separated_string() {
    let ip = |a: &str| a.parse::<std::net::IpAddr>().unwrap();
    let c = Config::load(
        None,
        &s(&[(
            "MARKETPLACE_TRUSTED_PROXIES",
            "127.0.0.1, 10.0.0.0/8,2001:db8::/32",
        )]),
        &[],
    )
    .unwrap();
    for inside in ["127.0.0.1", "10.200.0.9", "::ffff:10.1.1.1", "2001:db8::5"] {
        assert!(c.trusted_proxies.contains(ip(inside)), "{inside}");
    }
    for outside in ["127.0.0.2", "11.0.0.1", "2001:db9::5", "::1"] {
        assert!(!c.trusted_proxies.contains(ip(outside)), "{outside}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "trusted_proxies = [\"::1\", \"192.0.2.0/24\"]\n").unwrap();
    let c = Config::load(Some(&file), &[], &[]).unwrap();
    assert!(c.trusted_proxies.contains(ip("::1")) && c.trusted_proxies.contains(ip("192.0.2.9")));
    // IPv4 networks written as IPv6 match IPv4 peers.
    std::fs::write(&file, "trusted_proxies = \"::ffff:10.0.0.0/104\"\n").unwrap();
    let c = Config::load(Some(&file), &[], &[]).unwrap();
    assert!(c.trusted_proxies.contains(ip("10.3.2.1")));
    assert!(c.trusted_proxies.contains(ip("::ffff:10.3.2.1")));
    assert!(!c.trusted_proxies.contains(ip("11.3.2.1")));
    std::fs::write(&file, "trusted_proxies = 7\n").unwrap();
    let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
    assert!(e.contains("trusted_proxies must be a string"), "{e}");
    // Unset or empty: none.
    assert!(
        Config::load(None, &[], &[])
            .unwrap()
            .trusted_proxies
            .is_empty()
    );
    let c = Config::load(None, &s(&[("MARKETPLACE_TRUSTED_PROXIES", "")]), &[]).unwrap();
    assert!(c.trusted_proxies.is_empty());
    for bad in ["10.0.0.0/33", "proxy.example", "10.0.0.1,,10.0.0.2", "*"] {
        let e = format!(
            "{:#}",
            Config::load(None, &s(&[("MARKETPLACE_TRUSTED_PROXIES", bad)]), &[]).unwrap_err()
        );
        assert!(e.contains("trusted_proxies"), "{bad}: {e}");
    }
}

#[test]
fn public_url_is_an_origin_and_the_mcp_familys_default() {
    let load = |url: &str| Config::load(None, &s(&[("MARKETPLACE_PUBLIC_URL", url)]), &[]);
    let c = load("HTTPS://Market.Example:8443/").unwrap();
    let public = c.public_url.clone().unwrap();
    assert_eq!(public.to_string(), "https://market.example:8443");
    assert_eq!(
        c.settings["mcp"]["public_url"].as_str(),
        Some("https://market.example:8443")
    );
    let mut headers = vec![
        ("Host".to_string(), "internal:8080".to_string()),
        ("x-forwarded-proto".to_string(), "http".to_string()),
        ("accept".to_string(), "*/*".to_string()),
    ];
    public.apply(&mut headers);
    assert_eq!(
        headers,
        [
            ("accept".to_string(), "*/*".to_string()),
            ("host".to_string(), "market.example:8443".to_string()),
            ("x-forwarded-proto".to_string(), "https".to_string()),
        ]
    );
    // As browsers write an origin: the default port left out.
    let origin = |url: &str| load(url).unwrap().public_url.unwrap().to_string();
    assert_eq!(
        origin("https://Market.Example:443/"),
        "https://market.example"
    );
    assert_eq!(origin("http://a.example:080"), "http://a.example");
    assert_eq!(origin("http://[::1]:8080"), "http://[::1]:8080");
    for bad in [
        "ftp://x",
        "https://",
        "https://a.example/market",
        "https://a.example?x=1",
        "market.example",
        "https://a.example:",
        "https://user@a.example",
    ] {
        let e = format!("{:#}", load(bad).unwrap_err());
        assert!(e.contains("public_url"), "{bad}: {e}");
    }
    // The mcp family's own setting wins.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "public_url = \"https://a.example\"\n[settings.mcp]\npublic_url = \"https://b.example\"\n",
    )
    .unwrap();
    let c = Config::load(Some(&file), &[], &[]).unwrap();
    assert_eq!(
        c.settings["mcp"]["public_url"].as_str(),
        Some("https://b.example")
    );
}

/// `serve` refuses a `plugins_dir` that is no directory as it refuses a bad
/// setting, naming where it was set (the offline commands do not read it).
#[test]
fn a_plugins_dir_that_is_no_directory_names_where_it_was_set() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let missing = tmp.path().join("missing");
    let load = |env: &[(&str, &str)], flags: &[(&str, &str)]| {
        Config::load(None, &s(env), &s(flags)).unwrap()
    };
    let e = load(
        &[("MARKETPLACE_PLUGINS_DIR", missing.to_str().unwrap())],
        &[],
    )
    .check_plugins_dir()
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with(&format!("plugins_dir {} does not exist (`plugins_dir` from the environment variable MARKETPLACE_PLUGINS_DIR = ", missing.display())),
        "{e}"
    );
    let e = load(&[], &[("plugins_dir", file.to_str().unwrap())])
        .check_plugins_dir()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("is not a directory (`plugins_dir` from the flag --plugins = "),
        "{e}"
    );
    let mut default = load(&[], &[]);
    assert_eq!(default.plugins_dir_source, None);
    default.plugins_dir = missing.clone();
    let e = default.check_plugins_dir().unwrap_err().to_string();
    assert!(
        e.contains("does not exist (the default when no built components are found: "),
        "{e}"
    );
    let fine = load(&[], &[("plugins_dir", tmp.path().to_str().unwrap())]);
    assert!(fine.check_plugins_dir().is_ok());
}
