//! A running host: the shared [`State`] and the component [`Runtime`].

use crate::config::Config;
use crate::runtime::{Limits, Runtime};
use crate::state::State;
use anyhow::Result;
use std::sync::Arc;
use std::time::Duration;

pub use crate::state::{SERVICE_NAME, SERVICE_VERSION};

/// Everything a request may need: the state (through `Deref`: `app.storage`,
/// `app.ledger`, `app.config`, `app.now_ms()`) and the runtime.
pub struct App {
    pub state: Arc<State>,
    pub runtime: Arc<Runtime>,
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
        let families = config.families();
        let limits = Limits {
            deadline: Duration::from_millis(config.request_timeout_ms),
            memory_bytes: (config.plugin_memory_mib as usize) << 20,
            max_instances: config.max_instances,
        };
        let state = State::open(config)?;
        let runtime = Arc::new(Runtime::new(state.clone(), limits)?);
        runtime.load_configured(&families);
        Ok(Arc::new(App { state, runtime }))
    }
}
