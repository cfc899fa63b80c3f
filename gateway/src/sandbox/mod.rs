//! Tenant prompt templates in a wasmtime sandbox (ABI: `guest-sdk/ABI.md`).
//!
//! - One wasmtime [`Engine`] with the pooling allocator: instance slots, memories and tables are
//!   reserved up front, so a fresh instance per call costs microseconds, and the number of
//!   template calls in flight is bounded (a full pool answers `template_busy`).
//! - Each module is validated once (binary Wasm, size cap, exports with their types, imports only
//!   `cachet.log`, ABI version) and kept as an [`InstancePre`] in an LRU keyed by the blake3 of
//!   its bytes: the same module uploaded twice compiles once.
//! - Every call: a new [`Store`] and instance (nothing survives between requests or tenants), a
//!   fuel budget, an epoch deadline (a ticker thread advances the epoch every
//!   [`EPOCH_TICK`]), a memory cap enforced by a [`ResourceLimiter`], and an output cap. Every
//!   failure is a typed [`TemplateError`] for that request alone.

pub mod compile;
mod error;
pub mod store;

pub use error::TemplateError;

pub use compile::{compile_child, CompileIn, COMPILE_MEMORY};
use compile::{compile_in_child, wasm_config};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cachet_guest_sdk::{Rendered, Request, ABI_VERSION};
use wasmtime::{
    Caller, Engine, ExternType, InstanceAllocationStrategy, InstancePre, Linker, Module,
    PoolingAllocationConfig, ResourceLimiter, Store, Trap, ValType,
};

/// How often the epoch advances; deadlines are whole ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Sandbox-wide limits (a tenant's own budgets may only be tighter).
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Wall-clock budget of one call.
    pub deadline: Duration,
    /// Fuel (roughly, Wasm instructions) of one call.
    pub fuel: u64,
    /// Linear memory of one instance.
    pub memory_bytes: usize,
    /// Largest reply a template may return.
    pub output_bytes: usize,
    /// Largest module that may be uploaded.
    pub module_bytes: usize,
    /// Template calls in flight at once (pool slots).
    pub instances: u32,
    /// Bytes of compiled code kept in memory (LRU beyond).
    pub cache_bytes: usize,
    /// Most functions a module may define, and locals one function may declare: what bounds
    /// the time it takes to compile (checked by parsing, before compiling).
    pub max_functions: u32,
    pub max_locals: u32,
    /// Modules compiled at once (each on one thread), and how long one may take.
    pub compile_slots: usize,
    pub compile_deadline: Duration,
    /// Where modules are compiled: see [`CompileIn`].
    pub compile_in: CompileIn,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            deadline: Duration::from_millis(50),
            fuel: 200_000_000,
            memory_bytes: 32 << 20,
            output_bytes: 1 << 20,
            module_bytes: 4 << 20,
            instances: 64,
            cache_bytes: 256 << 20,
            max_functions: 10_000,
            max_locals: 50_000,
            compile_slots: 2,
            compile_deadline: Duration::from_secs(10),
            compile_in: CompileIn::Thread,
        }
    }
}

/// A tenant's budgets for one call, within the sandbox's.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub deadline: Duration,
    pub fuel: u64,
    pub memory_bytes: usize,
}

/// Per-call host state.
struct Host {
    memory_limit: usize,
    memory_refused: bool,
    tag: Arc<str>,
    log_lines: u32,
}

impl ResourceLimiter for Host {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_refused = true;
            wasmtime::bail!(
                "memory limit of {} bytes reached (asked for {desired})",
                self.memory_limit
            );
        }
        Ok(true)
    }
    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= TABLE_ELEMENTS)
    }
}

const TABLE_ELEMENTS: usize = 10_000;
const KEEP_RESIDENT: usize = 512 << 10;
const MAX_LOG_LINES: u32 = 16;
const MAX_LOG_BYTES: u32 = 1024;

