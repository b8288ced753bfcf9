//! The state every layer below the server shares: configuration, storage,
//! the cash ledger, ids and the host clock. The runtime and the host
//! interfaces reach storage and money through it, never through `App`.

use crate::config::Config;
use crate::ids::IdGen;
use crate::money::ledger::Ledger;
use crate::store::Storage;
use anyhow::{Context, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Service name reported by info, health and the manifest.
pub const SERVICE_NAME: &str = "marketplace";
/// Service version (the host crate's).
pub const SERVICE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Configuration, storage, ledger, ids and clock.
pub struct State {
    pub config: Config,
    pub storage: Storage,
    pub ledger: Ledger,
    /// Upstream webcash mode (`cash_upstream`): payments are taken at that
    /// server instead of the embedded ledger.
    pub upstream: Option<Arc<crate::money::upstream::Upstream>>,
    /// The service's arbiter key.
    pub arbiter: crate::auth::Arbiter,
    pub ids: IdGen,
    /// Milliseconds added to the wall clock (tests shift time with it).
    clock_offset_ms: AtomicI64,
}

impl State {
    /// Make the data dir private, open the database and the ledger key.
    pub fn open(config: Config) -> Result<Arc<State>> {
        private_dir(&config.data_dir)?;
        let mut storage = Storage::open(&config.db_path(), config.commit_settings())?;
        storage.set_write_budget(config.max_request_write_bytes);
        private_file(&config.db_path())?;
        let ledger = Ledger::open(&config.data_dir)?;
        crate::money::upgrade::run(&storage, &ledger).context("upgrading the database")?;
        let arbiter = crate::auth::Arbiter::open(&config.data_dir, config.arbiter_key.as_deref())?;
        let upstream = crate::money::upstream::Upstream::from_config(&config);
        Ok(Arc::new(State {
            config,
            storage,
            ledger,
            upstream,
            arbiter,
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

/// Create the data dir readable by the owner only (0700), or tighten it:
/// it holds the database, the server key and the admin token.
fn private_dir(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating data dir {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", dir.display()))?;
    }
    Ok(())
}

/// Make a file readable and writable by the owner only (0600).
fn private_file(path: &std::path::Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("making {} private (0600)", path.display()))?;
    }
    Ok(())
}
