//! The block hash against vectors from an independent blake3 (scripts/block_hash_vectors.py).

use cachet_backend::block_hash::{tenant_salt, HashContext};
use cachet_tests::*;

fn hex32(s: &str) -> [u8; 32] {
    let v: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

#[test]
fn block_hashes_match_the_committed_vectors() {
    let doc = read_json("block_hash_vectors.json");
    for case in doc["cases"].as_array().unwrap() {
        let key = hex32(case["key"].as_str().unwrap());
        let salt = tenant_salt(&key, case["tenant"].as_str().unwrap());
        assert_eq!(salt, hex32(case["salt"].as_str().unwrap()), "tenant salt");
        let extra_hex = case["extra"].as_str().unwrap();
        let extra: Vec<u8> = (0..extra_hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&extra_hex[i..i + 2], 16).unwrap())
            .collect();
        let mut ctx = HashContext::new(
            key,
            salt,
            case["model_id"].as_str().unwrap(),
            case["block_size"].as_u64().unwrap() as usize,
        );
        ctx.extra = extra;
        ctx.public_blocks = case["public_blocks"].as_u64().unwrap_or(0) as usize;
        let tokens = ids_of(&case["tokens"]);
        let got: Vec<String> = ctx.hash_all(&tokens).iter().map(|h| h.to_hex()).collect();
        let want: Vec<String> = case["hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            got, want,
            "case {} / {} / {} public blocks",
            case["tenant"], case["model_id"], ctx.public_blocks
        );
        // Incremental extension gives the same chain.
        let mut inc = Vec::new();
        for n in 0..=tokens.len() {
            ctx.extend(&mut inc, &tokens[..n]);
        }
        assert_eq!(inc.iter().map(|h| h.to_hex()).collect::<Vec<_>>(), want);
    }
}

#[test]
fn different_tenants_never_share_a_block_hash() {
    let key = [7u8; 32];
    let a = HashContext::new(key, tenant_salt(&key, "a"), "m", 16);
    let b = HashContext::new(key, tenant_salt(&key, "b"), "m", 16);
    let toks: Vec<u32> = (0..64).collect();
    let (ha, hb) = (a.hash_all(&toks), b.hash_all(&toks));
    assert!(ha.iter().all(|h| !hb.contains(h)));
}

#[test]
fn tenants_share_the_public_blocks_and_not_one_block_more() {
    let key = [7u8; 32];
    let ctx = |tenant: &str, public_blocks| HashContext {
        public_blocks,
        ..HashContext::new(key, tenant_salt(&key, tenant), "m", 16)
    };
    let toks: Vec<u32> = (0..80).collect();
    let (a, b) = (ctx("a", 2).hash_all(&toks), ctx("b", 2).hash_all(&toks));
    assert_eq!(a[..2], b[..2], "the public blocks are everyone's");
    assert!(
        a[2..].iter().all(|h| !b.contains(h)),
        "nothing after them is"
    );
    // The public blocks are not any tenant's private blocks, and a tenant's own chain after the
    // public part is not its private chain of the same tokens.
    let private = ctx("a", 0).hash_all(&toks);
    assert!(a.iter().all(|h| !private.contains(h)));
}
