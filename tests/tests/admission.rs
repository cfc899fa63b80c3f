//! Engine admission on every device: the waiting queue bounded in requests and prompt tokens,
//! refusals that leave running requests alone, and cancelled requests leaving the queue at once.

use cachet_backend::engine::EngineConfig;
use cachet_backend::request::FinishReason;
use cachet_backend::scheduler::SchedulerConfig;
use cachet_backend::EngineError;
use cachet_tests::*;

device_test! {
    fn a_full_queue_refuses_without_harming_running_requests(dev) {
        let m = tiny("tiny-gqa-llama3");
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_seqs: 1,
                ..Default::default()
            },
            max_waiting: 2,
            ..Default::default()
        };
        let e = engine(dev, &m, 64, cfg);
        let h = e.handle();
        let mut running = h.submit(greedy_request((1..50).collect(), 400)).unwrap();
        running.next_blocking().unwrap(); // it is running now
        let w1 = h.submit(greedy_request((3..20).collect(), 5)).unwrap();
        let w2 = h.submit(greedy_request((4..20).collect(), 5)).unwrap();
        match h.submit(greedy_request((5..20).collect(), 5)) {
            Err(EngineError::Overloaded {
                waiting: 2,
                limit: 2,
            }) => {}
            other => panic!("expected Overloaded, got {:?}", other.map(|s| s.id)),
        }
        let rest = collect(running);
        assert_eq!(rest.tokens.len(), 399);
        assert_eq!(rest.reason, FinishReason::Length);
        assert_eq!(collect(w1).tokens.len(), 5);
        assert_eq!(collect(w2).tokens.len(), 5);
        // Once drained, requests are accepted again.
        assert!(h.submit(greedy_request((5..20).collect(), 2)).is_ok());
    }
}

device_test! {
    fn the_waiting_queue_is_bounded_in_prompt_tokens_too(dev) {
        let m = tiny("tiny-gqa-llama3");
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_seqs: 1,
                ..Default::default()
            },
            max_waiting: 100,
            max_waiting_tokens: 40,
            ..Default::default()
        };
        let e = engine(dev, &m, 64, cfg);
        let h = e.handle();
        let mut running = h.submit(greedy_request((1..50).collect(), 400)).unwrap();
        running.next_blocking().unwrap();
        // 30 tokens wait; 30 more would make 60 > 40; 10 more fit exactly.
        let w1 = h.submit(greedy_request((3..33).collect(), 3)).unwrap();
        match h.submit(greedy_request((3..33).collect(), 3)) {
            Err(EngineError::OverloadedTokens {
                queued: 30,
                prompt: 30,
                limit: 40,
            }) => {}
            other => panic!("expected OverloadedTokens, got {:?}", other.map(|s| s.id)),
        }
        let w2 = h.submit(greedy_request((3..13).collect(), 3)).unwrap();
        drop(running);
        assert_eq!(collect(w1).tokens.len(), 3);
        assert_eq!(collect(w2).tokens.len(), 3);
        // With nothing waiting, a prompt larger than the bound alone is still taken.
        let big = h.submit(greedy_request((1..60).collect(), 2)).unwrap();
        assert_eq!(collect(big).tokens.len(), 2);
    }
}

device_test! {
    /// A client that cancels right after sending gives its place in the queue back at once —
    /// not when the engine thread next reads its commands — so requests cancelled as fast as
    /// they are sent cannot hold the queue full against everyone else (issue 58).
    fn cancelled_requests_leave_the_queue_at_once(dev) {
        let m = tiny("tiny-gqa-llama3");
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_seqs: 1,
                ..Default::default()
            },
            max_waiting: 4,
            ..Default::default()
        };
        let e = engine(dev, &m, 64, cfg);
        let h = e.handle();
        let mut running = h.submit(greedy_request((1..50).collect(), 400)).unwrap();
        running.next_blocking().unwrap();
        for round in 0..50 {
            let waiting: Vec<_> = (0..4)
                .map(|i| h.submit(greedy_request((3 + i..20).collect(), 5)).unwrap())
                .collect();
            assert!(
                matches!(h.submit(greedy_request((3..20).collect(), 5)), Err(EngineError::Overloaded { .. })),
                "round {round}: a fifth request fits a queue of four"
            );
            // Cancelled: the next four are taken at once, whatever the engine is doing.
            drop(waiting);
        }
        let w = h.submit(greedy_request((3..20).collect(), 5)).unwrap();
        drop(running);
        assert_eq!(collect(w).tokens.len(), 5);
        assert_eq!(h.stats().waiting, 0);
    }
}
