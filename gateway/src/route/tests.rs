use super::*;

fn w(load: usize, overlap: usize) -> WorkerView {
    WorkerView {
        healthy: true,
        inflight: load,
        overlap_blocks: overlap,
        kv_total: 100,
        ..Default::default()
    }
}

fn req(blocks: usize) -> RouteRequest<'static> {
    RouteRequest {
        prompt_blocks: blocks,
        session_key: None,
    }
}

#[test]
fn round_robin_takes_turns_among_the_healthy() {
    let p = round_robin::RoundRobin::default();
    let mut ws = vec![w(0, 0), w(0, 0), w(0, 0)];
    ws[1].healthy = false;
    let firsts: Vec<usize> = (0..4).map(|_| p.route(&req(1), &ws).order[0]).collect();
    assert_eq!(firsts, [0, 2, 0, 2]);
    assert_eq!(p.route(&req(1), &ws).order.len(), 2);
}

#[test]
fn least_load_orders_by_load() {
    let ws = vec![w(5, 0), w(1, 0), w(3, 0)];
    assert_eq!(least_load::LeastLoad.route(&req(1), &ws).order, [1, 2, 0]);
}

#[test]
fn prefix_prefers_the_longest_cached_prefix() {
    let p = prefix::Prefix::default();
    let ws = vec![w(1, 0), w(1, 20), w(1, 5)];
    let d = p.route(&req(24), &ws);
    assert_eq!(d.order, [1, 2, 0]);
    assert_eq!(d.reason, "prefix_hit");
}

#[test]
fn prefix_weighs_overlap_against_load() {
    let p = prefix::Prefix::default();
    // Worker 1 holds 2 of 24 blocks but carries 3 more requests: not worth it.
    let ws = vec![w(0, 0), w(3, 2)];
    assert_eq!(p.route(&req(24), &ws).order[0], 0);
    // Holding 22 of 24 with one more request is.
    let ws = vec![w(0, 0), w(1, 22)];
    assert_eq!(p.route(&req(24), &ws).order[0], 1);
}

#[test]
fn the_imbalance_gate_keeps_a_popular_prefix_from_piling_up() {
    let p = prefix::Prefix::default();
    // Worker 0 holds everything but carries 12 requests; the others 2: 12 > max(3, 6).
    let ws = vec![w(12, 30), w(2, 0), w(2, 0)];
    let d = p.route(&req(30), &ws);
    assert_ne!(d.order[0], 0);
    assert_eq!(d.reason, "overloaded_holder");
    assert_eq!(
        *d.order.last().unwrap(),
        0,
        "the gated worker stays for failover"
    );
}

#[test]
fn unhealthy_workers_are_never_chosen() {
    let p = prefix::Prefix::default();
    let mut ws = vec![w(0, 30), w(5, 0)];
    ws[0].healthy = false;
    assert_eq!(p.route(&req(30), &ws).order, [1]);
    ws[1].healthy = false;
    assert_eq!(p.route(&req(30), &ws).order, Vec::<usize>::new());
}

#[test]
fn sessions_stick_and_move_only_when_their_worker_goes() {
    let p = session::Session;
    let ws: Vec<WorkerView> = (0..4)
        .map(|i| WorkerView {
            id: 1000 + i,
            ..w(0, 0)
        })
        .collect();
    let key = |k: &'static str| RouteRequest {
        prompt_blocks: 1,
        session_key: Some(k),
    };
    let keys: Vec<String> = (0..200).map(|i| format!("user-{i}")).collect();
    let before: Vec<usize> = keys
        .iter()
        .map(|k| {
            p.route(
                &RouteRequest {
                    prompt_blocks: 1,
                    session_key: Some(k),
                },
                &ws,
            )
            .order[0]
        })
        .collect();
    // Every worker gets some sessions.
    for i in 0..4 {
        assert!(before.iter().filter(|&&x| x == i).count() > 20);
    }
    // Stable.
    assert_eq!(p.route(&key("user-7"), &ws).order[0], before[7]);
    // Take worker 2 away: only its sessions move.
    let mut less = ws.clone();
    less[2].healthy = false;
    for (k, &b) in keys.iter().zip(&before) {
        let now = p
            .route(
                &RouteRequest {
                    prompt_blocks: 1,
                    session_key: Some(k),
                },
                &less,
            )
            .order[0];
        if b != 2 {
            assert_eq!(now, b, "{k} moved");
        } else {
            assert_ne!(now, 2);
        }
    }
}

#[test]
fn a_session_keeps_its_worker_when_another_leaves_or_joins_the_pool() {
    // Members found by DNS come and go: positions shift, identities do not.
    let p = session::Session;
    let member = |id: u64| WorkerView { id, ..w(0, 0) };
    let all: Vec<WorkerView> = [11, 22, 33, 44].map(member).to_vec();
    let route = |ws: &[WorkerView], k: &str| {
        ws[p.route(
            &RouteRequest {
                prompt_blocks: 1,
                session_key: Some(k),
            },
            ws,
        )
        .order[0]]
            .id
    };
    let keys: Vec<String> = (0..200).map(|i| format!("user-{i}")).collect();
    let before: Vec<u64> = keys.iter().map(|k| route(&all, k)).collect();
    // Member 22 leaves (everyone after it moves up a position).
    let left: Vec<WorkerView> = [11, 33, 44].map(member).to_vec();
    // A new member joins at the end.
    let joined: Vec<WorkerView> = [11, 22, 33, 44, 55].map(member).to_vec();
    let mut to_new = 0;
    for (k, &b) in keys.iter().zip(&before) {
        if b != 22 {
            assert_eq!(route(&left, k), b, "{k} moved when another member left");
        }
        let now = route(&joined, k);
        if now == 55 {
            to_new += 1;
        } else {
            assert_eq!(now, b, "{k} moved to an old member when a new one joined");
        }
    }
    // About a fifth of the sessions move to the new member, and only those.
    assert!(
        (20..=70).contains(&to_new),
        "{to_new} of 200 moved to the new member"
    );
}

#[test]
fn policies_by_name() {
    for n in ["round_robin", "least_load", "prefix", "session"] {
        assert_eq!(by_name(n).unwrap().name(), n);
    }
    assert!(by_name("random")
        .err()
        .unwrap()
        .to_string()
        .contains("round_robin"));
}
