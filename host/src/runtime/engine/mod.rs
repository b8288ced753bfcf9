//! The WebAssembly component runtime.
//!
//! One [`wasmtime::Engine`] on the pooling allocator; every plugin family is
//! compiled once (cached on disk under `<data_dir>/cache`), linked and
//! pre-instantiated ([`InstancePre`](wasmtime::component::InstancePre)).
//! Each call gets a fresh [`Store`] and instance with an epoch deadline and a
//! memory cap, so a plugin that traps, spins or hoards memory costs one 500
//! or 503 and nothing else.

use crate::capabilities::{Capability, Grants};
use crate::runtime::api::{self, Api, Served};
use crate::runtime::host::{Ctx, FeeCtx, Limiter};
use crate::runtime::routes::{Match, Route};
use crate::runtime::status::PluginStatus;
use crate::state::State;
use anyhow::{Context, Result, anyhow};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};
use wasmtime::component::{Component, ComponentExportIndex, Linker};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};

use crate::runtime::bindings;
use bindings::endpoint::EndpointPre;
use bindings::endpoint::marketplace::plugin::types as wit;
use bindings::fees::{FeePolicy, FeePolicyPre};

/// Epoch tick length: deadlines are counted in these.
const TICK: Duration = Duration::from_millis(10);

/// The compile cache holds native code the server maps and runs as it
/// is (`Component::deserialize_file`): a cache dir another user could
/// write to (an existing one set as `cache_dir`; only a new one is made
/// 0700) would let them plant code under a name the server looks for.
/// Refused at start: a dir its group or anyone may write to (as ssh
/// refuses such a home), or one another user owns.
fn cache_is_private(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir)
        .with_context(|| format!("reading the compile cache dir {}", dir.display()))?;
    let me = rustix::process::geteuid().as_raw();
    let why = if meta.mode() & 0o022 != 0 {
        format!(
            "other users may write to it (mode {:o})",
            meta.mode() & 0o7777
        )
    } else if meta.uid() != me && meta.uid() != 0 {
        format!(
            "another user owns it (uid {}, this server runs as {me})",
            meta.uid()
        )
    } else {
        return Ok(());
    };
    Err(anyhow!(
        "the compile cache dir (cache_dir) {}: {why}; compiled components are run from it as native code, so it must be this user's alone: give it to this user with mode 0700, or set cache_dir to another path",
        dir.display()
    ))
}

/// Least time the calls a load makes (instantiation, `describe`,
/// `describe-api`, a fee policy's quotes: one deadline for them together)
/// are given, when `request_timeout_ms` is shorter. They run once per load, off the
/// request path, and a busy machine must not refuse a sound component
/// because its whole OpenAPI took longer to build than one request may
/// take; a component that never returns is still refused.
const MIN_LOAD_BUDGET: Duration = Duration::from_secs(10);

pub use crate::config::FEES_FAMILY;

mod calls;
mod faults;
mod fees;

use calls::run_to_end;
use faults::{ENDPOINT_EXPORTS, smoke_failure};
use fees::{
    RULE_BASES, SMOKE_QUOTES, known_policy, quote_keeps_the_rules, schedule_says_what_is_charged,
};

/// A loaded, pre-instantiated component.
pub struct LoadedPlugin {
    pub family: String,
    pub component: String,
    pub name: String,
    pub version: String,
    /// sha256 hex of the component bytes.
    pub hash: String,
    /// RFC 3339 time it was loaded.
    pub loaded_at: String,
    /// What the family may do beyond its own keyspace.
    pub grants: Arc<Grants>,
    /// The interfaces the component imports (`package:name/interface@version`).
    pub imports: Vec<String>,
    /// The routes and OpenAPI it declared.
    pub api: Api,
    kind: Kind,
    metrics: crate::metrics::PluginMetrics,
    /// Its calls that failed since the last it answered, and the last.
    faults: Box<faults::Faults>,
    /// What its instances keep between requests (the WIT `memo`).
    memo: Arc<crate::runtime::memo::Memo>,
}

/// The routes `old` served that `new` does not ("METHOD pattern"; a
/// renamed `{name}` segment is the same route): what a swap from one to
/// the other turns into 404s.
pub fn dropped_routes(old: &LoadedPlugin, new: &LoadedPlugin) -> Vec<String> {
    old.api
        .routes
        .iter()
        .filter(|r| {
            let shape = crate::runtime::routes::shape(&r.pattern);
            !new.api
                .routes
                .iter()
                .any(|n| n.method == r.method && crate::runtime::routes::shape(&n.pattern) == shape)
        })
        .map(|r| format!("{} {}", r.method, r.pattern))
        .collect()
}

enum Kind {
    /// An endpoint component and the export index of its `handle`
    /// function, whose type was checked at load (see
    /// [`Runtime::smoke_describe`]): a request looks up and checks none of
    /// the component's exports again.
    Endpoint {
        pre: EndpointPre<Ctx>,
        handle: ComponentExportIndex,
    },
    /// A fee component, the name of its policy, and the prices it gave
    /// (see [`Runtime::fee_quote`]).
    Fees {
        pre: FeePolicyPre<FeeCtx>,
        policy: String,
        quotes: Mutex<HashMap<(String, Option<u64>), u64>>,
    },
}

/// What a family's slot held before a change ([`Runtime::previous`]).
pub struct Previous(Option<Slot>);

/// One configured family and what is loaded for it.
#[derive(Clone)]
struct Slot {
    component: String,
    grants: Grants,
    loaded: Option<Arc<LoadedPlugin>>,
    /// Why the last load failed, if it did.
    error: Option<String>,
}

/// A family's status, borrowed from where the runtime keeps it
/// ([`Runtime::with_statuses`]).
pub struct StatusView<'a> {
    pub family: &'a str,
    pub component: &'a str,
    pub version: &'a str,
    /// `ok`, `loading`, `unavailable` or `unmounted` (a configured family
    /// an admin unmounted).
    pub status: &'static str,
    pub grants: &'a Grants,
    pub loaded: Option<&'a LoadedPlugin>,
    /// Why its last load failed (unavailable), if it did.
    pub error: Option<&'a str>,
}

impl StatusView<'_> {
    /// Its calls that failed (a trap, the time limit, the memory cap:
    /// answered with a server error) since the last call it answered; 0
    /// unless loaded.
    pub fn consecutive_faults(&self) -> u64 {
        self.loaded.map_or(0, |p| p.faults.in_a_row())
    }
}

/// Limits applied to every instance.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub deadline: Duration,
    pub memory_bytes: usize,
    pub max_instances: u32,
}

/// Held while what serves a family changes, and its record is kept
/// ([`Runtime::one_change`]): a function that takes `&OneChange` runs
/// under it.
pub struct OneChange<'a> {
    _guard: std::sync::MutexGuard<'a, ()>,
}

