//! Deterministic synthetic workloads for benchmarks, shaped like the seed article's: most of each
//! prompt is a shared system prompt + few-shot prefix (optionally carrying a timestamp and a user id
//! at the top, as real apps do), the rest is user input; Poisson arrivals.

use std::time::Duration;

use cachet_backend::rng::Rng;

const WORDS: &[&str] = &[
    "order",
    "shipping",
    "refund",
    "account",
    "password",
    "invoice",
    "delivery",
    "package",
    "address",
    "payment",
    "card",
    "subscription",
    "plan",
    "upgrade",
    "cancel",
    "support",
    "ticket",
    "status",
    "tracking",
    "number",
    "product",
    "warranty",
    "return",
    "exchange",
    "size",
    "color",
    "store",
    "online",
    "mobile",
    "app",
    "login",
    "email",
    "phone",
    "message",
    "help",
    "problem",
    "question",
    "today",
    "yesterday",
    "week",
    "month",
    "price",
    "discount",
    "coupon",
    "code",
    "balance",
    "credit",
    "the",
    "my",
    "a",
    "is",
    "was",
    "not",
    "why",
    "how",
    "when",
    "can",
    "you",
    "please",
    "and",
    "it",
];

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkItem {
    /// Arrival time from the start of the run.
    pub at: Duration,
    pub system: String,
    pub user: String,
    pub max_tokens: usize,
    pub user_id: String,
}

#[derive(Debug, Clone)]
pub struct SeedWorkloadConfig {
    pub num_requests: usize,
    /// Mean arrivals per second (Poisson).
    pub rate: f64,
    pub seed: u64,
    /// Words of user input for short and long requests.
    pub short_user_words: (usize, usize),
    pub long_user_words: (usize, usize),
    /// Share of long requests.
    pub long_fraction: f64,
    pub max_tokens: usize,
    /// Put a per-request timestamp and user id at the top of the system prompt.
    pub volatile_header: bool,
}

impl Default for SeedWorkloadConfig {
    fn default() -> Self {
        SeedWorkloadConfig {
            num_requests: 24,
            rate: 1.0,
            seed: 7,
            short_user_words: (40, 60),
            long_user_words: (80, 110),
            long_fraction: 0.3,
            max_tokens: 8,
            volatile_header: false,
        }
    }
}

/// The shared part: a support-bot system prompt and few-shot examples (~240 SmolLM2 tokens).
pub fn shared_prefix() -> String {
    let mut s = String::from(
        "You are Ava, the customer support assistant of Northwind Outfitters, an online store for outdoor \
         clothing and equipment. Follow these rules: be polite and concise; never invent order details; ask for \
         the order number when it is missing; refunds are possible within 30 days of delivery for unused items; \
         exchanges are free for different sizes and colors; shipping takes 3 to 5 business days within the \
         country and 7 to 14 days abroad; express shipping costs 15 dollars; gift cards cannot be refunded; \
         escalate legal, safety and payment fraud questions to a human agent and say so.\n\nExamples:\n",
    );
    s.push_str("Customer: Where is my package? Order 4471.\nAva: Order 4471 left our warehouse and should arrive within 3 to 5 business days.\n");
    s.push_str("Customer: Can I return a jacket I wore once?\nAva: Returns are for unused items within 30 days; a worn jacket cannot be returned, but I can help with a warranty claim.\n");
    s.push_str("Customer: My card was charged twice.\nAva: I am sorry about that. I am escalating this to a human agent who handles payment issues.\n");
    s
}

fn words(rng: &mut Rng, n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
    }
    out.push('?');
    out
}

/// Generates the workload: same config and seed, same requests.
pub fn seed_workload(cfg: &SeedWorkloadConfig) -> Vec<WorkItem> {
    let mut rng = Rng::new(cfg.seed);
    let prefix = shared_prefix();
    let mut t = 0.0f64;
    (0..cfg.num_requests)
        .map(|i| {
            t += -(1.0 - rng.uniform()).ln() / cfg.rate;
            let long = rng.uniform() < cfg.long_fraction;
            let (lo, hi) = if long {
                cfg.long_user_words
            } else {
                cfg.short_user_words
            };
            let n = lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize;
            let user_id = format!("user-{:06}", rng.next_u64() % 1_000_000);
            let system = if cfg.volatile_header {
                let secs = 1_764_000_000 + (t as u64) + i as u64 * 17;
                format!(
                    "Current time: {}. User id: {user_id}.\n{prefix}",
                    rfc3339(secs)
                )
            } else {
                prefix.clone()
            };
            WorkItem {
                at: Duration::from_secs_f64(t),
                system,
                user: words(&mut rng, n),
                max_tokens: cfg.max_tokens,
                user_id,
            }
        })
        .collect()
}

