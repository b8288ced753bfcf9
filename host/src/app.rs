//! Shared state of a running host, and the reply type every layer returns.

use crate::config::Config;
use crate::ids::IdGen;
use crate::ledger::Ledger;
use crate::runtime::{Limits, Runtime};
use crate::storage::Storage;
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Service name reported by info, health and the manifest.
pub const SERVICE_NAME: &str = "marketplace";
/// Service version (the host crate's).
pub const SERVICE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Everything a request may need.
pub struct App {
    pub config: Config,
    pub storage: Storage,
    pub runtime: Runtime,
    pub ledger: Ledger,
    pub ids: IdGen,
    /// Milliseconds added to the wall clock (tests shift time with it).
    clock_offset_ms: AtomicI64,
}

impl App {
    /// Open storage, start the runtime and load the configured plugins.
    pub fn start(config: Config) -> Result<Arc<App>> {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
        let families = config.families();
        let keyspaces: Vec<&str> = families.iter().map(|(f, _)| f.as_str()).collect();
        let storage = Storage::open(&config.db_path(), &keyspaces, config.commit_settings())?;
        let limits = Limits {
            deadline: Duration::from_millis(config.request_timeout_ms),
            memory_bytes: (config.plugin_memory_mib as usize) << 20,
            max_instances: config.max_instances,
        };
        let ledger = Ledger::open(&config.data_dir)?;
        let runtime = Runtime::new(
            limits,
            &config.plugins_dir,
            &config.cache_path(),
            config.family_settings(crate::runtime::FEES_FAMILY),
        )?;
        runtime.load_configured(&families);
        Ok(Arc::new(App {
            config,
            storage,
            runtime,
            ledger,
            ids: IdGen::default(),
            clock_offset_ms: AtomicI64::new(0),
        }))
    }

    /// Host clock in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as i64;
        (wall + self.clock_offset_ms.load(Ordering::Relaxed)).max(0) as u64
    }

    /// Shift the host clock (tests of deadlines and signature freshness).
    pub fn shift_clock(&self, delta_ms: i64) {
        self.clock_offset_ms.fetch_add(delta_ms, Ordering::Relaxed);
    }
}

/// An HTTP answer produced by the host or a plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, value: &Value) -> Reply {
        Reply {
            status,
            headers: vec![],
            body: serde_json::to_vec(value).unwrap_or_default(),
        }
    }

    /// A protocol error `{"code", "message"}`.
    pub fn error(status: u16, code: &str, message: impl Into<String>) -> Reply {
        Reply::json(status, &json!({"code": code, "message": message.into()}))
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}