pub struct Runtime {
    /// Configuration, storage, ledger, ids and clock.
    pub state: Arc<State>,
    engine: Engine,
    fee_linker: Linker<FeeCtx>,
    limits: Limits,
    plugins_dir: PathBuf,
    cache_dir: PathBuf,
    /// (This lock and `served` are taken past a poisoning, as every lock
    /// of the host is: a panic while one was held must not make every
    /// later request a 500 until a restart. Each holder replaces a whole
    /// entry or the whole table.)
    slots: RwLock<BTreeMap<String, Slot>>,
    /// The families of the configuration (the built-in ones included):
    /// one an admin unmounted is listed as `unmounted`.
    configured: Vec<crate::config::FamilySpec>,
    /// The host's own routes (part of every route table).
    host_routes: Vec<Route>,
    /// The route table and OpenAPI document in force.
    served: RwLock<Arc<Served>>,
    /// Swaps, mounts and unmounts one at a time, so a swap's grants and
    /// route check are those of the slots it replaces.
    swapping: std::sync::Mutex<()>,
    /// Watched component files refused since their family last loaded.
    pub refusals: crate::runtime::status::Refusals,
    /// Held by a whole change of what serves a family, from its swap until
    /// it is kept for restarts (see [`Runtime::one_change`]).
    changes: std::sync::Mutex<()>,
    stop_ticker: Arc<AtomicBool>,
    /// The configured families are still loading (see
    /// [`Runtime::register`]).
    loading: AtomicBool,
    /// Operator settings of the fee family.
    fee_settings: Arc<BTreeMap<String, String>>,
}

/// Compiled components unused for this long are removed at start.
const CACHE_KEEP: Duration = Duration::from_secs(30 * 24 * 3600);
/// A temp file this old is the leftover of a writer that died.
const CACHE_TMP_KEEP: Duration = Duration::from_secs(3600);

/// Remove what the compile cache no longer needs: compiled components not
/// used for [`CACHE_KEEP`] (each use refreshes an entry's time; entries of
/// older components or engine versions age out this way) and temp files
/// older than [`CACHE_TMP_KEEP`]. Returns how many files went.
fn prune_cache(dir: &Path, now: SystemTime) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let keep = if name.ends_with(".tmp") {
            CACHE_TMP_KEEP
        } else if name.ends_with(".cwasm") {
            CACHE_KEEP
        } else {
            continue;
        };
        let age = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok());
        if age.is_some_and(|a| a > keep) && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Longest name, version or fee policy name a component may give
/// (characters): they go into log lines, `GET /api/health` and the
/// plugins list.
const MAX_LABEL: usize = 64;

/// Largest fee schedule a fee component may give (`GET /api/fees` serves
/// it).
const MAX_SCHEDULE_BYTES: usize = 64 << 10;

/// Refuse a name or version a component gave (`what`) that is longer than
/// [`MAX_LABEL`] characters or holds characters that are not shown as
/// written (controls, line separators, bidi and invisible format
/// characters): it would make a log line (or a listing) read otherwise.
fn label(what: &str, value: &str) -> Result<()> {
    anyhow::ensure!(
        value.chars().count() <= MAX_LABEL,
        "{what} is {} characters long, over {MAX_LABEL}",
        value.chars().count()
    );
    anyhow::ensure!(
        !value.chars().any(crate::logging::escaped),
        "{what} holds control, line-separator or invisible characters: {:?}",
        crate::logging::one_line(value, MAX_LABEL)
    );
    Ok(())
}

/// The `handle` function of an endpoint component's `handler` export.
fn handle_export(component: &Component) -> Result<ComponentExportIndex> {
    component
        .get_export_index(None, "marketplace:plugin/handler@0.2.0")
        .and_then(|handler| component.get_export_index(Some(&handler), "handle"))
        .ok_or_else(|| anyhow!("not an endpoint component: no handle export"))
}

/// What a pooled memory slot keeps resident between calls, reset by
/// rewriting it. Every page a call ever wrote stays in that set (without
/// userfaultfd write-protection `PAGEMAP_SCAN` takes every present private
/// page for written), so each later call of the slot pays for the largest
/// it ever served: one render of the OpenAPI document or one macro run
/// left an `mcp` slot resetting 4 MiB (80 µs a call) when this was 4 MiB.
/// At 1 MiB that cost is bounded: the written pages past the first 1 MiB
/// of them (by address) are given back to the kernel at each reset, and a
/// call that needs them again faults them in. (Without `PAGEMAP_SCAN`,
/// Linux before 6.7, the first 1 MiB of the memory is rewritten whole at
/// every reset.) Measured, the thirty-seventh and ninety-first sessions:
/// docs/benchmarks-history.md.
const KEEP_RESIDENT: usize = 1 << 20;

