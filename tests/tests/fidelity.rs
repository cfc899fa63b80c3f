//! The CPU reference engine against HF transformers (fixtures written by scripts/reference.py).

use cachet_backend::device::ForwardBatch;
use cachet_backend::generate::{generate, GenerateParams};
use cachet_backend::kv::SimpleAllocator;
use cachet_backend::tokenizer::ChatMessage;
use cachet_tests::*;

#[test]
fn smollm2_top5_logits_match_transformers() {
    let m = smollm2();
    let reference = read_json("smollm2_reference.json");
    let mut r = runner(m, 64);
    for case in reference["cases"].as_array().unwrap() {
        let ids = ids_of(&case["ids"]);
        let logits = all_logits(r.as_mut(), &ids);
        let last = logits.row(ids.len() - 1);
        let mut order: Vec<usize> = (0..last.len()).collect();
        order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
        for (rank, want) in case["top5"].as_array().unwrap().iter().enumerate() {
            let (id, logit) = (
                want["id"].as_u64().unwrap() as usize,
                want["logit"].as_f64().unwrap(),
            );
            assert_eq!(order[rank], id, "prompt {:?}: rank {rank}", case["prompt"]);
            let rel = (last[id] as f64 - logit).abs() / logit.abs().max(1e-6);
            assert!(
                rel <= 1e-3,
                "prompt {:?}: id {id}: {} vs {logit} (rel {rel:e})",
                case["prompt"],
                last[id]
            );
        }
    }
}

#[test]
fn smollm2_greedy_chat_answer_names_paris_like_transformers() {
    let m = smollm2();
    let tok = m.tokenizer.as_ref().unwrap();
    let reference = &read_json("smollm2_reference.json")["greedy_chat"];
    let prompt = tok
        .render_chat(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    assert_eq!(
        prompt,
        reference["prompt"].as_str().unwrap(),
        "chat template rendering"
    );
    let ids = tok.encode(&prompt).unwrap();
    assert_eq!(ids, ids_of(&reference["prompt_ids"]));
    let mut r = runner(m, 16);
    let params = GenerateParams {
        max_tokens: 24,
        stop_token_ids: m.config.eos_token_ids.clone(),
        ..Default::default()
    };
    let out = generate(r.as_mut(), &ids, &params, |_| true).unwrap();
    assert_eq!(
        out.tokens,
        ids_of(&reference["output_ids"]),
        "greedy tokens differ from transformers"
    );
    let text = tok.decode(&out.tokens, true).unwrap();
    assert!(text.contains("Paris"), "{text}");
}

fn check_tiny(name: &str) {
    let m = tiny(name);
    let reference = read_json(&format!("{name}_reference.json"));
    let mut r = runner(&m, 8);
    for case in reference["cases"].as_array().unwrap() {
        check_case_logits(r.as_mut(), case, 1e-4, name);
    }
}

#[test]
fn tiny_gqa_llama3_rope_matches_transformers() {
    check_tiny("tiny-gqa-llama3");
}

#[test]
fn tiny_mha_tied_matches_transformers() {
    check_tiny("tiny-mha-tied");
}

/// Several sequences of different lengths in one varlen batch, each with part of its tokens
/// already cached (chunked), give the same logits as each sequence run alone.
#[test]
fn varlen_batch_with_cached_prefixes_equals_separate_runs() {
    let m = tiny("tiny-gqa-llama3");
    let reference = read_json("tiny-gqa-llama3_reference.json");
    let seqs: Vec<Vec<u32>> = reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| ids_of(&c["ids"]))
        .collect();
    let mut r = runner(&m, 32);
    let bs = r.kv_layout().block_size;
    let alone: Vec<Vec<f32>> = seqs
        .iter()
        .map(|s| {
            let l = all_logits(r.as_mut(), s);
            l.row(s.len() - 1).to_vec()
        })
        .collect();
    // Step 1: the first half of every sequence (ragged chunk), step 2: the rest, batched.
    let mut alloc = SimpleAllocator::new(32, bs);
    let mut tables: Vec<Vec<u32>> = vec![Vec::new(); seqs.len()];
    let split: Vec<usize> = seqs.iter().map(|s| s.len() / 2).collect();
    let mut b1 = ForwardBatch::default();
    for (i, s) in seqs.iter().enumerate() {
        if split[i] > 0 {
            alloc.ensure(&mut tables[i], s.len()).unwrap();
            b1.push_seq(&s[..split[i]], 0, &tables[i], bs, true);
        }
    }
    r.forward(&b1).unwrap();
    let mut b2 = ForwardBatch::default();
    for (i, s) in seqs.iter().enumerate() {
        alloc.ensure(&mut tables[i], s.len()).unwrap();
        b2.push_seq(&s[split[i]..], split[i], &tables[i], bs, true);
    }
    let batched = r.forward(&b2).unwrap();
    for (i, want) in alone.iter().enumerate() {
        let err = rel_err(batched.row(i), want);
        assert!(err < 1e-5, "sequence {i}: {err:e}");
    }
}
