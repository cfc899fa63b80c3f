//! What a response costs: its usage record ([`Ticket`], written when the response ends however
//! it ends) and its charge to the tenant's token budget ([`Meter`], exactly once per choice).

use crate::server::AppState;
use crate::tenants::Permit;
use crate::trace::RequestTrace;
use cachet_backend::request::{RequestTimings, Usage};
use hyper::StatusCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A request's usage record in the making: written to the usage log when dropped — when the
/// response ends, fails, or the client leaves (status 499 unless set).
pub struct Ticket {
    log: Arc<crate::usage::UsageLog>,
    pub record: crate::usage::Record,
    arrived: Instant,
    first_token: Option<Instant>,
}

impl Ticket {
    /// A record of a request that arrived at `arrived` for `tenant` with the key of sha256
    /// `key_hash`, at `endpoint`.
    pub fn new(
        log: Arc<crate::usage::UsageLog>,
        tenant: &str,
        key_hash: &[u8; 32],
        endpoint: &str,
        model: &str,
        arrived: Instant,
    ) -> Ticket {
        let mut key_id = crate::tenants::hex(key_hash);
        key_id.truncate(12);
        Ticket {
            log,
            record: crate::usage::Record {
                at_ms: crate::usage::now_ms() - arrived.elapsed().as_millis() as i64,
                tenant: tenant.to_string(),
                key_id,
                model: model.to_string(),
                endpoint: endpoint.to_string(),
                status: 499,
                ..Default::default()
            },
            arrived,
            first_token: None,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        self.record.e2e_ms = ms(self.arrived.elapsed());
        self.record.ttft_ms = self.first_token.map(|t| ms(t - self.arrived));
        self.log.record(std::mem::take(&mut self.record));
    }
}

/// What a response has generated, charged to the tenant's token budget exactly once per
/// choice: when the choice finishes (the engine's own count), or — when the client leaves first
/// and the request is cancelled — on drop, for the tokens delivered until then. Holds the
/// tenant's concurrency slot and the request's usage record for as long.
pub(super) struct Meter {
    permit: Permit,
    /// Per choice: tokens delivered and not yet charged (none once settled).
    delivered: Vec<u64>,
    ticket: Option<Ticket>,
    /// The request's trace, ended with the response (its status; 499 if the client left).
    trace: Option<Arc<RequestTrace>>,
    status: Option<u16>,
    tokens: (u64, u64),
}

impl Meter {
    pub(super) fn new(
        permit: Permit,
        choices: usize,
        ticket: Option<Ticket>,
        trace: Option<Arc<RequestTrace>>,
    ) -> Self {
        Meter {
            permit,
            delivered: vec![0; choices],
            ticket,
            trace,
            status: None,
            tokens: (0, 0),
        }
    }

    pub(super) fn token(&mut self, choice: usize) {
        self.delivered[choice] += 1;
        if let Some(t) = &mut self.ticket {
            t.first_token.get_or_insert_with(Instant::now);
        }
    }

    /// The response ended with HTTP status `status` (for its usage record).
    pub(super) fn ended(&mut self, status: StatusCode) {
        if let Some(t) = &mut self.ticket {
            t.record.status = status.as_u16();
        }
        self.status = Some(status.as_u16());
    }

    /// Records a finished choice: metrics (its prompt once per prompt: `first` of its group),
    /// and its generated tokens against the tenant's budget.
    pub(super) fn settle(
        &mut self,
        state: &AppState,
        choice: usize,
        first: bool,
        usage: &Usage,
        timings: &RequestTimings,
    ) {
        state.metrics.observe(
            self.permit.tenant().id(),
            timings,
            if first { usage.prompt_tokens } else { 0 },
            usage.completion_tokens,
        );
        if first {
            state
                .metrics
                .cached_tokens
                .inc_by(usage.cached_tokens as u64);
            self.tokens.0 += usage.prompt_tokens as u64;
        }
        self.tokens.1 += usage.completion_tokens as u64;
        if let Some(t) = &self.trace {
            t.engine(timings);
        }
        self.permit
            .tenant()
            .charge_tokens(usage.completion_tokens as u64, Instant::now());
        self.delivered[choice] = 0;
        if let Some(t) = &mut self.ticket {
            if first {
                t.record.prompt_tokens += usage.prompt_tokens as u64;
                t.record.cached_tokens += usage.cached_tokens as u64;
            }
            t.record.completion_tokens += usage.completion_tokens as u64;
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if let Some(t) = &self.trace {
            t.usage(self.tokens.0, self.tokens.1);
            // No status: the client left before the response ended (nginx's 499).
            t.end(self.status.unwrap_or(499));
        }
        let left: u64 = self.delivered.iter().sum();
        if left > 0 {
            self.permit.tenant().charge_tokens(left, Instant::now());
            if let Some(t) = &mut self.ticket {
                t.record.completion_tokens += left;
            }
        }
    }
}
