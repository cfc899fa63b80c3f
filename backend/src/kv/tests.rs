//! Golden tests of the block pool and KV manager: exact block ids, ref counts, LRU order.

use super::block_pool::{BlockPool, KvEvent};
use super::manager::{ComputedBlocks, KvCacheManager};
use crate::block_hash::{BlockHash, HashContext};

fn h(i: u8) -> BlockHash {
    BlockHash([i; 32])
}

fn make_manager(num_blocks: usize, cap: f64) -> KvCacheManager {
    KvCacheManager::new(num_blocks, 4, cap, true)
}

fn hasher() -> HashContext {
    HashContext::new([1; 32], [2; 32], "m", 4)
}

/// Allocates a whole prompt for `req` as the scheduler would on first scheduling.
fn admit(m: &mut KvCacheManager, req: u64, tokens: &[u32]) -> ComputedBlocks {
    let hashes = hasher().hash_all(tokens);
    let hit = m.computed_blocks(&hashes, tokens.len());
    assert!(m.allocate_slots(
        req,
        &hit,
        hit.num_tokens,
        tokens.len() - hit.num_tokens,
        &hashes
    ));
    hit
}

#[test]
fn allocation_takes_lowest_ids_and_frees_tail_first_into_lru() {
    let mut p = BlockPool::new(6, 1.0, true);
    let a = p.allocate(3).unwrap();
    assert_eq!(a, vec![0, 1, 2]);
    for (i, &b) in a.iter().enumerate() {
        p.cache_block(b, h(i as u8));
    }
    assert_eq!(p.usage().used, 3);
    p.free(a.iter().rev().copied());
    // Last block first in the queue: evicted first.
    assert_eq!(p.lru_order(), vec![2, 1, 0]);
    assert_eq!(p.usage().cached_idle, 3);
    // Empty blocks are used before any cached one.
    assert_eq!(p.allocate(3).unwrap(), vec![3, 4, 5]);
    // Then the LRU head is evicted and its hash dropped.
    let ev = p.allocate(1).unwrap();
    assert_eq!(ev, vec![2]);
    assert_eq!(p.lookup(&h(2)), None);
    assert_eq!(p.lookup(&h(1)), Some(1));
    let events = p.take_events();
    assert_eq!(
        events.last(),
        Some(&KvEvent::Removed { hashes: vec![h(2)] })
    );
}

#[test]
fn a_hit_takes_the_block_out_of_the_lru_and_counts_references() {
    let mut p = BlockPool::new(4, 1.0, true);
    let a = p.allocate(2).unwrap();
    p.cache_block(a[0], h(10));
    p.cache_block(a[1], h(11));
    p.free(a.iter().rev().copied());
    assert_eq!(p.lru_order(), vec![1, 0]);
    p.touch(&[0]);
    p.touch(&[0]);
    assert_eq!(p.ref_cnt(0), 2);
    assert_eq!(p.lru_order(), vec![1]);
    p.free([0]);
    assert_eq!(p.ref_cnt(0), 1);
    assert_eq!(p.lru_order(), vec![1]);
    p.free([0]);
    assert_eq!(
        p.lru_order(),
        vec![1, 0],
        "re-freed block goes to the tail (most recent)"
    );
}

#[test]
fn least_recently_used_cached_block_is_evicted_first() {
    let mut m = make_manager(6, 1.0);
    let p1: Vec<u32> = (0..8).collect(); // 2 full blocks
    let p2: Vec<u32> = (100..108).collect();
    admit(&mut m, 1, &p1);
    admit(&mut m, 2, &p2);
    assert_eq!(m.block_table(1), &[0, 1]);
    assert_eq!(m.block_table(2), &[2, 3]);
    m.free(1);
    m.free(2);
    assert_eq!(m.pool().lru_order(), vec![1, 0, 3, 2]);
    // A hit on p1 refreshes it.
    let hit = admit(&mut m, 3, &[p1.clone(), vec![7, 7]].concat());
    assert_eq!(hit.blocks, vec![0, 1]);
    assert_eq!(hit.num_tokens, 8);
    assert_eq!(m.block_table(3), &[0, 1, 4]);
    m.free(3);
    assert_eq!(
        m.pool().lru_order(),
        vec![3, 2, 1, 0],
        "p2 is now least recently used"
    );
    // Needing 3 fresh blocks: the empty ones (4, just freed, on top of the stack; then 5), then
    // p2's last block from the LRU head.
    admit(&mut m, 4, &(200..212).collect::<Vec<u32>>());
    assert_eq!(m.block_table(4), &[4, 5, 3]);
    let hashes2 = hasher().hash_all(&p2);
    assert_eq!(
        m.computed_blocks(&hashes2, 9).blocks,
        vec![2],
        "p2's first block survives, its second is gone"
    );
}