/// A validated, compiled template module.
pub struct Compiled {
    pre: InstancePre<Host>,
    pub hash: [u8; 32],
    pub size: usize,
    /// Bytes of its compiled code image.
    pub code_bytes: usize,
}

/// What one call cost.
#[derive(Debug, Clone, Copy)]
pub struct CallStats {
    pub elapsed: Duration,
    pub fuel_used: u64,
}

/// The sandbox: engine, linker, module cache and epoch ticker.
pub struct Sandbox {
    engine: Engine,
    linker: Linker<Host>,
    cache: Mutex<ModuleCache>,
    config: SandboxConfig,
    stop: Arc<AtomicBool>,
    /// Compilations that may run at once.
    compiling: Arc<(Mutex<usize>, std::sync::Condvar)>,
}

/// Compiled modules by the blake3 of their bytes, bounded in bytes of code.
struct ModuleCache {
    lru: lru::LruCache<[u8; 32], Arc<Compiled>>,
    bytes: usize,
}

/// A compile slot; given back on drop.
struct CompileSlot(Arc<(Mutex<usize>, std::sync::Condvar)>);

impl Drop for CompileSlot {
    fn drop(&mut self) {
        *self.0 .0.lock().expect("slots lock") -= 1;
        self.0 .1.notify_one();
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Sandbox {
    pub fn new(config: SandboxConfig) -> anyhow::Result<Arc<Sandbox>> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_core_instances(config.instances)
            .total_memories(config.instances)
            .total_tables(config.instances)
            .max_memory_size(config.memory_bytes)
            .table_elements(TABLE_ELEMENTS)
            // Reset a slot's first 512 KiB (a template's stack, data and small heap) with memset
            // instead of returning the pages to the kernel: the next call takes no page faults.
            .linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(64 << 10);
        let mut wc = wasm_config();
        wc.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wc)?;
        let mut linker = Linker::new(&engine);
        linker.func_wrap(
            "cachet",
            "log",
            |mut caller: Caller<'_, Host>, ptr: u32, len: u32| {
                let host = caller.data();
                if host.log_lines >= MAX_LOG_LINES {
                    return;
                }
                let tag = host.tag.clone();
                let len = len.min(MAX_LOG_BYTES) as usize;
                let Some(mem) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
                    return;
                };
                let data = mem.data(&caller);
                let line = data
                    .get(ptr as usize..(ptr as usize).saturating_add(len))
                    .map(|b| String::from_utf8_lossy(b).into_owned());
                caller.data_mut().log_lines += 1;
                if let Some(line) = line {
                    tracing::info!(template = %tag, "{line}");
                }
            },
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("cachet-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })?;
        }
        Ok(Arc::new(Sandbox {
            engine,
            linker,
            cache: Mutex::new(ModuleCache {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            compiling: Arc::new((Mutex::new(0), std::sync::Condvar::new())),
            config,
            stop,
        }))
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// The sandbox's budgets, tightened by a tenant's (`None` keeps the sandbox's).
    pub fn budget(
        &self,
        deadline: Option<Duration>,
        fuel: Option<u64>,
        memory: Option<usize>,
    ) -> Budget {
        let c = &self.config;
        Budget {
            deadline: deadline.map_or(c.deadline, |d| d.min(c.deadline)),
            fuel: fuel.map_or(c.fuel, |f| f.min(c.fuel)),
            memory_bytes: memory.map_or(c.memory_bytes, |m| m.min(c.memory_bytes)),
        }
    }

    /// A compiled module by the blake3 of its bytes, if it is in the cache.
    pub fn cached(&self, hash: &[u8; 32]) -> Option<Arc<Compiled>> {
        self.cache
            .lock()
            .expect("cache lock")
            .lru
            .get(hash)
            .cloned()
    }

    /// Drops a module from the cache (its template was deleted or deactivated); its code is
    /// freed once no call holds it.
    pub fn evict(&self, hash: &[u8; 32]) {
        let mut c = self.cache.lock().expect("cache lock");
        if let Some(m) = c.lru.pop(hash) {
            c.bytes -= m.code_bytes;
        }
    }

    /// Bytes of compiled code in the cache, and modules.
    pub fn cache_usage(&self) -> (usize, usize) {
        let c = self.cache.lock().expect("cache lock");
        (c.bytes, c.lru.len())
    }

    fn remember(&self, compiled: &Arc<Compiled>) {
        let mut c = self.cache.lock().expect("cache lock");
        if compiled.code_bytes > self.config.cache_bytes {
            return;
        }
        if let Some(old) = c.lru.put(compiled.hash, compiled.clone()) {
            c.bytes -= old.code_bytes;
        }
        c.bytes += compiled.code_bytes;
        while c.bytes > self.config.cache_bytes {
            match c.lru.pop_lru() {
                Some((_, m)) => c.bytes -= m.code_bytes,
                None => break,
            }
        }
    }

    /// Waits (a little) for a compile slot.
    fn compile_slot(&self) -> Result<CompileSlot, TemplateError> {
        let (lock, cv) = &*self.compiling;
        let mut n = lock.lock().expect("slots lock");
        let t0 = Instant::now();
        while *n >= self.config.compile_slots.max(1) {
            let left = Duration::from_secs(2).saturating_sub(t0.elapsed());
            if left.is_zero() {
                return Err(TemplateError::Busy);
            }
            n = cv.wait_timeout(n, left).expect("slots lock").0;
        }
        *n += 1;
        Ok(CompileSlot(self.compiling.clone()))
    }

    /// Compiles where the config says ([`CompileIn`]), holding a compile slot until it is
    /// done, within the compile deadline.
    fn compile_bounded(&self, bytes: &[u8]) -> Result<Module, TemplateError> {
        let slot = self.compile_slot()?;
        if let CompileIn::Process(exe) = &self.config.compile_in {
            let code = compile_in_child(exe, bytes, self.config.compile_deadline)?;
            drop(slot);
            // SAFETY: `code` is what `Engine::precompile_module` wrote in a child process of
            // this very program, with this engine's compiler settings (`wasm_config`); the
            // bytes never left this machine's pipes, and `deserialize` checks that the
            // settings match before it loads anything.
            return unsafe { Module::deserialize(&self.engine, &code) }
                .map_err(|e| TemplateError::NotWasm(format!("{e:#}")));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = self.engine.clone();
        let bytes = bytes.to_vec();
        std::thread::Builder::new()
            .name("cachet-template-compile".into())
            .spawn(move || {
                let _slot = slot;
                let _ = tx.send(Module::from_binary(&engine, &bytes));
            })
            .map_err(|e| TemplateError::Storage(format!("starting a compile thread: {e}")))?;
        match rx.recv_timeout(self.config.compile_deadline) {
            Ok(m) => m.map_err(|e| TemplateError::NotWasm(format!("{e:#}"))),
            Err(_) => Err(TemplateError::CompileTimeout(self.config.compile_deadline)),
        }
    }

    /// Validates and compiles a module (or returns the cached one with the same bytes).
    pub fn compile(&self, bytes: &[u8]) -> Result<Arc<Compiled>, TemplateError> {
        if bytes.len() > self.config.module_bytes {
            return Err(TemplateError::ModuleTooLarge {
                size: bytes.len(),
                limit: self.config.module_bytes,
            });
        }
        let hash = *blake3::hash(bytes).as_bytes();
        if let Some(c) = self.cached(&hash) {
            return Ok(c);
        }
        if !bytes.starts_with(b"\0asm") {
            return Err(TemplateError::NotWasm(
                "it does not start with the Wasm magic bytes `\\0asm` (upload the binary .wasm, not text)".into(),
            ));
        }
        precheck(bytes, &self.config)?;
        let module = self.compile_bounded(bytes)?;
        check_interface(&module)?;
        let pre = self
            .linker
            .instantiate_pre(&module)
            .map_err(|e| TemplateError::NotWasm(format!("{e:#}")))?;
        let image = module.image_range();
        let compiled = Arc::new(Compiled {
            pre,
            hash,
            size: bytes.len(),
            code_bytes: (image.end as usize).saturating_sub(image.start as usize),
        });
        // The ABI version, asked under the sandbox's own budget.
        let budget = self.budget(None, None, None);
        let mut store = self.store(&budget, "upload".into());
        let found = (|| {
            let inst = compiled.pre.instantiate(&mut store)?;
            let f = inst.get_typed_func::<(), i32>(&mut store, "cachet_abi_version")?;
            f.call(&mut store, ())
        })()
        .map_err(|e| classify(e, &store, &budget))?;
        if found as i64 != ABI_VERSION as i64 {
            return Err(TemplateError::AbiVersion {
                found: found as i64,
                expected: ABI_VERSION,
            });
        }
        self.remember(&compiled);
        Ok(compiled)
    }

    fn store(&self, budget: &Budget, tag: Arc<str>) -> Store<Host> {
        let mut store = Store::new(
            &self.engine,
            Host {
                memory_limit: budget.memory_bytes,
                memory_refused: false,
                tag,
                log_lines: 0,
            },
        );
        store.limiter(|h| h as &mut dyn ResourceLimiter);
        store.set_fuel(budget.fuel).expect("fuel is enabled");
        let ticks = budget.deadline.as_micros().div_ceil(EPOCH_TICK.as_micros()) as u64;
        store.set_epoch_deadline(ticks.max(1));
        store.epoch_deadline_trap();
        store
    }

    /// Renders `req` with a fresh instance of `module` under `budget`. `tag` names the tenant
    /// and template in the module's log lines.
    pub fn render(
        &self,
        module: &Compiled,
        req: &Request,
        budget: &Budget,
        tag: Arc<str>,
    ) -> Result<(Rendered, CallStats), TemplateError> {
        let input = serde_json::to_vec(req).map_err(|e| TemplateError::Storage(e.to_string()))?;
        let t0 = Instant::now();
        let mut store = self.store(budget, tag);
        let reply = (|| -> wasmtime::Result<Vec<u8>> {
            let inst = module.pre.instantiate(&mut store)?;
            let memory = inst
                .get_memory(&mut store, "memory")
                .ok_or_else(|| wasmtime::format_err!("no memory export"))?;
            let alloc = inst.get_typed_func::<u32, u32>(&mut store, "cachet_alloc")?;
            let render = inst.get_typed_func::<(u32, u32), u64>(&mut store, "cachet_render")?;
            let len = u32::try_from(input.len())
                .map_err(|_| wasmtime::format_err!("request too large"))?;
            let ptr = alloc.call(&mut store, len)?;
            memory
                .write(&mut store, ptr as usize, &input)
                .map_err(|_| {
                    wasmtime::format_err!(
                        "cachet_alloc returned memory outside the module's memory"
                    )
                })?;
            let packed = render.call(&mut store, (ptr, len))?;
            let (optr, olen) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
            if olen > self.config.output_bytes {
                return Err(wasmtime::Error::new(OutputCap(olen)));
            }
            let bytes = memory
                .data(&store)
                .get(optr..optr.saturating_add(olen))
                .ok_or_else(|| {
                    wasmtime::Error::new(BadReply(format!(
                        "the reply ({olen} bytes at {optr}) lies outside the module's memory"
                    )))
                })?;
            Ok(bytes.to_vec())
        })()
        .map_err(|e| {
            if let Some(OutputCap(n)) = e.downcast_ref::<OutputCap>() {
                return TemplateError::OutputTooLarge {
                    size: *n,
                    limit: self.config.output_bytes,
                };
            }
            if let Some(BadReply(m)) = e.downcast_ref::<BadReply>() {
                return TemplateError::BadOutput(m.clone());
            }
            classify(e, &store, budget)
        })?;
        let fuel_used = budget.fuel - store.get_fuel().unwrap_or(0);
        let rendered = parse_reply(&reply)?;
        Ok((
            rendered,
            CallStats {
                elapsed: t0.elapsed(),
                fuel_used,
            },
        ))
    }
}

#[derive(Debug)]
struct OutputCap(usize);
impl std::fmt::Display for OutputCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "reply of {} bytes", self.0)
    }
}
impl std::error::Error for OutputCap {}

