//! Models and the runner that owns a device, a model on it and the paged KV cache.

pub mod decoder;
pub mod input_batch;
pub mod rope;
pub mod runner;
pub mod step_sampler;
pub mod tensor_parallel;

pub use decoder::{Decoder, Logits};
pub use runner::{ModelRunner, Runner, StepOutput};