#[test]
fn full_hit_still_computes_the_last_token() {
    let mut m = make_manager(8, 1.0);
    let p: Vec<u32> = (0..8).collect();
    admit(&mut m, 1, &p);
    let hashes = hasher().hash_all(&p);
    let hit = m.computed_blocks(&hashes, p.len());
    assert_eq!(
        hit.num_tokens, 4,
        "8 cached tokens, but the last block is recomputed for its logits"
    );
}

#[test]
fn blocks_are_shared_within_a_step_and_ref_counted() {
    let mut m = make_manager(8, 1.0);
    let p: Vec<u32> = (0..12).collect();
    admit(&mut m, 1, &p);
    // Request 2 arrives in the same step: request 1's full blocks are already registered.
    let hit = admit(&mut m, 2, &p);
    assert_eq!(hit.blocks, vec![0, 1]);
    assert_eq!(m.pool().ref_cnt(0), 2);
    assert_eq!(m.pool().ref_cnt(2), 1);
    assert_eq!(m.block_table(2), &[0, 1, 3]);
}

#[test]
fn the_cache_cap_bounds_idle_cached_blocks() {
    let mut m = make_manager(10, 0.3); // at most 3 idle cached blocks
    for r in 0..3u64 {
        let toks: Vec<u32> = (r as u32 * 100..r as u32 * 100 + 8).collect();
        admit(&mut m, r, &toks);
        m.free(r);
    }
    let u = m.usage();
    assert_eq!(u.cached_idle, 3);
    assert_eq!(u.free_plain, 7);
    // The oldest request's blocks went first.
    let first: Vec<u32> = (0..8).collect();
    assert!(m
        .computed_blocks(&hasher().hash_all(&first), 9)
        .blocks
        .is_empty());
    let last: Vec<u32> = (200..208).collect();
    assert_eq!(
        m.computed_blocks(&hasher().hash_all(&last), 9).num_tokens,
        8
    );
}

#[test]
fn allocation_failure_changes_nothing() {
    let mut m = make_manager(3, 1.0);
    admit(&mut m, 1, &(0..8).collect::<Vec<u32>>());
    let before = m.usage();
    let hashes = hasher().hash_all(&(50..62).collect::<Vec<u32>>());
    assert!(!m.allocate_slots(2, &ComputedBlocks::default(), 0, 12, &hashes));
    assert_eq!(m.usage(), before);
    assert!(m.block_table(2).is_empty());
}

#[test]
fn prefix_caching_off_never_shares() {
    let mut m = KvCacheManager::new(8, 4, 1.0, false);
    let p: Vec<u32> = (0..12).collect();
    admit(&mut m, 1, &p);
    let hit = admit(&mut m, 2, &p);
    assert!(hit.blocks.is_empty());
    m.free(1);
    assert_eq!(m.usage().cached_idle, 0);
}

/// Two tenants' idle cached blocks: eviction takes from the one furthest over its share of the
/// idle cache (blocks ÷ share), LRU inside it — a scanning tenant evicts its own blocks before
/// another's older hot prefix; one LRU (`set_by_owner(false)`) evicts the oldest whoever's.
#[test]
fn eviction_takes_from_the_tenant_furthest_over_its_share_of_the_idle_cache() {
    for by_owner in [true, false] {
        let mut p = BlockPool::new(8, 1.0, true);
        p.set_by_owner(by_owner);
        let (a, b) = (p.owner("a", 1.0), p.owner("b", 1.0));
        let hot = p.allocate(2).unwrap();
        for (i, &x) in hot.iter().enumerate() {
            p.cache_block_for(x, h(i as u8), a);
        }
        p.free(hot.iter().rev().copied());
        let scan = p.allocate(4).unwrap();
        for (i, &x) in scan.iter().enumerate() {
            p.cache_block_for(x, h(10 + i as u8), b);
        }
        p.free(scan.iter().rev().copied());
        // Two empty blocks, then two evictions.
        p.allocate(4).unwrap();
        let hot_kept = p.lookup(&h(0)).is_some() && p.lookup(&h(1)).is_some();
        if by_owner {
            assert!(hot_kept, "a's prefix stays: b is over its share");
            assert_eq!(
                p.cached_idle_by_owner(),
                vec![("a".to_string(), 2), ("b".to_string(), 2)]
            );
            // b's share 3: a (2 ÷ 1) is now the furthest over; its last block goes first.
            p.owner("b", 3.0);
            assert_eq!(p.allocate(1).unwrap(), vec![hot[1]]);
        } else {
            assert!(!hot_kept, "one LRU evicts the oldest: a's prefix");
            assert_eq!(p.cached_idle_by_owner(), vec![(String::new(), 4)]);
        }
    }
}

