//! Tensor-parallel shard arithmetic: which heads, KV heads, hidden units and vocabulary rows rank
//! `r` of `n` holds ([`crate::model::tensor_parallel`] runs the ranks). A leaf: the devices (their
//! vocabulary blocks), the loader (a rank's slices of a checkpoint) and the model read it, and it
//! reads nothing of theirs.

use std::ops::Range;

use crate::config::ModelConfig;
use crate::error::DeviceError;

/// Whether `config` splits over `n` ranks; what does not divide where it does not.
pub fn check(config: &ModelConfig, n: usize) -> Result<(), BadSplit> {
    let (h, kvh, i) = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
    );
    if n == 0 {
        return Err(BadSplit::NoRanks);
    }
    if !h.is_multiple_of(n) {
        return Err(BadSplit::Heads { n, heads: h });
    }
    // A mixture of experts splits every expert's columns.
    let i = config.moe.map_or(i, |m| m.expert_intermediate_size);
    if !i.is_multiple_of(n) {
        return Err(BadSplit::Hidden { n, units: i });
    }
    if !kvh.is_multiple_of(n) && !n.is_multiple_of(kvh) {
        return Err(BadSplit::KvHeads { n, kv_heads: kvh });
    }
    Ok(())
}

/// Why a model does not split over `n` ranks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSplit {
    #[error("--tensor-parallel-size must be at least 1")]
    NoRanks,
    #[error("--tensor-parallel-size {n} does not divide the model's {heads} attention heads")]
    Heads { n: usize, heads: usize },
    #[error("--tensor-parallel-size {n} does not divide the MLP's {units} hidden units")]
    Hidden { n: usize, units: usize },
    #[error("--tensor-parallel-size {n} neither divides the model's {kv_heads} KV heads nor is a multiple of them")]
    KvHeads { n: usize, kv_heads: usize },
}

/// A rank's view of the model: its heads, KV heads and MLP width (the vocabulary stays whole:
/// the gathered logits have every column).
pub fn rank_config(config: &ModelConfig, n: usize) -> ModelConfig {
    let mut c = config.clone();
    c.num_attention_heads /= n;
    c.num_key_value_heads = (config.num_key_value_heads / n).max(1);
    c.intermediate_size /= n;
    if let Some(m) = &mut c.moe {
        m.expert_intermediate_size /= n;
    }
    c
}

/// `[start, end)` of rank `r`'s share of `len` items over `n` ranks: the first `len % n` ranks
/// take one more.
pub fn split(len: usize, r: usize, n: usize) -> Range<usize> {
    let (base, extra) = (len / n, len % n);
    let start = r * base + r.min(extra);
    start..start + base + usize::from(r < extra)
}

/// Every rank's share of a vocabulary of `vocab` over `n` ranks (its rows of the embedding and
/// the LM head, its columns of the logits), in rank order.
pub fn vocab_widths(vocab: usize, n: usize) -> Vec<usize> {
    (0..n).map(|r| split(vocab, r, n).len()).collect()
}

/// Rank `rank`'s block of a vocabulary split `widths` over a group of two or more (`None`: a
/// group of one holds the whole vocabulary); refused (as `device`'s embed) where its embedding
/// table, of `rows` rows, is not that block.
pub fn vocab_part(
    widths: &[usize],
    rank: usize,
    rows: usize,
    device: &'static str,
) -> Result<Option<Range<usize>>, DeviceError> {
    if widths.len() < 2 {
        return Ok(None);
    }
    let first: usize = widths[..rank].iter().sum();
    match widths.get(rank) {
        Some(&w) if w == rows => Ok(Some(first..first + w)),
        w => Err(DeviceError::Op {
            device,
            op: "embed",
            msg: format!(
                "rank {rank}'s embedding has {rows} rows where its block of the vocabulary has {w:?}"
            ),
        }),
    }
}

/// The KV heads rank `r` of `n` holds.
fn kv_heads(kvh: usize, r: usize, n: usize) -> Range<usize> {
    if kvh >= n {
        split(kvh, r, n)
    } else {
        // Fewer KV heads than ranks: each is kept by the n / kvh ranks whose query heads use it.
        let k = r / (n / kvh);
        k..k + 1
    }
}

