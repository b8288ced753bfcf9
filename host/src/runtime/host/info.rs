//! `host` (capability `host-info`): facts about the running host.

use super::Ctx;
use crate::config::{SERVICE_NAME, SERVICE_VERSION};
use crate::runtime::bindings::endpoint::marketplace::plugin::host;

impl host::Host for Ctx {
    fn service(&mut self) -> (String, String) {
        (SERVICE_NAME.into(), SERVICE_VERSION.into())
    }

    fn storage(&mut self) -> host::StorageStats {
        match &self.rt {
            Some(rt) => host::StorageStats {
                status: if rt.storage.healthy() { "ok" } else { "error" }.into(),
                commits: rt.storage.request_commits(),
                syncs: rt.storage.syncs(),
            },
            None => host::StorageStats {
                status: "unknown".into(),
                commits: 0,
                syncs: 0,
            },
        }
    }

    fn storage_backend(&mut self) -> String {
        self.rt
            .as_ref()
            .map_or("unknown", |rt| rt.storage.backend_name())
            .into()
    }

    fn plugins(&mut self) -> Vec<host::PluginStatus> {
        let Some(rt) = &self.rt else { return vec![] };
        rt.statuses()
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
        match &self.rt {
            Some(rt) => rt.served().openapi.to_string(),
            None => "{}".into(),
        }
    }
}
