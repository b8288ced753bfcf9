//! A running host: the shared [`State`] and the component [`Runtime`].

use crate::config::Config;
use crate::runtime::{Limits, Runtime};
use crate::state::State;
use anyhow::Result;
use std::sync::Arc;
use std::time::Duration;

pub use crate::config::{SERVICE_NAME, SERVICE_VERSION};

/// How often expired used-signature and replay records are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Everything a request may need: the state (through `Deref`: `app.storage`,
/// `app.ledger`, `app.config`, `app.now_ms()`) and the runtime.
pub struct App {
    pub state: Arc<State>,
    pub runtime: Arc<Runtime>,
    /// Sweeps expired used-signature and replay records; stopped by
    /// [`App::stop_background`] (or when the app is dropped).
    sweeper: std::sync::Mutex<Option<crate::retention::Sweeper>>,
    /// Shared store: the admin uploads of the fleet this host serves.
    pub uploads_applied: Applied,
}

impl std::ops::Deref for App {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl App {
    /// Open storage, start the runtime and load the configured plugins.
    pub fn start(config: Config) -> Result<Arc<App>> {
        let app = App::open(config)?;
        app.load_families();
        Ok(app)
    }

    /// Load the configured families (registered by [`App::open`]), each
    /// serving as soon as it is ready.
    pub fn load_families(&self) {
        self.runtime.load_registered(&self.state.config.families());
        self.runtime.loaded();
    }

    /// Open storage and start the runtime with the configured families
    /// registered but not loaded yet ([`App::load_families`]).
    pub fn open(config: Config) -> Result<Arc<App>> {
        let families = config.families();
        if let Some(line) = config.drain_linger().1 {
            tracing::warn!("{line}");
        }
        let limits = Limits {
            deadline: Duration::from_millis(config.request_timeout_ms),
            memory_bytes: (config.plugin_memory_mib as usize) << 20,
            max_instances: config.max_instances,
        };
        let state = State::open(config)?;
        state.storage.opened();
        // The database held, no backup of this data dir runs: a copy one
        // left (as large as the database) is a killed one's.
        if !state.storage.is_shared() {
            crate::backup::remove_stale_copies(&state.config.data_dir);
        }
        let host_routes = crate::runtime::native::routes(state.config.testing_routes);
        let runtime = Arc::new(Runtime::new(state.clone(), limits, host_routes)?);
        runtime.register(&families);
        let retention = crate::retention::Retention {
            replays: Duration::from_secs(state.config.replay_retention_s),
            ..Default::default()
        };
        let sweeper = crate::retention::spawn_with(state.clone(), SWEEP_EVERY, retention);
        // Upstream mode: resolve payments a previous run left unsettled.
        crate::money::upstream::spawn_sweeper(&state);
        Ok(Arc::new(App {
            state,
            runtime,
            sweeper: std::sync::Mutex::new(Some(sweeper)),
            uploads_applied: Default::default(),
        }))
    }

    /// Whether `family` names a family: mounted now, or configured (a
    /// `read` naming anything else would read nothing).
    pub fn family_known(&self, family: &str) -> bool {
        self.runtime.grants(family).is_some() || self.config.family(family).is_some()
    }

    /// Stop the background work (the retention sweeper) at shutdown.
    pub fn stop_background(&self) {
        let sweeper = self
            .sweeper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(s) = sweeper {
            s.stop();
        }
    }
}

/// The admin uploads of a fleet (rows of the shared store's `host:uploads`,
/// family -> row) this host serves; see `server::uploads`.
#[derive(Default)]
pub struct Applied(std::sync::Mutex<std::collections::BTreeMap<String, Vec<u8>>>);

impl Applied {
    pub fn is(&self, family: &str, row: &[u8]) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(family)
            .is_some_and(|r| r == row)
    }

    pub fn set(&self, family: &str, row: Vec<u8>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(family.to_string(), row);
    }
}