/// The multi-worker routing workload: tenants, prefix groups with Zipf popularity, system
/// prompts that carry the request time and the user id at the top, multi-turn sessions.
#[derive(Debug, Clone)]
pub struct RoutingWorkloadConfig {
    pub num_requests: usize,
    /// Mean arrivals per second (Poisson, open loop).
    pub rate: f64,
    pub seed: u64,
    pub tenants: usize,
    /// Distinct system prompts (prefix groups), spread over the tenants.
    pub groups: usize,
    /// Zipf exponent of group popularity.
    pub zipf: f64,
    /// Chance that a request continues an open session of its group (else a new session).
    pub continue_session: f64,
    /// Turns after which a session ends.
    pub max_turns: usize,
    /// Put the time and user id at the top of the system prompt (what normalization fixes).
    pub volatile_header: bool,
    pub max_tokens: usize,
}

impl Default for RoutingWorkloadConfig {
    fn default() -> Self {
        RoutingWorkloadConfig {
            num_requests: 120,
            rate: 1.5,
            seed: 11,
            tenants: 2,
            groups: 8,
            zipf: 1.0,
            continue_session: 0.5,
            max_turns: 4,
            volatile_header: true,
            max_tokens: 4,
        }
    }
}

/// One request of the routing workload: a chat.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatItem {
    pub at: Duration,
    /// Index of the tenant (its API key is the runner's business).
    pub tenant: usize,
    pub group: usize,
    pub user_id: String,
    /// (role, content) messages: system, earlier turns, the new user message.
    pub messages: Vec<(String, String)>,
    pub max_tokens: usize,
}

const COMPANIES: &[&str] = &[
    "Northwind Outfitters",
    "Contoso Bank",
    "Fabrikam Motors",
    "Tailspin Travel",
    "Litware Games",
    "Adventure Works",
    "Wingtip Toys",
    "Proseware Health",
    "Lucerne Publishing",
    "Margie Travel",
    "Trey Research",
    "Coho Winery",
    "Alpine Ski House",
    "Blue Yonder Air",
    "Woodgrove Bank",
    "Humongous Insurance",
];

/// A group's system prompt (~200 SmolLM2 tokens), distinct from the first sentence on.
pub fn group_prompt(group: usize) -> String {
    let company = COMPANIES[group % COMPANIES.len()];
    let mut s = format!(
        "You are the assistant of {company} (desk {group}). Help customers of {company} with their questions, politely and briefly. "
    );
    s.push_str(&shared_prefix());
    s
}

