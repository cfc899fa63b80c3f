//! Single-sequence generation over a [`Runner`]: chunked prefill, then decode, streaming each
//! token to a callback. Used by `cachet generate` / `cachet logits` and as the plain reference the
//! batched engine is compared against.

use crate::device::ForwardBatch;
use crate::error::EngineError;
use crate::kv::SimpleAllocator;
use crate::model::{Logits, Runner};
use crate::sampler::{self, SamplingParams};

#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_token_ids: Vec<u32>,
    /// Prompt tokens per forward pass during prefill.
    pub prefill_chunk: usize,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 64,
            sampling: SamplingParams::greedy(),
            stop_token_ids: vec![],
            prefill_chunk: 512,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
}

#[derive(Debug, Clone)]
pub struct GenerateOutput {
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
}

/// Runs `prompt` through the model in chunks and returns the logits of its last token, leaving
/// its K/V in blocks from `alloc` listed in `table`.
pub fn prefill(
    runner: &mut dyn Runner,
    alloc: &mut SimpleAllocator,
    table: &mut Vec<u32>,
    prompt: &[u32],
    chunk: usize,
) -> Result<Logits, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::InvalidRequest(
            "the prompt has no tokens".into(),
        ));
    }
    let bs = runner.kv_layout().block_size;
    let mut done = 0;
    loop {
        let end = (done + chunk.max(1)).min(prompt.len());
        alloc.ensure(table, end)?;
        let mut batch = ForwardBatch::default();
        batch.push_seq(&prompt[done..end], done, table, bs, end == prompt.len());
        let logits = runner.forward(&batch)?;
        tracing::debug!(from = done, to = end, "prefill pass");
        done = end;
        if done == prompt.len() {
            return Ok(logits);
        }
    }
}

/// Generates up to `params.max_tokens` tokens after `prompt`. `on_token` sees each token and
/// returns `false` to stop early.
pub fn generate(
    runner: &mut dyn Runner,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<GenerateOutput, EngineError> {
    params.sampling.validate()?;
    let layout = runner.kv_layout();
    let total = prompt.len() + params.max_tokens;
    if total > runner.max_model_len() {
        return Err(EngineError::InvalidRequest(format!(
            "prompt ({}) + max_tokens ({}) exceeds max_model_len {}",
            prompt.len(),
            params.max_tokens,
            runner.max_model_len()
        )));
    }
    let mut alloc = SimpleAllocator::new(layout.num_blocks, layout.block_size);
    let mut table = Vec::new();
    let seed = params.sampling.seed.unwrap_or(0);
    let mut history = sampler::TokenHistory::new(&params.sampling, prompt);
    let mut logits = prefill(runner, &mut alloc, &mut table, prompt, params.prefill_chunk)?;
    let mut out = Vec::new();
    let finish = loop {
        if out.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        let mut row = logits.row(0).to_vec();
        let edits = sampler::row_edits(&params.sampling, &history, &[], &params.stop_token_ids);
        sampler::apply_edits(&mut row, &edits);
        let tok = sampler::sample(&row, &params.sampling, seed, out.len() as u64);
        out.push(tok);
        history.push(tok);
        if params.stop_token_ids.contains(&tok) {
            break FinishReason::Stop;
        }
        if !on_token(tok) {
            break FinishReason::Cancelled;
        }
        if out.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        let pos = prompt.len() + out.len() - 1;
        alloc.ensure(&mut table, pos + 1)?;
        let mut batch = ForwardBatch::default();
        batch.push_seq(&[tok], pos, &table, layout.block_size, true);
        logits = runner.forward(&batch)?;
    };
    Ok(GenerateOutput {
        tokens: out,
        finish,
    })
}

/// Logits of the last `rows` positions of `prompt` (its earlier tokens prefilled in chunks of
/// `chunk`), leaving the runner's cache free again.
pub fn last_logits(
    r: &mut dyn Runner,
    prompt: &[u32],
    rows: usize,
    chunk: usize,
) -> Result<Logits, EngineError> {
    let rows = rows.clamp(1, prompt.len());
    let split = prompt.len() - rows;
    let layout = r.kv_layout();
    let mut alloc = SimpleAllocator::new(layout.num_blocks, layout.block_size);
    let mut table = Vec::new();
    if split > 0 {
        prefill(r, &mut alloc, &mut table, &prompt[..split], chunk)?;
    }
    alloc.ensure(&mut table, prompt.len())?;
    let mut b = ForwardBatch::default();
    b.push_seq(&prompt[split..], split, &table, layout.block_size, false);
    b.logit_rows = (0..rows as u32).collect();
    r.forward(&b)
}
