//! Model loading: clear errors for bad input; fixtures reproducible from the project's own code.

use std::path::{Path, PathBuf};

use cachet_backend::loader::{self, gguf::GgufFile, random};
use cachet_backend::LoadError;
use cachet_tests::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cachet-loading-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn copy_tiny(to: &Path) {
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixtures().join("tiny-mha-tied").join(f), to.join(f)).unwrap();
    }
}

fn load_err(spec: &Path) -> LoadError {
    match loader::load(spec.to_str().unwrap(), false) {
        Ok(_) => panic!("{} loaded but should not", spec.display()),
        Err(e) => e,
    }
}

#[test]
fn committed_tiny_models_are_exactly_what_our_generator_writes() {
    let dir = scratch("regen");
    let cfg =
        cachet_backend::ModelConfig::from_hf_json(&fixtures().join("tiny-mha-tied/config.json"))
            .unwrap();
    random::save_random_hf_dir(&dir, &cfg, 2).unwrap();
    let a = std::fs::read(dir.join("model.safetensors")).unwrap();
    let b = std::fs::read(fixtures().join("tiny-mha-tied/model.safetensors")).unwrap();
    assert!(
        a == b,
        "regenerated tiny-mha-tied weights differ from the committed fixture"
    );
}

#[test]
fn missing_model_says_what_to_do() {
    let e = load_err(Path::new("/nonexistent/model"));
    assert!(matches!(e, LoadError::NotFound { .. }), "{e}");
    assert!(e.to_string().contains("smollm2"), "lists known models: {e}");
    let dir = scratch("nocfg");
    let e = load_err(&dir);
    assert!(e.to_string().contains("config.json"), "{e}");
}

#[test]
fn unknown_architecture_is_refused() {
    let dir = scratch("arch");
    copy_tiny(&dir);
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let cfg = cfg
        .replace("LlamaForCausalLM", "MambaForCausalLM")
        .replace("\"llama\"", "\"mamba\"");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let e = load_err(&dir);
    assert!(
        matches!(e, LoadError::UnknownArchitecture { ref arch, .. } if arch == "MambaForCausalLM"),
        "{e}"
    );
}

#[test]
fn wrong_dtype_is_refused_with_the_tensor_named() {
    let dir = scratch("dtype");
    copy_tiny(&dir);
    // Rewrite the embedding as int32 with the same shape.
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                v.dtype(),
                v.shape().to_vec(),
                v.data().to_vec(),
            )
        })
        .collect();
    for t in owned
        .iter_mut()
        .filter(|t| t.0 == "model.embed_tokens.weight")
    {
        t.1 = safetensors::Dtype::I32;
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let e = load_err(&dir);
    assert!(
        matches!(e, LoadError::UnsupportedDtype { ref tensor, ref dtype, .. } if tensor == "model.embed_tokens.weight" && dtype == "I32"),
        "{e}"
    );
}

#[test]
fn truncated_files_are_reported_as_truncated() {
    let dir = scratch("trunc");
    copy_tiny(&dir);
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(&dir);
    assert!(matches!(e, LoadError::Truncated { .. }), "{e}");

    // A GGUF cut inside its tensor data, and one cut inside its metadata.
    let gguf = std::fs::read(smollm2_path()).unwrap();
    for cut in [gguf.len() - 1000, 4096] {
        let p = dir.join(format!("cut{cut}.gguf"));
        std::fs::write(&p, &gguf[..cut]).unwrap();
        let e = load_err(&p);
        assert!(
            matches!(e, LoadError::Truncated { .. }),
            "cut at {cut}: {e}"
        );
    }
}

#[test]
fn gguf_unsupported_quantisation_names_the_type() {
    // Flip the dtype of the first tensor directory entry to Q3_K (ggml type 11).
    let gguf = std::fs::read(smollm2_path()).unwrap();
    let file = GgufFile::open(&smollm2_path()).unwrap();
    let first = &file.tensors[0].name;
    let name_pos = gguf
        .windows(first.len())
        .rposition(|w| w == first.as_bytes())
        .unwrap();
    let dims = file.tensors[0].dims.len();
    let type_pos = name_pos + first.len() + 4 + 8 * dims;
    let mut bytes = gguf.clone();
    bytes[type_pos..type_pos + 4].copy_from_slice(&11u32.to_le_bytes());
    let dir = scratch("q3k");
    let p = dir.join("q3k.gguf");
    std::fs::write(&p, bytes).unwrap();
    let e = load_err(&p);
    assert!(
        matches!(e, LoadError::UnsupportedDtype { ref dtype, .. } if dtype == "Q3_K"),
        "{e}"
    );
}

