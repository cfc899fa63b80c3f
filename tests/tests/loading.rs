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
    let cfg = cachet_backend::ModelConfig::from_hf_json(&fixtures().join("tiny-mha-tied/config.json")).unwrap();
    random::save_random_hf_dir(&dir, &cfg, 2).unwrap();
    let a = std::fs::read(dir.join("model.safetensors")).unwrap();
    let b = std::fs::read(fixtures().join("tiny-mha-tied/model.safetensors")).unwrap();
    assert!(a == b, "regenerated tiny-mha-tied weights differ from the committed fixture");
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
    let cfg = cfg.replace("LlamaForCausalLM", "MambaForCausalLM").replace("\"llama\"", "\"mamba\"");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let e = load_err(&dir);
    assert!(matches!(e, LoadError::UnknownArchitecture { ref arch, .. } if arch == "MambaForCausalLM"), "{e}");
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
        .map(|(n, v)| (n.to_string(), v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    for t in owned.iter_mut().filter(|t| t.0 == "model.embed_tokens.weight") {
        t.1 = safetensors::Dtype::I32;
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
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
        assert!(matches!(e, LoadError::Truncated { .. }), "cut at {cut}: {e}");
    }
}

#[test]
fn gguf_unsupported_quantisation_names_the_type() {
    // Flip the dtype of the first tensor directory entry to Q5_0 (ggml type 6).
    let gguf = std::fs::read(smollm2_path()).unwrap();
    let file = GgufFile::open(&smollm2_path()).unwrap();
    let first = &file.tensors[0].name;
    let name_pos = gguf.windows(first.len()).rposition(|w| w == first.as_bytes()).unwrap();
    let dims = file.tensors[0].dims.len();
    let type_pos = name_pos + first.len() + 4 + 8 * dims;
    let mut bytes = gguf.clone();
    bytes[type_pos..type_pos + 4].copy_from_slice(&6u32.to_le_bytes());
    let dir = scratch("q5");
    let p = dir.join("q5.gguf");
    std::fs::write(&p, bytes).unwrap();
    let e = load_err(&p);
    assert!(matches!(e, LoadError::UnsupportedDtype { ref dtype, .. } if dtype == "Q5_0"), "{e}");
}

#[test]
fn not_a_gguf_is_refused() {
    let dir = scratch("notgguf");
    let p = dir.join("x.gguf");
    std::fs::write(&p, b"hello, this is not a model").unwrap();
    let e = load_err(&p);
    assert!(matches!(e, LoadError::Format { .. }), "{e}");
}
