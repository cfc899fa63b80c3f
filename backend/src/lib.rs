//! Cachet's engine library.
//!
//! - [`loader`]: HF (`config.json` + safetensors) and GGUF models, tokenizers, `model fetch`.
//! - [`model`]: the decoder forward pass of every supported family, written once against the [`device::Device`] trait.
//! - [`device`]: the devices a model runs on; `cpu` is the reference every other device is held to.
//! - [`kv`]: the paged KV cache's block bookkeeping.
//! - [`sampler`], [`generate`]: turning logits into tokens, and a single-sequence generation loop.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod block_hash;
pub mod config;
pub mod device;
pub mod engine;
pub mod error;
pub mod generate;
pub mod grammar;
pub mod kv;
pub mod loader;
pub mod model;
pub mod request;
pub mod rng;
pub mod sampler;
pub mod scheduler;
pub mod shard;
pub mod spec;
pub mod tensor;
pub mod tokenizer;

pub use config::ModelConfig;
pub use error::{BadValue, DeviceError, EngineError, LoadError};