impl Runtime {
    /// A runtime serving `host_routes` (the host's own, `native::routes`)
    /// beside the families it loads.
    pub fn new(state: Arc<State>, limits: Limits, host_routes: Vec<Route>) -> Result<Runtime> {
        let config = &state.config;
        let plugins_dir = config.plugins_dir.clone();
        let cache_dir = &config.cache_path();
        let fee_settings = config.family_settings(FEES_FAMILY);
        super::limiter::set_total(
            usize::try_from(config.plugin_memory_total_mib << 20).unwrap_or(usize::MAX),
        );
        let mut wasm_config = wasmtime::Config::new();
        wasm_config.epoch_interruption(true);
        if let Some(mib) = config.memory_reservation_mib {
            // Below 4 GiB the compiled code checks bounds itself; the pool's
            // slots shrink with it.
            wasm_config.memory_reservation(mib << 20);
        }
        if config.perf_map {
            // Each compiled function of every component loaded from now on
            // (compiled or from the cache) gets a line in the perf map.
            wasm_config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let instances = limits.max_instances.saturating_mul(2).saturating_add(16);
        let memories = instances.saturating_mul(2);
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(instances)
            // One fiber stack per call in flight (calls run as futures).
            .total_stacks(instances)
            .max_core_instances_per_component(32)
            .total_core_instances(instances.saturating_mul(8))
            .max_memories_per_component(8)
            .total_memories(memories)
            .max_tables_per_component(16)
            .total_tables(instances.saturating_mul(4))
            .max_memory_size(limits.memory_bytes)
            // Reset reused slots by rewriting their (small) dirty state
            // instead of unmapping and faulting pages back in per request.
            .linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(64 << 10)
            .pagemap_scan(wasmtime::Enabled::Auto);
        wasm_config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wasm_config).map_err(|e| {
            // The pool maps its slots' address space at once: say how much,
            // and what lowers it.
            let hint = if e.to_string().contains("memory pool") {
                // Each with a guard before and after (32 MiB each).
                let each_mib = config.memory_reservation_mib.unwrap_or(4 << 10) + 64;
                format!(
                    " (address space for {memories} plugin memories, 4 per max_instances = {} and 32 more, each memory_reservation_mib = {} MiB and its guards: about {} TiB of virtual memory; lower max_instances or memory_reservation_mib, or lift ulimit -v)",
                    limits.max_instances,
                    each_mib - 64,
                    (u64::from(memories) * each_mib) >> 20
                )
            } else {
                String::new()
            };
            anyhow!("creating engine: {e}{hint}")
        })?;

        let mut fee_linker = Linker::<FeeCtx>::new(&engine);
        FeePolicy::add_to_linker::<FeeCtx, wasmtime::component::HasSelf<FeeCtx>>(
            &mut fee_linker,
            |c| c,
        )
        .map_err(|e| anyhow!("{e}"))?;

        crate::state::create_private_dir(cache_dir).with_context(|| {
            format!(
                "creating the compile cache dir (cache_dir, by default <data_dir>/cache) {}",
                cache_dir.display()
            )
        })?;
        cache_is_private(cache_dir)?;
        let pruned = prune_cache(cache_dir, SystemTime::now());
        if pruned > 0 {
            tracing::info!(pruned, cache = %cache_dir.display(), "removed unused compiled components");
        }

        // The epoch ticker: deadlines are counted in ticks of this thread.
        let stop_ticker = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.clone();
            let stop = stop_ticker.clone();
            std::thread::Builder::new()
                .name("epoch-ticker".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(TICK);
                        engine.increment_epoch();
                    }
                })?;
        }

        let served = api::assemble(host_routes.clone(), &[], None).map_err(|e| anyhow!(e))?;
        Ok(Runtime {
            engine,
            fee_linker,
            host_routes,
            served: RwLock::new(Arc::new(served)),
            swapping: std::sync::Mutex::new(()),
            refusals: Default::default(),
            changes: std::sync::Mutex::new(()),
            limits,
            plugins_dir,
            cache_dir: cache_dir.to_path_buf(),
            slots: RwLock::new(BTreeMap::new()),
            configured: state.config.families(),
            stop_ticker,
            loading: AtomicBool::new(false),
            fee_settings: Arc::new(fee_settings),
            state,
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn plugins_dir(&self) -> &Path {
        &self.plugins_dir
    }

    /// Whether instances come from the pooling allocator.
    pub fn is_pooling(&self) -> bool {
        self.engine.get_pooling_config().is_some()
    }

    /// Register the configured families, none loaded yet: until
    /// [`Runtime::loaded`] those not loaded report `loading`, and an
    /// unmatched path is answered 503 (its family may be one of them).
    pub fn register(&self, families: &[crate::config::FamilySpec]) {
        self.loading.store(true, Ordering::Release);
        let mut slots = self.slots_mut();
        for spec in families {
            slots.insert(
                spec.name.clone(),
                Slot {
                    component: spec.component.clone(),
                    grants: spec.grants.clone(),
                    loaded: None,
                    error: None,
                },
            );
        }
    }

    /// Load the registered `families`, the built-in ones first and the
    /// smallest component first among those, each serving as soon as it is
    /// ready: a family waits only for the ones before it, not for the
    /// largest to compile (the compiler already uses every core for one
    /// component). Each family's load time is logged.
    pub fn load_registered(&self, families: &[crate::config::FamilySpec]) {
        let started = Instant::now();
        self.load_specs(families, started);
        tracing::info!(
            families = families.len(),
            millis = started.elapsed().as_millis() as u64,
            "families loaded"
        );
    }

    /// Load `families` (as [`Runtime::load_registered`] orders them), each
    /// logged with its time since `started`.
    pub fn load_specs(&self, families: &[crate::config::FamilySpec], started: Instant) {
        let mut components: Vec<_> = families
            .iter()
            .map(|spec| {
                let path = self.plugins_dir.join(&spec.component);
                let bytes = read_component(&path).map_err(|e| format!("{}: {e}", path.display()));
                (spec, bytes)
            })
            .collect();
        // Built-in families first, then the other configured ones (so a
        // family cannot take a built-in's path by compiling sooner); the
        // smallest first within each.
        let config = &self.state.config;
        components.sort_by_key(|(spec, b)| {
            (
                config.start_rank(&spec.name),
                b.as_ref().map_or(0, Vec::len),
            )
        });
        for (spec, bytes) in components {
            let bytes = match bytes {
                Ok(b) => b,
                Err(msg) => {
                    tracing::warn!(family = %spec.name, "plugin not loaded: {msg}");
                    if let Some(slot) = self.slots_mut().get_mut(&spec.name) {
                        slot.error = Some(msg);
                    }
                    continue;
                }
            };
            match self.swap(&spec.name, &spec.component, &bytes, None) {
                Ok(_) => {
                    tracing::info!(family = %spec.name, millis = started.elapsed().as_millis() as u64, "family ready")
                }
                Err(e) => {
                    tracing::error!(family = %spec.name, component = %spec.component, "plugin refused: {e:#}")
                }
            }
        }
    }

    /// Every family of the start is loaded (or refused): unmatched paths
    /// are 404 from now on.
    pub fn loaded(&self) {
        self.loading.store(false, Ordering::Release);
        if let Some(problem) = self.served().rendered.whole_problem() {
            tracing::error!(
                "{problem}: /openapi.yaml, /docs and /api/docs/search may answer 503; serve fewer or smaller families (a mount or swap that makes it larger is refused)"
            );
        }
    }

    /// Whether the configured families are still loading.
    pub fn loading(&self) -> bool {
        self.loading.load(Ordering::Acquire)
    }

    /// Validate a component for `family` (compile, check its imports
    /// against the family's grants, link only the granted interfaces,
    /// type-check the world, smoke-call `describe` and `api`, check its
    /// routes against every other family's) and only then make it the one
    /// serving. An unknown family is mounted (with `grants`, or none). With
    /// `grants` the family's grants are replaced. Requests in flight keep
    /// the instance they started with. On any refusal the old component
    /// keeps serving.
    pub fn swap(
        &self,
        family: &str,
        component_name: &str,
        bytes: &[u8],
        grants: Option<Grants>,
    ) -> Result<Arc<LoadedPlugin>> {
        if !crate::capabilities::valid_family(family) {
            anyhow::bail!(
                "{family:?} is not a family name ({})",
                crate::capabilities::FAMILY_NAME_RULE
            );
        }
        let _one_at_a_time = self.swapping.lock().unwrap_or_else(|e| e.into_inner());
        let grants = grants.unwrap_or_else(|| {
            self.slots()
                .get(family)
                .map_or_else(Grants::default, |s| s.grants.clone())
        });
        // The fee family's world imports nothing to grant: what an older
        // record or configuration gave it would only be listed (the admin
        // API and the configuration refuse such grants: `grants_fit`).
        let grants = if family == FEES_FAMILY {
            Grants::default()
        } else {
            grants
        };
        let result = self.prepare(family, component_name, bytes, &grants);
        // Assembled under the read lock: requests find their family's
        // component meanwhile (only holders of `swapping` change what is
        // loaded), and wait for the write lock only while it is put in.
        let result = result.and_then(|plugin| {
            let plugin = Arc::new(plugin);
            let served = self.assemble(&self.slots(), Some((family, &plugin)))?;
            Ok((plugin, served))
        });
        let mut slots = self.slots_mut();
        let known = slots.contains_key(family);
        match result {
            Ok((plugin, served)) => {
                tracing::info!(
                    family,
                    component = component_name,
                    version = %plugin.version,
                    hash = %&plugin.hash[..12],
                    grants = %plugin.grants.names().join(","),
                    routes = plugin.api.routes.len(),
                    "plugin {}",
                    if known { "loaded" } else { "mounted" }
                );
                // A swap that drops routes the old version served (a new
                // version that removed an endpoint, or another family's
                // component under this one's file name): said loudly.
                if let Some(old) = slots.get(family).and_then(|s| s.loaded.as_ref()) {
                    let dropped = dropped_routes(old, &plugin);
                    if !dropped.is_empty() {
                        tracing::warn!(
                            family,
                            component = component_name,
                            "the new version serves {} of the old version's {} routes: these now answer 404: {}",
                            old.api.routes.len() - dropped.len(),
                            old.api.routes.len(),
                            dropped.join(", ")
                        );
                    }
                }
                slots.insert(
                    family.to_string(),
                    Slot {
                        component: component_name.to_string(),
                        grants,
                        loaded: Some(plugin.clone()),
                        error: None,
                    },
                );
                self.serve(served);
                drop(slots);
                self.refusals.loaded(family);
                crate::metrics::metrics().family_mounted(family);
                Ok(plugin)
            }
            Err(e) => {
                if let Some(slot) = slots.get_mut(family)
                    && slot.loaded.is_none()
                {
                    slot.error = Some(format!("{e:#}"));
                }
                Err(e)
            }
        }
    }

    /// What serves `family` now, to put back with [`Runtime::put_back`].
    pub fn previous(&self, family: &str) -> Previous {
        Previous(self.slots().get(family).cloned())
    }

    /// Put `previous` back in `family`'s place (a change that could not be
    /// kept: an admin upload or unmount the shared store could not record
    /// for the fleet). The caller holds [`Runtime::one_change`] since it
    /// took `previous`.
    pub fn put_back(&self, family: &str, previous: Previous) -> Result<()> {
        let _one_at_a_time = self.swapping.lock().unwrap_or_else(|e| e.into_inner());
        let mut slots = self.slots_mut();
        // `family`'s slot made `slot` (none: removed); what it was.
        let place = |slots: &mut BTreeMap<String, Slot>, slot: Option<Slot>| match slot {
            Some(slot) => slots.insert(family.to_string(), slot),
            None => slots.remove(family),
        };
        let current = place(&mut slots, previous.0);
        match self.assemble(&slots, None) {
            Ok(served) => {
                self.serve(served);
                tracing::info!(
                    family,
                    "the change was not kept: what served before serves again"
                );
                Ok(())
            }
            Err(e) => {
                place(&mut slots, current);
                Err(e)
            }
        }
    }

    /// Unmount a family: its routes answer 404 again; its data stays.
    pub fn unmount(&self, family: &str) -> Result<()> {
        if family == FEES_FAMILY {
            anyhow::bail!("the fee policy cannot be unmounted, only swapped");
        }
        let _one_at_a_time = self.swapping.lock().unwrap_or_else(|e| e.into_inner());
        let mut slots = self.slots_mut();
        let Some(slot) = slots.remove(family) else {
            anyhow::bail!("no family {family} is mounted");
        };
        match self.assemble(&slots, None) {
            Ok(served) => {
                self.serve(served);
                if self.state.config.start_rank(family) == 0 {
                    tracing::warn!(
                        family,
                        routes = slot.loaded.as_ref().map_or(0, |p| p.api.routes.len()),
                        "built-in family unmounted: its routes answer 404 until it is mounted again; its data stays"
                    );
                } else {
                    tracing::info!(family, "family unmounted; its data stays");
                }
                Ok(())
            }
            Err(e) => {
                slots.insert(family.to_string(), slot);
                Err(e)
            }
        }
    }

    /// The route table and document of `slots`, with `with` in its family's
    /// place, one generation after the one in force. Callers hold `swapping`.
    /// A new version that declares the same api as the one it replaces
    /// (every fee policy; most swaps) keeps the table and document in force:
    /// they were assembled from these same declarations.
    fn assemble(
        &self,
        slots: &BTreeMap<String, Slot>,
        with: Option<(&str, &Arc<LoadedPlugin>)>,
    ) -> Result<Served> {
        let current = self.served();
        if let Some((family, plugin)) = with
            && slots
                .get(family)
                .and_then(|s| s.loaded.as_ref())
                .is_some_and(|old| old.api == plugin.api)
        {
            return Ok(Served {
                table: current.table.clone(),
                openapi: current.openapi.clone(),
                rendered: current.rendered,
                generation: current.generation + 1,
            });
        }
        let mut families: Vec<(&str, &Api)> = slots
            .iter()
            .filter(|(f, _)| with.is_none_or(|(w, _)| w != f.as_str()))
            .filter_map(|(f, s)| s.loaded.as_ref().map(|p| (f.as_str(), &p.api)))
            .collect();
        if let Some((f, p)) = with {
            families.push((f, &p.api));
        }
        // A mount or swap while the service runs keeps the whole document
        // within what renders (or no further past it than it is); a start
        // takes every configured family (each within its own caps),
        // whichever compiles first, and says at its end when the whole is
        // over ([`Runtime::loaded`]).
        let instead_of = (with.is_some() && !self.loading()).then_some(current.rendered);
        let mut served = api::assemble(self.host_routes.clone(), &families, instead_of)
            .map_err(|e| anyhow!(e))?;
        // The callers hold `swapping`: the table in force is the newest.
        served.generation = current.generation + 1;
        Ok(served)
    }

    /// The route table and OpenAPI document in force.
    pub fn served(&self) -> Arc<Served> {
        self.served
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Put `served` in force.
    fn serve(&self, served: Served) {
        *self.served.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(served);
    }

    /// The families' slots, to read.
    fn slots(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Slot>> {
        self.slots.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The families' slots, to change.
    fn slots_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Slot>> {
        self.slots.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Match a request against the route table in force.
    pub fn find(&self, method: &str, path: &str) -> Match {
        self.served().table.find(method, path)
    }

    /// One change of what serves a family at a time, whoever makes it (an
    /// admin upload or unmount and its record, the watched directory, an
    /// upload of the fleet): what is kept for restarts is then what
    /// serves. Not reentrant: hold it around swaps, never around another
    /// holder.
    pub fn one_change(&self) -> OneChange<'_> {
        OneChange {
            _guard: self.changes.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Whether `family` has a slot granted `capability` (no copy of its
    /// grants: asked per request).
    pub fn granted(&self, family: &str, capability: Capability) -> bool {
        self.slots()
            .get(family)
            .is_some_and(|slot| slot.grants.has(capability))
    }

    /// The configured grants of a family, if it has a slot.
    pub fn grants(&self, family: &str) -> Option<Grants> {
        Some(self.slots().get(family)?.grants.clone())
    }

    fn prepare(
        &self,
        family: &str,
        component_name: &str,
        bytes: &[u8],
        grants: &Grants,
    ) -> Result<LoadedPlugin> {
        let hash = marketplace_common::hex::sha256(bytes);
        let component = self.compile(bytes, &hash)?;
        let imports: Vec<String> = component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect();
        let (kind, info, api) = if family == FEES_FAMILY {
            let not_fees = |e: &dyn std::fmt::Display| {
                anyhow!(
                    "not a fee-policy component: {e} (it exports the `fees` interface of the `fee-policy` world of marketplace:plugin@0.2.0, wit/marketplace.wit: quote, schedule, policy, describe)"
                )
            };
            // The world first: an endpoint component's imports would fail
            // the link with a message that does not say what is wrong.
            if component
                .get_export_index(None, "marketplace:plugin/fees@0.2.0")
                .is_none()
            {
                return Err(not_fees(&"it has no fees export"));
            }
            let pre = FeePolicyPre::new(self.link(&self.fee_linker, &component)?)
                .map_err(|e| not_fees(&format!("{e:#}")))?;
            let mut store = self.fee_store(self.load_budget());
            let bindings = pre
                .instantiate(&mut store)
                .map_err(|e| anyhow!("instantiating failed: {e}"))?;
            let fees = bindings.marketplace_plugin_fees();
            let failed = |what: &str, e: wasmtime::Error, store: &Store<FeeCtx>| {
                let data = store.data();
                smoke_failure(what, e, data.memory_hit(), data.panic_message())
            };
            let info = fees
                .call_describe(&mut store)
                .map_err(|e| failed("smoke call describe()", e, &store))?;
            // Its name does not change while it is loaded: asked once.
            let policy = fees
                .call_policy(&mut store)
                .map_err(|e| failed("smoke call policy()", e, &store))?;
            label("policy()", &policy)?;
            known_policy(&policy)?;
            // Every price the host asks for, once: a setting the component
            // cannot read (`[settings.fees] post = "abc"`) refuses it here,
            // naming the setting, instead of failing every paid request.
            let mut quotes = HashMap::new();
            for (action, basis) in SMOKE_QUOTES {
                let price = fees
                    .call_quote(&mut store, action, basis)
                    .map_err(|e| failed(&format!("smoke call quote({action})"), e, &store))?
                    .map_err(|e| {
                        anyhow!(
                            "the fee policy cannot price {action}: {}",
                            crate::logging::one_line(&e, 500)
                        )
                    })?;
                quotes.insert((action.to_string(), basis), price);
            }
            for action in ["buy", "arbitration"] {
                for basis in RULE_BASES {
                    let priced = fees
                        .call_quote(&mut store, action, Some(basis))
                        .map_err(|e| failed(&format!("smoke call quote({action})"), e, &store))?;
                    if let Ok(price) = priced {
                        quote_keeps_the_rules(action, Some(basis), price)
                            .map_err(|why| anyhow!("the fee policy breaks a rule: {why}"))?;
                    }
                }
            }
            let schedule = fees
                .call_schedule(&mut store)
                .map_err(|e| failed("smoke call schedule()", e, &store))?;
            anyhow::ensure!(
                schedule.len() <= MAX_SCHEDULE_BYTES,
                "the fee schedule is {} bytes, over {} KiB",
                schedule.len(),
                MAX_SCHEDULE_BYTES >> 10
            );
            let document = serde_json::from_str::<serde_json::Value>(&schedule)
                .ok()
                .filter(|v| v.is_object())
                .ok_or_else(|| anyhow!("the fee schedule is not a JSON object"))?;
            schedule_says_what_is_charged(&document, &policy, &quotes)?;
            (
                Kind::Fees {
                    pre,
                    policy,
                    quotes: Mutex::new(quotes),
                },
                info,
                Api::default(),
            )
        } else {
            grants
                .admit(
                    family,
                    // (The hint's table names the file only where a
                    // configuration can: in the families directory.)
                    (self.config.family(family).is_none()
                        && crate::config::in_families_dir(component_name))
                    .then_some(component_name),
                    imports.iter().map(String::as_str),
                )
                .map_err(|e| anyhow!(e))?;
            handle_export(&component)
                .map_err(|e| anyhow!("not an endpoint component: {e:#} ({ENDPOINT_EXPORTS})"))?;
            let linker = self.endpoint_linker(grants)?;
            let endpoint = |component: &Component| {
                EndpointPre::new(self.link(&linker, component)?)
                    .map_err(|e| anyhow!("not an endpoint component: {e:#} ({ENDPOINT_EXPORTS})"))
            };
            let pre = endpoint(&component)?;
            // The smoke calls run on a copy of the compiled component (see
            // `probe_copy`), so the memory slot they leave dirty is not the
            // one every request then resets.
            let (info, api) = match self.probe_copy(&hash) {
                Some(probe) => self.smoke_describe(family, &endpoint(&probe)?)?,
                None => self.smoke_describe(family, &pre)?,
            };
            // Same compiled bytes, so the type `smoke_describe` checked is
            // this export's type too.
            let handle = handle_export(&component)?;
            (Kind::Endpoint { pre, handle }, info, api)
        };
        label("describe().name", &info.name)?;
        label("describe().version", &info.version)?;
        Ok(LoadedPlugin {
            family: family.to_string(),
            component: component_name.to_string(),
            name: info.name,
            version: info.version,
            hash,
            loaded_at: crate::ids::rfc3339(SystemTime::now()),
            grants: Arc::new(grants.clone()),
            imports,
            api,
            kind,
            metrics: Default::default(),
            faults: Default::default(),
            memo: Default::default(),
        })
    }

    /// A linker with the base interfaces and those `grants` open (see
    /// [`endpoint_linker`]).
    fn endpoint_linker(&self, grants: &Grants) -> Result<Linker<Ctx>> {
        endpoint_linker(&self.engine, grants)
    }

    /// Link a component against a world's linker (see [`link`]).
    fn link<T: 'static>(
        &self,
        base: &Linker<T>,
        component: &Component,
    ) -> Result<wasmtime::component::InstancePre<T>> {
        link(&self.engine, base, component)
    }

    /// A second copy of the compiled component `hash`, read again from the
    /// cache, for the load-time smoke calls. A pooled memory slot keeps
    /// every page it ever had written resident (up to [`KEEP_RESIDENT`]),
    /// and each reset rewrites them all; slots are reused by the same
    /// component, most recent first.
    /// `describe-api` builds the family's whole OpenAPI (the trivial
    /// plugin's leaves 15 pages written where a request of its own writes
    /// 3), so run on the serving component it would leave that cost on the
    /// slot every later request takes. A copy is another module to the
    /// pool: its slot is released when the copy is dropped. `None` when the
    /// cache holds no entry (its write failed): the smoke calls then run on
    /// the serving component, as before.
    fn probe_copy(&self, hash: &str) -> Option<Component> {
        // SAFETY: as in `compile`: written by `Component::serialize` of this
        // engine configuration into the operator's own data directory.
        unsafe { Component::deserialize_file(&self.engine, self.cache_path(hash)) }.ok()
    }

    /// Instantiate a loaded component once and ask it what it is and
    /// serves; also checks the type of its `handle` export.
    fn smoke_describe(
        &self,
        family: &str,
        pre: &EndpointPre<Ctx>,
    ) -> Result<(wit::PluginInfo, Api)> {
        // `describe` and `api` must not touch storage or payments; give
        // them an inert context.
        let mut store = self.store_for(
            Ctx::inert(family, self.limits.memory_bytes)
                .with_settings(self.state.config.family_settings(family)),
            self.load_budget(),
        );
        let instance =
            run_to_end(pre.instance_pre().instantiate_async(&mut store)).map_err(|e| {
                let hit = store.data().memory_hit();
                smoke_failure("instantiating it", e, hit, store.data().panic_message())
            })?;
        let bindings = bindings::endpoint::Endpoint::new(&mut store, &instance)
            .map_err(|e| anyhow!("not an endpoint component: {e:#} ({ENDPOINT_EXPORTS})"))?;
        let handle = handle_export(pre.instance_pre().component())?;
        instance
            .get_typed_func::<(&wit::Request,), (wit::Response,)>(&mut store, &handle)
            .map_err(|e| {
                anyhow!("not an endpoint component: handle: {e:#} ({ENDPOINT_EXPORTS})")
            })?;
        let handler = bindings.marketplace_plugin_handler();
        let info = run_to_end(handler.call_describe(&mut store)).map_err(|e| {
            let hit = store.data().memory_hit();
            smoke_failure(
                "smoke call describe()",
                e,
                hit,
                store.data().panic_message(),
            )
        })?;
        let declared = run_to_end(handler.call_describe_api(&mut store)).map_err(|e| {
            let hit = store.data().memory_hit();
            smoke_failure(
                "smoke call describe-api()",
                e,
                hit,
                store.data().panic_message(),
            )
        })?;
        let routes = declared
            .routes
            .into_iter()
            .map(|r| (r.method, r.pattern, r.writes, r.paid, r.openapi, r.max_body))
            .collect();
        let api = Api::check(routes, &declared.schemas)
            .map_err(|e| anyhow!("the component's api is refused: {e}"))?;
        Ok((info, api))
    }

    /// Compile a component into the on-disk cache without loading it, so a
    /// later swap to it is fast. Invalid bytes are only logged.
    pub fn precompile(&self, bytes: &[u8]) -> bool {
        let hash = marketplace_common::hex::sha256(bytes);
        if self.cache_path(&hash).is_file() {
            // Already compiled: loading it here would only be done again
            // by the swap that uses it.
            return true;
        }
        match self.compile(bytes, &hash) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!("not precompiling {}: {e:#}", &hash[..12]);
                false
            }
        }
    }

    /// Compile, or load the natively compiled form from the cache.
    /// Where the compiled form of the component with sha256 `hash` is
    /// cached for this engine configuration.
    fn cache_path(&self, hash: &str) -> PathBuf {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        self.cache_dir
            .join(format!("{hash}-{:016x}.cwasm", h.finish()))
    }

    fn compile(&self, bytes: &[u8], hash: &str) -> Result<Component> {
        let path = self.cache_path(hash);
        if path.is_file() {
            // An entry's time is its last use: pruning keeps what is used.
            let _ = std::fs::File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(SystemTime::now()));
            // SAFETY: the file was written by `Component::serialize` of this
            // same engine configuration (the name carries the compatibility
            // hash) into the operator's own data directory.
            match unsafe { Component::deserialize_file(&self.engine, &path) } {
                Ok(c) => return Ok(c),
                Err(e) => tracing::warn!("ignoring unusable cache entry {}: {e}", path.display()),
            }
        }
        // (An upload of a file that was not there: `curl --data-binary @x`.)
        if bytes.is_empty() {
            anyhow::bail!("not a component: the file is empty (0 bytes)");
        }
        // A core module (version 1) rather than a component (layer 1) is
        // a common mistake of a plugin's build: say which.
        if bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0] {
            anyhow::bail!(
                "a core WebAssembly module, not a component: build for wasm32-wasip2 (or with cargo-component), or wrap it with `wasm-tools component new`"
            );
        }
        let component = Component::new(&self.engine, bytes).map_err(|e| {
            // The pool's slots are as large as the memory cap: a module
            // whose initial memory is larger cannot be given one.
            if format!("{e:#}").contains("minimum byte size") {
                anyhow!(
                    "the component's initial memory is larger than a plugin may have (plugin_memory_mib = {} MiB; a build's --initial-memory counts): {e:#}",
                    self.limits.memory_bytes >> 20
                )
            } else {
                anyhow!("not a valid component: {e}")
            }
        })?;
        match component.serialize() {
            Ok(native) => {
                // A unique name: servers sharing the cache may compile the
                // same component at once; the rename is atomic.
                static SEQ: AtomicU64 = AtomicU64::new(0);
                let tmp = path.with_extension(format!(
                    "{}-{}.tmp",
                    std::process::id(),
                    SEQ.fetch_add(1, Ordering::Relaxed)
                ));
                if let Err(e) =
                    std::fs::write(&tmp, native).and_then(|_| std::fs::rename(&tmp, &path))
                {
                    tracing::warn!("could not cache compiled component: {e}");
                }
            }
            Err(e) => tracing::warn!("could not serialize compiled component: {e}"),
        }
        Ok(component)
    }

    /// The plugin currently serving `family`.
    pub fn plugin(&self, family: &str) -> Option<Arc<LoadedPlugin>> {
        self.slots().get(family)?.loaded.clone()
    }

    /// Status of one family, if it has a slot.
    pub fn status(&self, family: &str) -> Option<PluginStatus> {
        self.statuses().into_iter().find(|s| s.family == family)
    }

    /// Status of every configured family.
    pub fn statuses(&self) -> Vec<PluginStatus> {
        self.statuses_with(true)
    }

    /// Status of every configured family; `detailed` false leaves each
    /// status's routes and imports empty (info needs neither, and listing
    /// them copies a string per route and import).
    pub fn statuses_with(&self, detailed: bool) -> Vec<PluginStatus> {
        self.with_statuses(|statuses| {
            statuses
                .map(|v| PluginStatus {
                    family: v.family.to_string(),
                    component: v.component.to_string(),
                    name: v.loaded.map(|p| p.name.clone()).unwrap_or_default(),
                    version: v.version.to_string(),
                    status: v.status.into(),
                    hash: v.loaded.map(|p| p.hash.clone()).unwrap_or_default(),
                    loaded_at: v.loaded.map(|p| p.loaded_at.clone()).unwrap_or_default(),
                    grants: v.grants.names(),
                    reads: v.grants.reads.iter().cloned().collect(),
                    routes: match v.loaded {
                        Some(p) if detailed => p
                            .api
                            .routes
                            .iter()
                            .map(|r| format!("{} {}", r.method, r.pattern))
                            .collect(),
                        _ => Vec::new(),
                    },
                    imports: match v.loaded {
                        Some(p) if detailed => p.imports.clone(),
                        _ => Vec::new(),
                    },
                    error: v.error.map(str::to_string),
                    consecutive_faults: v.consecutive_faults(),
                    last_fault: match v.loaded {
                        Some(p) if detailed => p.faults.last(),
                        _ => None,
                    },
                })
                .collect()
        })
    }

    /// Look at every configured family's status where it is kept, without
    /// copying it out (health renders them straight to JSON).
    pub fn with_statuses<R>(
        &self,
        f: impl FnOnce(&mut dyn Iterator<Item = StatusView<'_>>) -> R,
    ) -> R {
        let slots = self.slots();
        let loading = self.loading();
        // A configured family an admin unmounted (its data stays): listed,
        // once loading is over, as what the operator decided.
        let unmounted = self
            .configured
            .iter()
            .filter(|f| !loading && !slots.contains_key(&f.name))
            .map(|f| StatusView {
                family: &f.name,
                component: &f.component,
                version: "",
                status: "unmounted",
                grants: &f.grants,
                loaded: None,
                error: None,
            });
        f(&mut slots
            .iter()
            .map(|(family, slot)| match &slot.loaded {
                Some(p) => StatusView {
                    family,
                    component: &p.component,
                    version: &p.version,
                    status: "ok",
                    grants: &slot.grants,
                    loaded: Some(p),
                    error: None,
                },
                None => StatusView {
                    family,
                    component: &slot.component,
                    version: "",
                    status: if slot.error.is_none() && loading {
                        "loading"
                    } else {
                        "unavailable"
                    },
                    grants: &slot.grants,
                    loaded: None,
                    error: slot.error.as_deref(),
                },
            })
            .chain(unmounted))
    }

    /// Why a family is unavailable, if it is.
    pub fn load_error(&self, family: &str) -> Option<String> {
        self.slots().get(family)?.error.clone()
    }
}

/// The runtime reaches storage, the ledger, ids, the clock and the
/// configuration through its state: `rt.storage`, `rt.now_ms()`.
impl std::ops::Deref for Runtime {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
    }
}

/// The `endpoint` world's linker of a family granted `grants`: the base
/// interfaces and the granted ones; nothing else of the marketplace
/// package is defined (an import of an interface not granted is refused
/// before, by `Grants::admit`, naming the grant).
fn endpoint_linker(engine: &Engine, grants: &Grants) -> Result<Linker<Ctx>> {
    use bindings::endpoint::marketplace::plugin as p;
    type D = wasmtime::component::HasSelf<Ctx>;
    let mut l = Linker::<Ctx>::new(engine);
    let e = |e: wasmtime::Error| anyhow!("linking: {e}");
    p::types::add_to_linker::<Ctx, D>(&mut l, |c| c).map_err(e)?;
    p::storage::add_to_linker::<Ctx, D>(&mut l, |c| c).map_err(e)?;
    p::clock::add_to_linker::<Ctx, D>(&mut l, |c| c).map_err(e)?;
    p::ids::add_to_linker::<Ctx, D>(&mut l, |c| c).map_err(e)?;
    p::log::add_to_linker::<Ctx, D>(&mut l, |c| c).map_err(e)?;
    p::settings::add_to_linker::<Ctx, D>(&mut l, |c| c).map_err(e)?;
    p::memo::add_to_linker::<Ctx, D>(&mut l, |c| c).map_err(e)?;
    for c in &grants.capabilities {
        match c {
            Capability::Payments => p::payments::add_to_linker::<Ctx, D>(&mut l, |c| c),
            Capability::Signatures => p::auth::add_to_linker::<Ctx, D>(&mut l, |c| c),
            Capability::Escrow => p::escrow::add_to_linker::<Ctx, D>(&mut l, |c| c),
            Capability::Dispatch => p::dispatch::add_to_linker::<Ctx, D>(&mut l, |c| c),
            Capability::HostInfo => p::host::add_to_linker::<Ctx, D>(&mut l, |c| c),
            Capability::Limits => p::limits::add_to_linker::<Ctx, D>(&mut l, |c| c),
            Capability::Arbiter => p::arbiter::add_to_linker::<Ctx, D>(&mut l, |c| c),
            // Headers, not an interface (see `server::http`).
            Capability::Credentials => Ok(()),
        }
        .map_err(e)?;
    }
    Ok(l)
}

/// Link a component against a world's linker: the host interfaces,
/// `wasi:random`, and traps for the other WASI imports (std's, so that
/// components std makes import them still load). An import of a host
/// interface the host does not have as imported (a function it lacks,
/// another type: built against another WIT) is refused here, naming
/// it, not linked as a trap that would answer 500 at the first call.
fn link<T: 'static>(
    engine: &Engine,
    base: &Linker<T>,
    component: &Component,
) -> Result<wasmtime::component::InstancePre<T>> {
    let mut linker = base.clone();
    define_wasi_random(&mut linker, engine, component)?;
    stub_wasi_as_traps(&mut linker, engine, component).map_err(|e| anyhow!("linking: {e:#}"))?;
    linker.instantiate_pre(component).map_err(|e| {
        anyhow!(
            "linking: {e:#} (a component must be built against this host's wit/marketplace.wit, served at GET /api/developers)"
        )
    })
}

/// The functions [`define_wasi_random`] answers, by interface.
const WASI_RANDOM: [(&str, &str); 5] = [
    ("wasi:random/insecure-seed", "insecure-seed"),
    ("wasi:random/random", "get-random-bytes"),
    ("wasi:random/random", "get-random-u64"),
    ("wasi:random/insecure", "get-insecure-random-bytes"),
    ("wasi:random/insecure", "get-insecure-random-u64"),
];

/// Link every function (and resource) of the component's WASI imports
/// but those [`define_wasi_random`] answers as a trap that names it.
fn stub_wasi_as_traps<T: 'static>(
    linker: &mut Linker<T>,
    engine: &Engine,
    component: &Component,
) -> Result<()> {
    use wasmtime::component::types::ComponentItem;
    for (name, item) in component.component_type().imports(engine) {
        if !name.starts_with("wasi:") {
            continue;
        }
        let interface = name.split('@').next().unwrap_or(name);
        let ComponentItem::ComponentInstance(instance) = item.ty else {
            continue;
        };
        let mut stubs = linker.instance(name)?;
        for (export, item) in instance.exports(engine) {
            match item.ty {
                ComponentItem::ComponentFunc(_) if WASI_RANDOM.contains(&(interface, export)) => {}
                ComponentItem::ComponentFunc(_) => {
                    let full = format!("{name}#{export}");
                    stubs.func_new(export, move |_, _, _, _| {
                        wasmtime::bail!("unknown import: `{full}` has not been defined")
                    })?;
                }
                ComponentItem::Resource(_) => {
                    let ty = wasmtime::component::ResourceType::host::<()>();
                    stubs.resource(export, ty, |_, _| Ok(()))?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Provide the `wasi:random` interfaces a component imports (Rust's std
/// seeds `HashMap` from `insecure-seed`), from the OS CSPRNG, for whichever
/// 0.2.x version the component was built against. Every other WASI import
/// traps if called: plugins reach the outside world only through the
/// marketplace interfaces.
fn define_wasi_random<T: 'static>(
    linker: &mut Linker<T>,
    engine: &Engine,
    component: &Component,
) -> Result<()> {
    fn rand_u64() -> u64 {
        let mut b = [0u8; 8];
        crate::ids::fill_random(&mut b);
        u64::from_le_bytes(b)
    }
    fn rand_bytes(len: u64) -> wasmtime::Result<Vec<u8>> {
        if len > 1 << 20 {
            wasmtime::bail!("random byte request over 1 MiB");
        }
        let mut b = vec![0u8; len as usize];
        crate::ids::fill_random(&mut b);
        Ok(b)
    }
    let names: Vec<String> = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .filter(|n| n.starts_with("wasi:random/"))
        .collect();
    let e = |e: wasmtime::Error| anyhow!("defining {e}");
    for name in names {
        let interface = name.split('@').next().unwrap_or_default();
        let mut inst = linker.instance(&name).map_err(e)?;
        match interface {
            "wasi:random/insecure-seed" => inst
                .func_wrap("insecure-seed", |_, (): ()| Ok(((rand_u64(), rand_u64()),)))
                .map_err(e)?,
            "wasi:random/random" => {
                inst.func_wrap("get-random-bytes", |_, (len,): (u64,)| {
                    Ok((rand_bytes(len)?,))
                })
                .map_err(e)?;
                inst.func_wrap("get-random-u64", |_, (): ()| Ok((rand_u64(),)))
                    .map_err(e)?;
            }
            "wasi:random/insecure" => {
                inst.func_wrap("get-insecure-random-bytes", |_, (len,): (u64,)| {
                    Ok((rand_bytes(len)?,))
                })
                .map_err(e)?;
                inst.func_wrap("get-insecure-random-u64", |_, (): ()| Ok((rand_u64(),)))
                    .map_err(e)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Largest component file, as the admin API's largest upload.
pub const MAX_COMPONENT_BYTES: usize = 64 << 20;

/// The bytes of the component file at `path` (a symlink followed): only a
/// regular file of at most [`MAX_COMPONENT_BYTES`]. What is not one (a
/// FIFO, whose blocking open held the watcher for good; a device, which
/// an open may act on, or `/dev/zero`, read until memory ran out) is
/// refused before it is opened, and a file swapped for one between the
/// look and the open is opened without blocking or becoming a terminal
/// and refused as well; a larger file is refused before it is read.
pub fn read_component(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let regular = |meta: &std::fs::Metadata| {
        if !meta.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        // (No component is empty; `/proc` files say they are, and some
        // block when read, `/proc/kmsg`.)
        if meta.len() == 0 {
            return Err(std::io::Error::other("an empty file"));
        }
        if meta.len() > MAX_COMPONENT_BYTES as u64 {
            return Err(std::io::Error::other(format!(
                "{} bytes, over the {MAX_COMPONENT_BYTES} a component may have",
                meta.len()
            )));
        }
        Ok(())
    };
    let looked = std::fs::metadata(path)?;
    regular(&looked)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    regular(&meta)?;
    if (meta.dev(), meta.ino()) != (looked.dev(), looked.ino()) {
        return Err(std::io::Error::other("replaced while being opened"));
    }
    // Read as any file (a network filesystem may answer EAGAIN to a
    // non-blocking read).
    let flags = rustix::fs::fcntl_getfl(&file)?;
    rustix::fs::fcntl_setfl(&file, flags - rustix::fs::OFlags::NONBLOCK)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_COMPONENT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > MAX_COMPONENT_BYTES {
        return Err(std::io::Error::other(format!(
            "over the {MAX_COMPONENT_BYTES} bytes a component may have"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_versions_are_short_and_shown_as_written() {
        assert!(label("describe().version", "0.1.0").is_ok());
        assert!(label("describe().name", "fees-bid-inclusive é").is_ok());
        assert!(label("describe().version", &"9".repeat(MAX_LABEL)).is_ok());
        let long = label("describe().version", &"9".repeat(MAX_LABEL + 1)).unwrap_err();
        assert!(long.to_string().contains("over 64"), "{long}");
        for forged in [
            "0.1.0\nZ  WARN marketplace: admin token rotated",
            "0.1.0\u{1b}[31m",
            "0.1.0\u{2028}next",
            "\u{202e}0.1.0",
            "0.1\u{200b}.0",
        ] {
            let e = label("describe().version", forged).unwrap_err().to_string();
            assert!(e.contains("invisible"), "{e}");
            assert!(!e.contains('\n') && !e.contains('\u{1b}'), "{e}");
        }
    }

    #[test]
    fn an_import_the_host_lacks_is_refused_at_load_and_wasi_links_as_traps() {
        let engine = Engine::new(&wasmtime::Config::new()).unwrap();
        let linker = endpoint_linker(&engine, &Grants::default()).unwrap();
        let component = |imports: &str| {
            let bytes = wat::parse_str(format!("(component {imports})")).unwrap();
            Component::new(&engine, bytes).unwrap()
        };
        let fs = r#"(import "wasi:filesystem/preopens@0.2.6" (instance (export "get-directories" (func (result u32)))))"#;
        let newer = r#"(import "marketplace:plugin/clock@0.2.0" (instance (export "now-ns" (func (result u64)))))"#;
        let ungranted =
            r#"(import "marketplace:plugin/escrow@0.2.0" (instance (export "hold" (func))))"#;
        // A WASI import std may make: linked, as a trap if called.
        assert!(link(&engine, &linker, &component(fs)).is_ok());
        // A function of a host interface the host does not have (built
        // against a newer WIT): refused, naming it.
        let err = link(&engine, &linker, &component(&format!("{fs} {newer}")))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("marketplace:plugin/clock") && err.contains("now-ns"),
            "{err}"
        );
        assert!(err.contains("wit/marketplace.wit"), "{err}");
        assert!(link(&engine, &linker, &component(ungranted)).is_err());
    }

    #[test]
    fn the_compile_cache_keeps_what_is_used_and_drops_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let day = Duration::from_secs(24 * 3600);
        let file = |name: &str, age: Duration| {
            let path = dir.path().join(name);
            std::fs::write(&path, b"x").unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(now - age).unwrap();
        };
        file("used-recently.cwasm", 3 * day);
        file("stale.cwasm", 40 * day);
        file("writer-died.1-0.tmp", 2 * day);
        file("writing-now.2-0.tmp", Duration::from_secs(60));
        file("operator-notes.txt", 400 * day);
        assert_eq!(prune_cache(dir.path(), now), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "operator-notes.txt",
                "used-recently.cwasm",
                "writing-now.2-0.tmp"
            ]
        );
    }
}