#[derive(Debug)]
struct BadReply(String);
impl std::fmt::Display for BadReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for BadReply {}

/// Maps a failed instantiation or call to what happened to the guest.
fn classify(e: wasmtime::Error, store: &Store<Host>, budget: &Budget) -> TemplateError {
    if store.data().memory_refused {
        return TemplateError::OutOfMemory {
            limit: budget.memory_bytes,
        };
    }
    if let Some(trap) = e.downcast_ref::<Trap>() {
        return match trap {
            Trap::Interrupt => TemplateError::Timeout(budget.deadline),
            Trap::OutOfFuel => TemplateError::OutOfFuel(budget.fuel),
            other => TemplateError::Trap(other.to_string()),
        };
    }
    let msg = format!("{e:#}");
    if msg.contains("maximum concurrent") || msg.contains("pooling") && msg.contains("limit") {
        return TemplateError::Busy;
    }
    if msg.contains("memory") && (msg.contains("exceeds") || msg.contains("minimum")) {
        return TemplateError::OutOfMemory {
            limit: budget.memory_bytes,
        };
    }
    TemplateError::Trap(msg)
}

/// Parses a template's reply: `Rendered`, or `{"error": "..."}` when the template refuses; any
/// bytes give one or a clear error (the `template_reply` fuzz target holds it to that).
pub fn parse_reply(bytes: &[u8]) -> Result<Rendered, TemplateError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| TemplateError::BadOutput(format!("the reply is not UTF-8: {e}")))?;
    // The common case first, straight into the type; then the refusal; then say what is wrong.
    let r: Rendered = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(shape) => {
            let v: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| TemplateError::BadOutput(format!("the reply is not JSON: {e}")))?;
            if let Some(err) = v.get("error") {
                return Err(TemplateError::Refused(
                    err.as_str()
                        .unwrap_or("(no message)")
                        .chars()
                        .take(500)
                        .collect(),
                ));
            }
            return Err(TemplateError::BadOutput(format!(
                "the reply does not match {{segments: [{{role, text, cache}}], stop?, max_tokens?}}: {shape}"
            )));
        }
    };
    if r.segments.is_empty() {
        return Err(TemplateError::BadOutput("the reply has no segments".into()));
    }
    if let Some(s) = r.segments.iter().find(|s| s.role.trim().is_empty()) {
        return Err(TemplateError::BadOutput(format!(
            "a segment has an empty role (text {:?})",
            s.text.chars().take(40).collect::<String>()
        )));
    }
    // The hints get the limits the API's own fields have.
    if r.stop.len() > MAX_STOP_HINTS {
        return Err(TemplateError::BadOutput(format!(
            "the reply has {} stop strings; at most {MAX_STOP_HINTS}",
            r.stop.len()
        )));
    }
    if let Some(s) = r
        .stop
        .iter()
        .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(TemplateError::BadOutput(format!(
            "a stop string is empty or longer than {MAX_STOP_BYTES} bytes ({} bytes)",
            s.len()
        )));
    }
    if r.max_tokens == Some(0) {
        return Err(TemplateError::BadOutput(
            "max_tokens must be at least 1".into(),
        ));
    }
    Ok(r)
}

