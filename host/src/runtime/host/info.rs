//! `host` (capability `host-info`): facts about the running host.

use super::Ctx;
use crate::app::{SERVICE_NAME, SERVICE_VERSION};
use crate::runtime::bindings::endpoint::marketplace::plugin::host;

impl host::Host for Ctx {
    fn service(&mut self) -> (String, String) {
        (SERVICE_NAME.into(), SERVICE_VERSION.into())
    }

    fn storage(&mut self) -> host::StorageStats {
        match &self.app {
            Some(app) => host::StorageStats {
                status: if app.storage.healthy() { "ok" } else { "error" }.into(),
                commits: app.storage.commits(),
                syncs: app.storage.syncs(),
            },
            None => host::StorageStats {
                status: "unknown".into(),
                commits: 0,
                syncs: 0,
            },
        }
    }

    fn plugins(&mut self) -> Vec<host::PluginStatus> {
        let Some(app) = &self.app else { return vec![] };
        app.runtime
            .statuses()
            .into_iter()
            .map(|s| host::PluginStatus {
                family: s.family,
                component: s.component,
                version: s.version,
                status: s.status,
                grants: s.grants,
                reads: s.reads,
            })
            .collect()
    }

    fn payment_rails(&mut self) -> Vec<host::Rail> {
        crate::money::payments::RAILS
            .iter()
            .map(|(rail, header, enabled)| host::Rail {
                rail: rail.to_string(),
                header: header.to_string(),
                enabled: *enabled,
            })
            .collect()
    }

    fn openapi(&mut self) -> String {
        match &self.app {
            Some(app) => app.runtime.served().openapi.clone(),
            None => "{}".into(),
        }
    }
}
