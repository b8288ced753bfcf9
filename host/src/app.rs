//! Shared state of a running host, and the reply type every layer returns.

use crate::config::Config;
use crate::ids::IdGen;
use crate::money::ledger::Ledger;
use crate::runtime::{Limits, Runtime};
use crate::store::Storage;
use anyhow::{Context, Result};

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
        private_dir(&config.data_dir)?;
        let families = config.families();
        let storage = Storage::open(&config.db_path(), config.commit_settings())?;
        private_file(&config.db_path())?;
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
            crate::runtime::native::routes(config.testing_routes),
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