/// Most stop strings a template's reply may add (the API's own limit), and their longest.
pub const MAX_STOP_HINTS: usize = 4;
pub const MAX_STOP_BYTES: usize = 256;

/// What can be refused by parsing alone, before any compiling: imports other than
/// `cachet.log`, missing exports, and more functions or locals than the limits (which bound the
/// compile time).
pub fn precheck(bytes: &[u8], config: &SandboxConfig) -> Result<(), TemplateError> {
    use wasmparser::{ExternalKind, Parser, Payload};
    let bad = |e: wasmparser::BinaryReaderError| TemplateError::NotWasm(e.to_string());
    let too = |what, found: u64, limit: u32| TemplateError::TooComplex {
        what,
        found,
        limit: limit as u64,
    };
    let mut exports = std::collections::HashSet::new();
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(bad)? {
            Payload::ImportSection(r) => {
                for imp in r.into_imports() {
                    let imp = imp.map_err(bad)?;
                    if !(imp.module == "cachet" && imp.name == "log") {
                        return Err(TemplateError::ForbiddenImport {
                            module: imp.module.into(),
                            name: imp.name.into(),
                        });
                    }
                }
            }
            Payload::FunctionSection(r) if r.count() > config.max_functions => {
                return Err(too("functions", r.count() as u64, config.max_functions));
            }
            Payload::CodeSectionStart { count, .. } if count > config.max_functions => {
                return Err(too("functions", count as u64, config.max_functions));
            }
            Payload::CodeSectionEntry(body) => {
                let mut locals: u64 = 0;
                for l in body.get_locals_reader().map_err(bad)? {
                    locals += l.map_err(bad)?.0 as u64;
                    if locals > config.max_locals as u64 {
                        return Err(too("locals in one function", locals, config.max_locals));
                    }
                }
            }
            Payload::ExportSection(r) => {
                for e in r {
                    let e = e.map_err(bad)?;
                    exports.insert((e.name.to_string(), e.kind == ExternalKind::Memory));
                }
            }
            _ => {}
        }
    }
    if !exports.contains(&("memory".to_string(), true)) {
        return Err(TemplateError::MissingExport {
            what: "a memory named `memory`".into(),
        });
    }
    for f in ["cachet_abi_version", "cachet_alloc", "cachet_render"] {
        if !exports.contains(&(f.to_string(), false)) {
            return Err(TemplateError::MissingExport {
                what: format!("function `{f}` (see guest-sdk/ABI.md)"),
            });
        }
    }
    Ok(())
}

