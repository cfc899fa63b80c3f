//! `/metrics` in the Prometheus text format: request latency histograms with vLLM's bucket
//! boundaries, per-tenant request/token/error counters, and the engine's state read at scrape
//! time (running / waiting, KV blocks, prefix-cache queried / hit tokens, preemptions).

use std::sync::atomic::AtomicU64;

use cachet_backend::engine::EngineStats;
use cachet_backend::request::RequestTimings;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrefixLabel {
    pub prefix: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TemplateOutcome {
    pub tenant: String,
    /// `ok`, or the error code (`template_timeout`, `template_trap`, …).
    pub outcome: String,
}

const PREFIX_BUCKETS: &[f64] = &[
    0.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
const TEMPLATE_BUCKETS: &[f64] = &[
    0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub policy: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    pub worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AcceptedLabel {
    pub accepted_drafts: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantStatus {
    pub tenant: String,
    pub status: String,
}

pub struct Metrics {
    registry: Registry,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue: Histogram,
    pub requests: Family<TenantStatus, Counter>,
    pub prompt_tokens: Family<TenantLabel, Counter>,
    pub generation_tokens: Family<TenantLabel, Counter>,
    pub template_calls: Family<TemplateOutcome, Counter>,
    pub template_seconds: Histogram,
    pub stable_prefix_tokens: Histogram,
    pub relocated_spans: Family<TenantLabel, Counter>,
    public_prefix_blocks: Family<PrefixLabel, Counter>,
    pub routing_decisions: Family<RouteLabel, Counter>,
    pub routed_requests: Family<WorkerLabel, Counter>,
    pub worker_inflight: Family<WorkerLabel, Gauge>,
    pub worker_cached_blocks: Family<WorkerLabel, Gauge>,
    pub predicted_cached_tokens: Counter,
    pub cached_tokens: Counter,
    shared_limit_errors: Counter,
    shared_limit_fallbacks: Counter,
    shared_limits_up: Gauge,
    operator_revision: Gauge,
    operator_store_up: Gauge,
    running: Gauge,
    waiting: Gauge,
    kv_usage: Gauge<f64, AtomicU64>,
    spec_cost_ratio: Gauge<f64, AtomicU64>,
    kv_blocks_cached: Gauge,
    kv_blocks_cached_by_tenant: Family<TenantLabel, Gauge>,
    kv_blocks_free: Gauge,
    prefix_queried: Gauge,
    prefix_hits: Gauge,
    preemptions: Gauge,
    spec_drafts: Gauge,
    spec_accepted: Gauge,
    spec_active: Gauge,
    spec_verifications: Family<AcceptedLabel, Gauge>,
    engine_steps: Gauge,
    engine_step_seconds: Gauge<f64, AtomicU64>,
    engine_step_gap_seconds: Gauge<f64, AtomicU64>,
}

impl Metrics {
    /// The gateway's metrics; `engine`: with the embedded engine's gauges (running / waiting,
    /// KV blocks, prefix-cache tokens, preemptions, speculation), which a gateway that only
    /// routes to remote upstreams has none of.
    pub fn new(engine: bool) -> Self {
        let mut registry = Registry::with_prefix("cachet");
        let h = |b: &[f64]| Histogram::new(b.iter().copied());
        let m = Metrics {
            ttft: h(TTFT_BUCKETS),
            itl: h(ITL_BUCKETS),
            e2e: h(E2E_BUCKETS),
            queue: h(E2E_BUCKETS),
            requests: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            template_calls: Family::default(),
            template_seconds: h(TEMPLATE_BUCKETS),
            stable_prefix_tokens: h(PREFIX_BUCKETS),
            relocated_spans: Family::default(),
            public_prefix_blocks: Family::default(),
            routing_decisions: Family::default(),
            routed_requests: Family::default(),
            worker_inflight: Family::default(),
            worker_cached_blocks: Family::default(),
            predicted_cached_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            shared_limit_errors: Counter::default(),
            shared_limit_fallbacks: Counter::default(),
            shared_limits_up: Gauge::default(),
            operator_revision: Gauge::default(),
            operator_store_up: Gauge::default(),
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_usage: Gauge::default(),
            spec_cost_ratio: Gauge::default(),
            kv_blocks_cached: Gauge::default(),
            kv_blocks_cached_by_tenant: Family::default(),
            kv_blocks_free: Gauge::default(),
            prefix_queried: Gauge::default(),
            prefix_hits: Gauge::default(),
            preemptions: Gauge::default(),
            spec_drafts: Gauge::default(),
            spec_accepted: Gauge::default(),
            spec_active: Gauge::default(),
            spec_verifications: Family::default(),
            engine_steps: Gauge::default(),
            engine_step_seconds: Gauge::default(),
            engine_step_gap_seconds: Gauge::default(),
            registry: Registry::default(),
        };
        m.register_requests(&mut registry);
        m.register_prompts_and_routing(&mut registry);
        if engine {
            m.register_engine(&mut registry);
        }
        Metrics { registry, ..m }
    }

    /// Latency histograms and per-tenant request, token and template counts.
    fn register_requests(&self, r: &mut Registry) {
        r.register(
            "time_to_first_token_seconds",
            "Time to first token",
            self.ttft.clone(),
        );
        r.register(
            "inter_token_latency_seconds",
            "Mean time between output tokens, per request",
            self.itl.clone(),
        );
        r.register(
            "e2e_request_latency_seconds",
            "Arrival to finish",
            self.e2e.clone(),
        );
        r.register(
            "request_queue_time_seconds",
            "Arrival to first scheduled",
            self.queue.clone(),
        );
        r.register(
            "requests",
            "Requests by tenant and HTTP status",
            self.requests.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens by tenant",
            self.prompt_tokens.clone(),
        );
        r.register(
            "generation_tokens",
            "Generated tokens by tenant",
            self.generation_tokens.clone(),
        );
        r.register(
            "template_calls",
            "Tenant template calls by outcome (ok or the error code)",
            self.template_calls.clone(),
        );
        r.register(
            "template_call_seconds",
            "Time of a template call, fresh instance included",
            self.template_seconds.clone(),
        );
    }

    /// What normalization and routing did; the workers as the router sees them; the shared
    /// limits' Redis and the operator store.
    fn register_prompts_and_routing(&self, r: &mut Registry) {
        r.register(
            "stable_prefix_tokens",
            "Tokens of a chat prompt's request-independent prefix, after normalization",
            self.stable_prefix_tokens.clone(),
        );
        r.register(
            "normalizer_relocated_spans",
            "Volatile spans moved out of static prompt segments, by tenant",
            self.relocated_spans.clone(),
        );
        r.register(
            "public_prefix_blocks",
            "Prompt blocks inside a declared public prefix (shared by every tenant), by prefix",
            self.public_prefix_blocks.clone(),
        );
        r.register(
            "routing_decisions",
            "Routing decisions by policy and reason (prefix_hit, no_overlap, failover, ...)",
            self.routing_decisions.clone(),
        );
        r.register(
            "routed_requests",
            "Requests sent to each worker",
            self.routed_requests.clone(),
        );
        r.register(
            "worker_inflight_requests",
            "Requests the gateway has in flight on each worker",
            self.worker_inflight.clone(),
        );
        r.register(
            "worker_cached_blocks",
            "KV blocks each worker holds, as the gateway knows from its KV events",
            self.worker_cached_blocks.clone(),
        );
        r.register(
            "routing_predicted_cached_tokens",
            "Prompt tokens the router expected the chosen worker to hold",
            self.predicted_cached_tokens.clone(),
        );
        r.register(
            "prompt_cached_tokens",
            "Prompt tokens served from a prefix cache (as the engine or worker reported)",
            self.cached_tokens.clone(),
        );
        r.register(
            "shared_limit_errors",
            "Calls to the Redis holding tenants' shared limits that failed or timed out",
            self.shared_limit_errors.clone(),
        );
        r.register(
            "shared_limit_fallbacks",
            "Admissions decided without Redis (this replica's share of the limits, or refused), per shared_limits.on_error",
            self.shared_limit_fallbacks.clone(),
        );
        r.register(
            "shared_limits_up",
            "1 while the Redis holding tenants' shared limits answers (0 while it does not; absent limits: 0)",
            self.shared_limits_up.clone(),
        );
        r.register(
            "operator_revision",
            "The operator store's revision this replica's tenants come from (0 without [operator])",
            self.operator_revision.clone(),
        );
        r.register(
            "operator_store_up",
            "1 while the operator store answers this replica's follower (0 while it does not, or without [operator])",
            self.operator_store_up.clone(),
        );
    }

    /// The embedded engine's gauges: its queues, KV blocks, prefix cache, steps, speculation.
    fn register_engine(&self, r: &mut Registry) {
        r.register(
            "num_requests_running",
            "Requests in the engine's running set",
            self.running.clone(),
        );
        r.register(
            "num_requests_waiting",
            "Requests waiting for the engine",
            self.waiting.clone(),
        );
        r.register(
            "kv_cache_usage_ratio",
            "Share of KV blocks held by requests",
            self.kv_usage.clone(),
        );
        r.register(
            "kv_blocks_cached_idle",
            "Free KV blocks that hold a cached prefix",
            self.kv_blocks_cached.clone(),
        );
        r.register(
            "kv_blocks_cached_idle_by_tenant",
            "Free KV blocks that hold a cached prefix, by the tenant whose request computed them",
            self.kv_blocks_cached_by_tenant.clone(),
        );
        r.register(
            "kv_blocks_free",
            "Empty KV blocks",
            self.kv_blocks_free.clone(),
        );
        r.register(
            "prefix_cache_queried_tokens",
            "Prompt tokens looked up in the prefix cache",
            self.prefix_queried.clone(),
        );
        r.register(
            "prefix_cache_hit_tokens",
            "Prompt tokens found in the prefix cache",
            self.prefix_hits.clone(),
        );
        r.register(
            "preemptions",
            "Requests preempted by recompute",
            self.preemptions.clone(),
        );
        r.register(
            "engine_steps",
            "Forward steps the engine has run",
            self.engine_steps.clone(),
        );
        r.register(
            "engine_step_seconds",
            "Seconds in forward steps, from queuing a step on the device to its results on the host, in total",
            self.engine_step_seconds.clone(),
        );
        r.register(
            "engine_step_gap_seconds",
            "Seconds between a step's results and the next step's queuing while requests were in the engine (sampling, streaming, scheduling): the device waiting on the host, in total",
            self.engine_step_gap_seconds.clone(),
        );
        r.register(
            "spec_draft_tokens",
            "Draft tokens proposed by n-gram speculative decoding",
            self.spec_drafts.clone(),
        );
        r.register(
            "spec_accepted_tokens",
            "Draft tokens the model accepted",
            self.spec_accepted.clone(),
        );
        r.register(
            "spec_active",
            "1 when the last engine step could speculate, 0 when speculation is off or stood down under load",
            self.spec_active.clone(),
        );
        r.register(
            "spec_cost_ratio",
            "Measured time of a speculative verification step over a plain decode step (what drafts must pay for)",
            self.spec_cost_ratio.clone(),
        );
        r.register(
            "spec_verifications",
            "Speculative verifications by the number of drafts accepted (the acceptance-length histogram)",
            self.spec_verifications.clone(),
        );
    }

    /// Records a finished request.
    pub fn observe(&self, tenant: &str, t: &RequestTimings, prompt: usize, generated: usize) {
        self.ttft.observe(t.ttft.as_secs_f64());
        self.e2e.observe(t.e2e.as_secs_f64());
        self.queue.observe(t.queue.as_secs_f64());
        if generated > 1 {
            self.itl.observe(t.mean_itl.as_secs_f64());
        }
        let l = TenantLabel {
            tenant: tenant.to_string(),
        };
        self.prompt_tokens.get_or_create(&l).inc_by(prompt as u64);
        self.generation_tokens
            .get_or_create(&l)
            .inc_by(generated as u64);
    }

    /// Sets the per-upstream load gauges (at scrape time).
    pub fn worker_load(&self, load: &[crate::upstream::MemberLoad]) {
        // Only the members there are now (workers found by DNS leave).
        self.worker_inflight.clear();
        self.worker_cached_blocks.clear();
        for m in load {
            let l = WorkerLabel {
                worker: m.name.clone(),
            };
            self.worker_inflight
                .get_or_create(&l)
                .set(m.inflight as i64);
            self.worker_cached_blocks
                .get_or_create(&l)
                .set(m.cached_blocks as i64);
        }
    }

    /// Records a routing decision.
    pub fn routed(&self, policy: &str, reason: &str, worker: &str, predicted_cached: usize) {
        self.routing_decisions
            .get_or_create(&RouteLabel {
                policy: policy.to_string(),
                reason: reason.to_string(),
            })
            .inc();
        self.routed_requests
            .get_or_create(&WorkerLabel {
                worker: worker.to_string(),
            })
            .inc();
        self.predicted_cached_tokens.inc_by(predicted_cached as u64);
    }

    /// Records a normalized chat prompt.
    pub fn normalized(&self, tenant: &str, relocated: usize, stable_tokens: usize) {
        self.stable_prefix_tokens.observe(stable_tokens as f64);
        if relocated > 0 {
            self.relocated_spans
                .get_or_create(&TenantLabel {
                    tenant: tenant.to_string(),
                })
                .inc_by(relocated as u64);
        }
    }

    /// Records a prompt whose first `blocks` blocks are public prefix `prefix`'s.
    pub fn public_prefix(&self, prefix: &str, blocks: usize) {
        self.public_prefix_blocks
            .get_or_create(&PrefixLabel {
                prefix: prefix.to_string(),
            })
            .inc_by(blocks as u64);
    }

    /// Records a template call.
    pub fn template_call(&self, tenant: &str, outcome: &str, seconds: Option<f64>) {
        self.template_calls
            .get_or_create(&TemplateOutcome {
                tenant: tenant.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
        if let Some(s) = seconds {
            self.template_seconds.observe(s);
        }
    }

    pub fn count(&self, tenant: &str, status: u16) {
        self.requests
            .get_or_create(&TenantStatus {
                tenant: tenant.to_string(),
                status: status.to_string(),
            })
            .inc();
    }

    /// The shared-limits store's counts as of now (they live in the store; the counters follow).
    pub fn shared_limits(&self, s: &crate::tenants::shared::SharedLimits) {
        use std::sync::atomic::Ordering::Relaxed;
        let follow = |c: &Counter, now: u64| {
            c.inc_by(now.saturating_sub(c.get()));
        };
        follow(&self.shared_limit_errors, s.errors.load(Relaxed));
        follow(&self.shared_limit_fallbacks, s.fallbacks.load(Relaxed));
        self.shared_limits_up.set(i64::from(!s.is_down()));
    }

    /// The operator store's revision in use and whether it answers.
    pub fn operator(&self, s: &crate::operator::StoreStatus) {
        use std::sync::atomic::Ordering::Relaxed;
        self.operator_revision.set(s.revision.load(Relaxed));
        self.operator_store_up.set(i64::from(!s.down.load(Relaxed)));
    }

    /// The text exposition, with the embedded engine's state as of now, if there is one.
    pub fn render(&self, engine: Option<&EngineStats>) -> String {
        if let Some(s) = engine {
            self.engine_state(s);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        out
    }

    fn engine_state(&self, s: &EngineStats) {
        self.running.set(s.running as i64);
        self.waiting.set(s.waiting as i64);
        self.kv_usage.set(s.kv_usage());
        self.kv_blocks_cached.set(s.kv.cached_idle as i64);
        self.kv_blocks_cached_by_tenant.clear();
        for (t, n) in &s.cached_by_tenant {
            self.kv_blocks_cached_by_tenant
                .get_or_create(&TenantLabel { tenant: t.clone() })
                .set(*n as i64);
        }
        self.kv_blocks_free.set(s.kv.free_plain as i64);
        self.prefix_queried
            .set(s.counters.prefix_queried_tokens as i64);
        self.prefix_hits.set(s.counters.prefix_hit_tokens as i64);
        self.preemptions.set(s.counters.preemptions as i64);
        self.spec_drafts.set(s.counters.spec_draft_tokens as i64);
        self.spec_accepted
            .set(s.counters.spec_accepted_tokens as i64);
        self.spec_active.set(s.counters.spec_active as i64);
        self.spec_cost_ratio.set(s.spec_cost_ratio);
        self.engine_steps.set(s.counters.steps as i64);
        self.engine_step_seconds.set(s.step_seconds);
        self.engine_step_gap_seconds.set(s.step_gap_seconds);
        for (n, &count) in s.counters.spec_acceptance_lengths.iter().enumerate() {
            if count > 0 {
                self.spec_verifications
                    .get_or_create(&AcceptedLabel {
                        accepted_drafts: n.to_string(),
                    })
                    .set(count as i64);
            }
        }
    }
}