/// The manager counts a request's cached blocks in its tenant's share, across preemption.
#[test]
fn a_requests_blocks_count_in_its_tenants_share() {
    let mut m = make_manager(16, 1.0);
    m.set_owner(1, "a", 1.0, 0);
    admit(&mut m, 1, &(0..8).collect::<Vec<u32>>());
    m.free(1); // preempted: still a's
    admit(&mut m, 1, &(0..12).collect::<Vec<u32>>());
    m.free(1);
    m.forget(1);
    m.set_owner(2, "b", 1.0, 0);
    admit(&mut m, 2, &(100..104).collect::<Vec<u32>>());
    m.free(2);
    assert_eq!(
        m.pool().cached_idle_by_owner(),
        vec![("a".to_string(), 3), ("b".to_string(), 1)]
    );
}

/// A request's public-prefix blocks count under the public owner, the rest under its tenant —
/// also when a later request extends the cached public blocks.
#[test]
fn public_prefix_blocks_count_under_the_public_owner() {
    let mut m = make_manager(16, 1.0);
    m.set_owner(1, "a", 1.0, 2);
    admit(&mut m, 1, &(0..13).collect::<Vec<u32>>());
    m.free(1);
    assert_eq!(
        m.pool().cached_idle_by_owner(),
        vec![
            ("a".to_string(), 1),
            (super::manager::PUBLIC_OWNER.to_string(), 2)
        ]
    );
}

/// With every layer sliding, blocks wholly before the read tile of the next query's window go
/// back to the pool (still cached), and the request's table keeps its positions.
#[test]
fn blocks_behind_a_sliding_window_go_back_to_the_pool_as_cached() {
    use super::manager::WINDOW_READ_TILE;
    // Blocks of 4 tokens, a window of 8: reading starts at the 64-token tile holding the window.
    let mut m = KvCacheManager::new(64, 4, 1.0, true);
    m.set_window(Some(8));
    let tokens: Vec<u32> = (0..200).collect();
    let hashes = hasher().hash_all(&tokens);
    // A 100-token prompt, then one token a step up to 200.
    assert!(m.allocate_slots(1, &ComputedBlocks::default(), 0, 100, &hashes));
    assert_eq!(
        m.num_held(1),
        25,
        "the prefill's own queries read from position 0"
    );
    for n in 100..200 {
        assert!(m.allocate_slots(1, &ComputedBlocks::default(), n, 1, &hashes));
        let read_from = (n + 1 - 8) / WINDOW_READ_TILE * WINDOW_READ_TILE;
        let table = (n + 1).div_ceil(4);
        assert_eq!(m.num_held(1), table - read_from / 4, "at {n}");
        assert_eq!(m.block_table(1).len(), table, "positions kept");
    }
    // At 199: reading from 192, blocks 0..48 handed back; they are idle cached prefix blocks.
    let u = m.usage();
    assert_eq!((u.used, u.cached_idle), (2, 48));
    let hit = m.computed_blocks(&hashes[..10], 41);
    assert_eq!(
        hit.num_tokens, 40,
        "a new request still hits the handed-back prefix"
    );
    // Freeing returns only what it holds (no double free).
    m.free(1);
    let u = m.usage();
    assert_eq!((u.used, u.cached_idle + u.free_plain), (0, 64));
    // Without a window nothing is handed back.
    let mut m = KvCacheManager::new(64, 4, 1.0, true);
    assert!(m.allocate_slots(1, &ComputedBlocks::default(), 0, 200, &hashes));
    assert!(m.allocate_slots(1, &ComputedBlocks::default(), 200, 1, &hashes));
    assert_eq!(m.num_held(1), 51);
}
