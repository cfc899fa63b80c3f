//! [`Runner`]: one object-safe handle on "a model on a device with its KV cache", so the engine
//! can pick the device at run time (`--device auto|cpu|cuda`).

use super::llama::{Llama, Logits};
use crate::config::ModelConfig;
use crate::device::cpu::CpuDevice;
use crate::device::{Device, ForwardBatch, KvLayout};
use crate::error::EngineError;
use crate::loader::HostWeights;

/// A model ready to run batches against its paged KV cache.
pub trait Runner: Send {
    fn device_name(&self) -> &'static str;
    fn config(&self) -> &ModelConfig;
    fn kv_layout(&self) -> KvLayout;
    /// Longest sequence the runner accepts (RoPE table size).
    fn max_model_len(&self) -> usize;
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, EngineError>;
}

pub struct ModelRunner<D: Device> {
    dev: D,
    model: Llama<D>,
    kv: D::Kv,
    layout: KvLayout,
}

impl<D: Device> ModelRunner<D> {
    pub fn new(
        dev: D,
        config: &ModelConfig,
        weights: &HostWeights,
        num_blocks: usize,
        block_size: usize,
        max_model_len: usize,
    ) -> Result<Self, EngineError> {
        let layout = KvLayout {
            num_layers: config.num_hidden_layers,
            num_blocks,
            block_size,
            num_kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
        };
        let model = Llama::new(&dev, config, weights, max_model_len)?;
        let kv = dev.alloc_kv(&layout)?;
        Ok(ModelRunner {
            dev,
            model,
            kv,
            layout,
        })
    }
}

impl<D: Device> Runner for ModelRunner<D> {
    fn device_name(&self) -> &'static str {
        self.dev.name()
    }
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }
    fn kv_layout(&self) -> KvLayout {
        self.layout
    }
    fn max_model_len(&self) -> usize {
        self.model.max_positions()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, EngineError> {
        batch.validate(&self.layout, self.model.config.vocab_size)?;
        if let Some(&p) = batch.positions.iter().max() {
            if p as usize >= self.model.max_positions() {
                return Err(EngineError::InvalidBatch(format!(
                    "position {p} is beyond max_model_len {}",
                    self.model.max_positions()
                )));
            }
        }
        self.model.forward(&self.dev, &mut self.kv, batch)
    }
}

/// A CPU runner with `num_blocks` KV blocks.
pub fn cpu_runner(
    config: &ModelConfig,
    weights: &HostWeights,
    num_blocks: usize,
    block_size: usize,
    max_model_len: usize,
) -> Result<Box<dyn Runner>, EngineError> {
    Ok(Box::new(ModelRunner::new(
        CpuDevice::new(),
        config,
        weights,
        num_blocks,
        block_size,
        max_model_len,
    )?))
}