/// Every block format we read, against llama.cpp's own Python dequantiser (gguf-py) on random
/// blocks (scripts/gguf_blocks_reference.py).
#[test]
fn gguf_blocks_dequantise_like_gguf_py() {
    use cachet_backend::loader::gguf::{dequantize, GgmlType};
    let reference = read_json("gguf_blocks_reference.json");
    for t in reference["types"].as_array().unwrap() {
        let name = t["type"].as_str().unwrap();
        let ty = GgmlType::from_id(t["id"].as_u64().unwrap() as u32).unwrap();
        let hex = t["bytes"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let want: Vec<f32> = t["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let got = dequantize(ty, &bytes, want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{name} element {i}: {g} vs gguf-py {w}"
            );
        }
    }
}

/// Writes `tiny-qwen2` with `edit` applied to its config.json.
fn edited_qwen2(name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = scratch(name);
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixtures().join("tiny-qwen2").join(f), dir.join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

/// A config edit, and what the refusal must say.
type Refusal = (&'static str, fn(&mut serde_json::Value), &'static str);

#[test]
fn unsupported_variants_of_a_family_are_refused_with_the_field_named() {
    let cases: [Refusal; 4] = [
        ("moe", |c| c["num_experts"] = 8.into(), "`num_experts`"),
        ("mlpbias", |c| c["mlp_bias"] = true.into(), "`mlp_bias`"),
        (
            "act",
            |c| c["hidden_act"] = "gelu".into(),
            "`hidden_act` is `gelu`",
        ),
        (
            "rope",
            |c| {
                c["rope_parameters"] =
                    serde_json::json!({"rope_type": "longrope", "rope_theta": 1e6})
            },
            "`rope_scaling` type `longrope`",
        ),
    ];
    for (name, edit, want) in cases {
        let e = load_err(&edited_qwen2(name, edit));
        assert!(e.to_string().contains(want), "{name}: {e}");
    }
}

#[test]
fn not_a_gguf_is_refused() {
    let dir = scratch("notgguf");
    let p = dir.join("x.gguf");
    std::fs::write(&p, b"hello, this is not a model").unwrap();
    let e = load_err(&p);
    assert!(matches!(e, LoadError::Format { .. }), "{e}");
}

fn tiny_logits(dir: &Path, ids: &[u32]) -> Vec<f32> {
    let m = loader::load(dir.to_str().unwrap(), false).unwrap();
    let mut r = runner(&m, 8);
    all_logits(r.as_mut(), ids).data
}

/// Rewrites every tensor of a safetensors file with `convert` applied to its f32 bytes.
fn rewrite(src: &Path, dst_dir: &Path, shards: usize, dtype: safetensors::Dtype) {
    let bytes = std::fs::read(src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let conv = |d: &[u8]| -> Vec<u8> {
        let f = d
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        match dtype {
            safetensors::Dtype::F32 => d.to_vec(),
            safetensors::Dtype::F16 => f
                .flat_map(|x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            safetensors::Dtype::BF16 => f
                .flat_map(|x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
            _ => unreachable!(),
        }
    };
    let per = names.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in names.chunks(per).enumerate() {
        let fname = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", i + 1)
        };
        let owned: Vec<(String, Vec<usize>, Vec<u8>)> = chunk
            .iter()
            .map(|n| {
                let v = st.tensor(n).unwrap();
                (n.clone(), v.shape().to_vec(), conv(v.data()))
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
            .iter()
            .map(|(n, s, b)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dst_dir.join(&fname)).unwrap();
        for n in chunk {
            weight_map.insert(n.clone(), serde_json::Value::String(fname.clone()));
        }
    }
    if shards > 1 {
        let idx = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(
            dst_dir.join("model.safetensors.index.json"),
            idx.to_string(),
        )
        .unwrap();
    }
}

#[test]
fn sharded_and_half_precision_safetensors_load() {
    let src = fixtures().join("tiny-gqa-llama3");
    let ids: Vec<u32> = (0..30).map(|i| (i * 37 % 311) as u32).collect();
    let want = tiny_logits(&src, &ids);
    for (shards, dtype, tol) in [
        (3, safetensors::Dtype::F32, 1e-7),
        (1, safetensors::Dtype::F16, 5e-3),
        (2, safetensors::Dtype::BF16, 3e-2),
    ] {
        let dir = scratch(&format!("st-{shards}-{dtype:?}"));
        std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
        rewrite(&src.join("model.safetensors"), &dir, shards, dtype);
        let got = tiny_logits(&dir, &ids);
        let err = rel_err(&got, &want);
        assert!(
            err <= tol,
            "{shards} shards of {dtype:?}: relative error {err:e}"
        );
    }
}

#[test]
fn hf_directory_tokenizer_and_chat_template_load() {
    let dir = scratch("hftok");
    copy_tiny(&dir);
    let gguf_tok = smollm2().tokenizer.as_ref().unwrap();
    gguf_tok
        .inner()
        .save(dir.join("tokenizer.json"), false)
        .unwrap();
    let cfg = serde_json::json!({"chat_template": gguf_tok.chat_template().unwrap(), "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let m = loader::load(dir.to_str().unwrap(), false).unwrap();
    let tok = m.tokenizer.unwrap();
    let text = "Hello, world! 123 🦀 <|im_start|>user";
    assert_eq!(tok.encode(text).unwrap(), gguf_tok.encode(text).unwrap());
    let msgs = [cachet_backend::tokenizer::ChatMessage::new("user", "hi")];
    assert_eq!(
        tok.render_chat(&msgs, true).unwrap(),
        gguf_tok.render_chat(&msgs, true).unwrap()
    );
}

/// A bf16 checkpoint as `cachet model random --dtype bf16` writes it (streamed, every tensor in
/// bf16) reads as a real one: read whole and streamed onto the device layer by layer (the
/// reader running ahead of the uploads) the model gives the same logits, and the load reports
/// its bf16 bytes. A file missing a layer stops the stream with that tensor's name.
#[test]
fn a_bf16_checkpoint_streams_onto_the_device_and_a_missing_layer_is_named() {
    let dir = scratch("bf16");
    let cfg =
        cachet_backend::ModelConfig::from_hf_json(&fixtures().join("tiny-gqa-llama3/config.json"))
            .unwrap();
    random::save_random_hf_dir_bf16(&dir, &cfg, 5).unwrap();
    let spec = dir.to_str().unwrap();
    let m = loader::load(spec, false).unwrap();
    let embed = &m.weights.embed.data;
    assert!(
        embed
            .iter()
            .all(|&x| x.is_finite() && half::bf16::from_f32(x).to_f32() == x),
        "every weight is a bf16 value"
    );
    let mut whole = runner(&m, 16);
    let mut streamed = files_tp_runner(spec, &m.config, 16, 1).unwrap();
    let load = streamed.weights_load().expect("loaded from files");
    assert_eq!(load.bytes, 2 * cfg.num_parameters() as u64);
    let ids: Vec<u32> = (0..24u32)
        .map(|t| (t * 31 + 7) % cfg.vocab_size as u32)
        .collect();
    let (a, b) = (
        all_logits(whole.as_mut(), &ids),
        all_logits(streamed.as_mut(), &ids),
    );
    assert_eq!(a.data, b.data);
    // One layer more in the config than in the file.
    let mut longer = cfg.clone();
    longer.num_hidden_layers += 1;
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string(&longer.to_hf_json()).unwrap(),
    )
    .unwrap();
    let missing = format!("model.layers.{}.", cfg.num_hidden_layers);
    match files_tp_runner(spec, &longer, 16, 1) {
        Ok(_) => panic!("a model missing layer {} loaded", cfg.num_hidden_layers),
        Err(e) => assert!(e.to_string().contains(&missing), "{e}"),
    }
}
