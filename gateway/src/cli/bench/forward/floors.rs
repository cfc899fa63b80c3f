//! What a forward step must at least cost: the bytes it reads (weights, KV) and the FLOPs of its
//! parameters, from the model's shape — the floors `bench forward` sets its times against.

use super::GemmShape;
use cachet_backend::config::ModelConfig;
use cachet_backend::device::{KvLayout, WeightQuantization};

/// An untied embedding table's parameters: a step reads one row of it per token.
pub(super) fn untied_embedding(c: &ModelConfig) -> f64 {
    if c.tie_word_embeddings {
        0.0
    } else {
        (c.vocab_size * c.hidden_size) as f64
    }
}

/// Parameters a decode step of `tokens` sequences reads: all but an untied embedding table and,
/// in a mixture of experts, the experts the step is expected to leave untouched
/// ([`ModelConfig::experts_touched`]: the floor of the union of experts its tokens use).
pub(super) fn step_parameters(c: &ModelConfig, tokens: usize) -> f64 {
    c.parameters_read(tokens) - untied_embedding(c)
}

/// Parameters each token is multiplied by (2 FLOP each): all but an untied embedding table and
/// the experts it is not routed to.
pub(super) fn token_parameters(c: &ModelConfig) -> f64 {
    c.active_parameters() as f64 - untied_embedding(c)
}

/// The matmuls of an `n`-token prefill as (rows, out, in): one layer's (fused q|k|v, o, fused
/// gate|up, down) and the LM head's (the last token's row). `None` for a mixture of experts,
/// whose experts are not one GEMM each.
pub(super) fn prefill_gemm_shapes(
    c: &ModelConfig,
    n: usize,
) -> Option<(Vec<GemmShape>, GemmShape)> {
    if c.moe.is_some() {
        return None;
    }
    let (h, d) = (c.hidden_size, c.head_dim);
    let q = c.num_attention_heads * d;
    let layer = vec![
        (n, q + 2 * c.num_key_value_heads * d, h),
        (n, h, q),
        (n, 2 * c.intermediate_size, h),
        (n, h, c.intermediate_size),
    ];
    Some((layer, (1, c.vocab_size, h)))
}

/// Bytes of weights a decode step of `tokens` sequences reads: every weight it touches once,
/// the projections as `quantization` stores them (FP8: a byte each and an f32 scale per row).
pub(super) fn weight_bytes_per_decode_step(
    c: &ModelConfig,
    elem: f64,
    quantization: WeightQuantization,
    tokens: usize,
) -> f64 {
    let all = step_parameters(c, tokens) * elem;
    match quantization {
        WeightQuantization::None => all,
        WeightQuantization::Fp8 => {
            let h = c.hidden_size as f64;
            // The MLP's projections: the dense one, or the experts the step touches.
            let (mlp_params, mlp_rows) = match &c.moe {
                Some(m) => {
                    let touched = c.experts_touched(tokens);
                    let ei = m.expert_intermediate_size as f64;
                    (touched * 3.0 * ei * h, touched * (2.0 * ei + h))
                }
                None => {
                    let i = c.intermediate_size as f64;
                    (3.0 * i * h, 2.0 * i + h)
                }
            };
            let params = (c.qkv_dim() + c.q_dim()) as f64 * h + mlp_params;
            let rows = c.qkv_dim() as f64 + h + mlp_rows;
            let layers = c.num_hidden_layers as f64;
            all - layers * (params * (elem - 1.0) - rows * 4.0)
        }
    }
}

/// K and V bytes a decode step reads at `ctx` tokens of context (FP8: codes and scales).
pub(super) fn kv_bytes(layout: &KvLayout, ctx: usize, elem: f64) -> f64 {
    (ctx * layout.block_bytes(elem as usize)) as f64 / layout.block_size as f64
}