/// Exports with their types, and imports: only `cachet.log`.
fn check_interface(module: &Module) -> Result<(), TemplateError> {
    for imp in module.imports() {
        let ok = imp.module() == "cachet"
            && imp.name() == "log"
            && matches!(imp.ty(), ExternType::Func(f)
                if f.params().map(|p| p.is_i32()).eq([true, true]) && f.results().len() == 0);
        if !ok {
            return Err(TemplateError::ForbiddenImport {
                module: imp.module().into(),
                name: imp.name().into(),
            });
        }
    }
    let func = |name: &str, params: &[fn(&ValType) -> bool], results: &[fn(&ValType) -> bool]| {
        let want = format!(
            "function `{name}` with {} parameter(s) and {} result(s) (see guest-sdk/ABI.md)",
            params.len(),
            results.len()
        );
        match module.get_export(name) {
            Some(ExternType::Func(f))
                if f.params().len() == params.len()
                    && f.results().len() == results.len()
                    && f.params().zip(params).all(|(p, ok)| ok(&p))
                    && f.results().zip(results).all(|(r, ok)| ok(&r)) =>
            {
                Ok(())
            }
            _ => Err(TemplateError::MissingExport { what: want }),
        }
    };
    let i32_: fn(&ValType) -> bool = |t| t.is_i32();
    let i64_: fn(&ValType) -> bool = |t| t.is_i64();
    if !matches!(module.get_export("memory"), Some(ExternType::Memory(_))) {
        return Err(TemplateError::MissingExport {
            what: "a memory named `memory`".into(),
        });
    }
    func("cachet_abi_version", &[], &[i32_])?;
    func("cachet_alloc", &[i32_], &[i32_])?;
    func("cachet_render", &[i32_, i32_], &[i64_])?;
    Ok(())
}