/// Generates the routing workload: same config and seed, same requests.
pub fn routing_workload(cfg: &RoutingWorkloadConfig) -> Vec<ChatItem> {
    let mut rng = Rng::new(cfg.seed);
    // Zipf weights over groups.
    let weights: Vec<f64> = (1..=cfg.groups)
        .map(|k| 1.0 / (k as f64).powf(cfg.zipf))
        .collect();
    let total: f64 = weights.iter().sum();
    // Open sessions per group: (user id, history of (role, content)).
    type Session = (String, Vec<(String, String)>);
    let mut sessions: Vec<Vec<Session>> = vec![Vec::new(); cfg.groups];
    let mut t = 0.0f64;
    let mut next_user = 0;
    (0..cfg.num_requests)
        .map(|i| {
            t += -(1.0 - rng.uniform()).ln() / cfg.rate;
            let mut u = rng.uniform() * total;
            let mut group = 0;
            while group + 1 < cfg.groups && u >= weights[group] {
                u -= weights[group];
                group += 1;
            }
            let open = &mut sessions[group];
            let (user_id, history) = if !open.is_empty() && rng.uniform() < cfg.continue_session {
                let k = (rng.next_u64() % open.len() as u64) as usize;
                open.swap_remove(k)
            } else {
                next_user += 1;
                (
                    format!("user-{:05}", next_user * 7919 % 100_000),
                    Vec::new(),
                )
            };
            let n = 8 + (rng.next_u64() % 12) as usize;
            let question = words(&mut rng, n);
            let mut system = group_prompt(group);
            if cfg.volatile_header {
                let secs = 1_764_417_600 + t as u64 + i as u64;
                system = format!(
                    "Current time: {}. User id: {user_id}.\n{system}",
                    rfc3339(secs)
                );
            }
            let mut messages = vec![("system".to_string(), system)];
            messages.extend(history.iter().cloned());
            messages.push(("user".to_string(), question.clone()));
            let mut history = history;
            history.push(("user".to_string(), question));
            history.push((
                "assistant".to_string(),
                "Thank you for your message. I have looked into it and will help you right away."
                    .to_string(),
            ));
            if history.len() / 2 < cfg.max_turns {
                sessions[group].push((user_id.clone(), history));
            }
            ChatItem {
                at: Duration::from_secs_f64(t),
                tenant: group % cfg.tenants.max(1),
                group,
                user_id,
                messages,
                max_tokens: cfg.max_tokens,
            }
        })
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time.
pub fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// Percentile (nearest rank) of `xs`; 0 for an empty slice.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// The speculative-decoding benchmark's copy-heavy requests: answers that quote their input
/// (code editing, JSON reformatting, summaries that quote, table conversion).
pub const COPY_HEAVY: &[&str] = &[
    "Rename the variable `total` to `sum_of_items` in this Python function and return the whole function:\n```python\ndef compute_total(items):\n    total = 0\n    for item in items:\n        if item.price > 0:\n            total += item.price * item.quantity\n    return total\n```",
    "Reformat this JSON with two-space indentation, keeping every key and value:\n{\"id\": 4812, \"name\": \"Northwind Router X2\", \"price\": 149.99, \"tags\": [\"network\", \"wifi6\", \"mesh\"], \"stock\": {\"warehouse\": 120, \"store\": 8}}",
    "Summarize this support ticket, quoting the customer's exact words for the problem:\nCustomer: \"My router keeps dropping the connection every evening around 8 pm, and the status light turns orange.\"\nAgent: \"Have you tried updating the firmware?\"\nCustomer: \"Yes, I updated it yesterday and the problem is still there.\"",
    "Add type hints to this function and return it:\n```python\ndef merge(a, b):\n    result = dict(a)\n    for key, value in b.items():\n        result[key] = value\n    return result\n```",
    "Convert this CSV to a Markdown table:\nname,role,city\nAlice,engineer,Paris\nBob,designer,Berlin\nCarol,manager,Madrid\nDan,analyst,Lisbon",
    "Fix the spelling in this paragraph and repeat it in full: The quick brown fox jumsp over the lazy dog while the farmer watchs from the barn, and the children laugh at the dog becuase it does not move at all.",
];

/// The speculative-decoding benchmark's free-chat requests: nothing to copy.
pub const FREE_CHAT: &[&str] = &[
    "What are three good habits for staying productive when working from home?",
    "Explain in simple words why the sky is blue.",
    "Give me a short idea for a birthday gift for a friend who likes hiking.",
    "What is the difference between a virus and a bacterium?",
    "Suggest a name for a small coffee shop and explain why.",
    "How do I make a simple tomato pasta sauce?",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_764_417_600), "2025-11-29T12:00:00Z");
    }

    #[test]
    fn the_routing_workload_is_deterministic_zipf_and_has_sessions() {
        let c = RoutingWorkloadConfig::default();
        let w = routing_workload(&c);
        assert_eq!(w, routing_workload(&c));
        let count = |g: usize| w.iter().filter(|x| x.group == g).count();
        assert!(
            count(0) > count(c.groups - 1),
            "group 0 is the most popular"
        );
        assert!(
            w.iter().any(|x| x.messages.len() > 2),
            "some requests continue a session"
        );
        assert!(w[0].messages[0].1.starts_with("Current time: "));
        assert!(w.windows(2).all(|p| p[0].at <= p[1].at));
    }

    #[test]
    fn same_seed_same_workload() {
        let c = SeedWorkloadConfig::default();
        assert_eq!(seed_workload(&c), seed_workload(&c));
        assert_eq!(percentile(&[3.0, 1.0, 2.0, 4.0], 50.0), 2.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0, 4.0], 95.0), 4.0);
    }
}