/// Which rows and columns of the unsplit model's weights rank `r` of `n` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    /// Its q heads' rows of q_proj (and columns of o_proj).
    pub q_rows: Range<usize>,
    /// Its KV heads' rows of k_proj and of v_proj.
    pub kv_rows: Range<usize>,
    /// Its hidden units: rows of gate_proj and up_proj, columns of down_proj (of each expert).
    pub mlp: Range<usize>,
    /// Its q heads', then its KV heads' k and v rows of q|k|v (and of its bias).
    pub qkv_rows: Vec<Range<usize>>,
    /// Its hidden units' gate rows and up rows, of every expert in turn.
    pub gate_up_rows: Vec<Range<usize>>,
    /// Its rows of the embedding and the LM head: its block of the vocabulary.
    pub vocab_rows: Range<usize>,
}

impl ShardPlan {
    pub fn new(config: &ModelConfig, r: usize, n: usize) -> Self {
        let d = config.head_dim;
        let (h, kvh) = (config.num_attention_heads, config.num_key_value_heads);
        let q = split(h, r, n);
        let kv = kv_heads(kvh, r, n);
        // Column-parallel gate|up rows and row-parallel down columns of each expert (the
        // router is whole on every rank: each routes its tokens the same way).
        let (experts, i) = match &config.moe {
            Some(m) => (m.num_experts, m.expert_intermediate_size),
            None => (1, config.intermediate_size),
        };
        let mlp = split(i, r, n);
        ShardPlan {
            q_rows: q.start * d..q.end * d,
            kv_rows: kv.start * d..kv.end * d,
            mlp: mlp.clone(),
            qkv_rows: vec![
                q.start * d..q.end * d,
                (h + kv.start) * d..(h + kv.end) * d,
                (h + kvh + kv.start) * d..(h + kvh + kv.end) * d,
            ],
            gate_up_rows: (0..experts)
                .flat_map(|x| {
                    let base = x * 2 * i;
                    [
                        base + mlp.start..base + mlp.end,
                        base + i + mlp.start..base + i + mlp.end,
                    ]
                })
                .collect(),
            vocab_rows: split(config.vocab_size, r, n),
        }
    }
}

/// A tensor-parallel rank's shard of a model made on its device ([`crate::model::decoder::Decoder::random`]):
/// the unsplit model's config and the rank's plan.
pub struct Shard<'a> {
    pub full: &'a ModelConfig,
    pub plan: ShardPlan,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_item_once_in_order() {
        for len in [1usize, 7, 8, 300, 49_155] {
            for n in 1..=5 {
                let parts: Vec<_> = (0..n).map(|r| split(len, r, n)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[n - 1].end, len);
                for w in parts.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
                }
            }
        }
    }

    #[test]
    fn a_ranks_embedding_is_its_block_of_the_vocabulary_or_refused() {
        let widths = vocab_widths(9, 2);
        assert_eq!(widths, vec![5, 4]);
        assert_eq!(vocab_part(&widths, 1, 4, "cpu").unwrap(), Some(5..9));
        assert_eq!(
            vocab_part(&[9], 0, 9, "cpu").unwrap(),
            None,
            "a group of one holds the whole"
        );
        let e = vocab_part(&widths, 0, 9, "cpu").unwrap_err().to_string();
        assert!(e.contains("9 rows") && e.contains("Some(5)"), "{e}");
    }

    #[test]
    fn fewer_kv_heads_than_ranks_are_kept_by_the_ranks_whose_queries_use_them() {
        // 8 query heads, 2 KV heads, 4 ranks: ranks 0–1 hold queries 0–3 (KV head 0).
        let got: Vec<_> = (0..4).map(|r| kv_heads(2, r, 4)).collect();
        assert_eq!(got, vec![0..1, 0..1, 1..2, 1..2]);
        assert_eq!(kv_heads(8, 1, 4), 2..4);
    }

    #[test]
    fn shapes_that_do_not_divide_are_refused_with_what_does_not() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/tiny-gqa-llama3/config.json");
        let mut c = ModelConfig::from_hf_json(&path).unwrap();
        c.num_attention_heads = 6;
        c.num_key_value_heads = 2;
        c.intermediate_size = 96;
        assert!(check(&c, 3).unwrap_err().to_string().contains("2 KV heads"));
        assert!(check(&c, 4)
            .unwrap_err()
            .to_string()
            .contains("6 attention heads"));
        c.intermediate_size = 63;
        assert!(check(&c, 2)
            .unwrap_err()
            .to_string()
            .contains("63 hidden units"));
        c.intermediate_size = 96;
        assert!(check(&c, 2).is_ok());
        assert!(
            check(&c, 6).is_ok(),
            "KV heads replicated: 6 is a multiple of 2"
        );
    }
}
