//! Every fuzz target over its committed corpus (`corpus/<target>/`: the seeds, and each input a
//! fuzzer once failed on, kept as a regression), and over cheap deterministic mutations of it
//! (truncations, bit flips, byte insertions) — on stable, in CI. The long runs are
//! `scripts/fuzz.sh` (libFuzzer, nightly).

use std::path::PathBuf;

use cachet_gateway::server::fields::UnknownFields;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

/// Deterministic variations of `seed`: prefixes, single bit flips and inserted bytes.
fn mutations(seed: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ seed.len() as u64;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n.max(1) as u64) as usize
    };
    for _ in 0..48 {
        let mut v = seed.to_vec();
        match next(3) {
            0 => v.truncate(next(seed.len() + 1)),
            1 if !v.is_empty() => {
                let i = next(v.len());
                v[i] ^= 1 << next(8);
            }
            _ => {
                let i = next(v.len() + 1);
                let b = [0u8, 0xff, b'"', b'{', b'9', b'\\', 0x80][next(7)];
                v.insert(i, b);
            }
        }
        out.push(v);
    }
    out
}

#[test]
fn every_target_holds_on_its_corpus_and_mutations_of_it() {
    for &(name, target) in cachet_fuzz::TARGETS {
        let files = corpus(name);
        assert!(!files.is_empty(), "corpus/{name} has no seeds");
        for (path, bytes) in &files {
            let run = std::panic::catch_unwind(|| target(bytes));
            assert!(run.is_ok(), "{name} failed on {}", path.display());
            for (i, m) in mutations(bytes).into_iter().enumerate() {
                let run = std::panic::catch_unwind(|| target(&m));
                assert!(
                    run.is_ok(),
                    "{name} failed on mutation {i} of {}",
                    path.display()
                );
            }
        }
    }
}

/// The seeds take each target down its deepest path (so a fuzzer starts there): they are
/// valid inputs, or refused for the one reason they were written to show.
#[test]
fn the_seeds_reach_past_the_first_check() {
    use cachet_backend::loader::{self, gguf::GgufFile, hf};
    use cachet_gateway::sandbox::{self, SandboxConfig};
    use cachet_gateway::server::openai;
    let seed = |t: &str, f: &str| {
        std::fs::read(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("corpus")
                .join(t)
                .join(f),
        )
        .unwrap()
    };
    let p = std::path::Path::new("seed");
    let g = GgufFile::from_bytes(p, seed("gguf", "llama-tiny.gguf")).unwrap();
    assert_eq!(g.tensors.len(), 3);
    for t in &g.tensors {
        g.tensor_f32(&t.name).unwrap();
    }
    let meta = loader::gguf_meta(&g, p).unwrap();
    assert_eq!(meta.config.num_hidden_layers, 1);
    assert!(meta.tokenizer.unwrap().chat_template().is_some());
    let st = seed("safetensors", "small.safetensors");
    assert_eq!(hf::shard_names(p, &st).unwrap().len(), 3);
    assert_eq!(
        hf::read_tensor(p, &st, "a").unwrap().data,
        [1.0, 2.0, 3.0, 4.0]
    );
    assert!(
        hf::read_tensor(p, &st, "c").is_err(),
        "I8 is refused by name"
    );
    let cfg = SandboxConfig::default();
    sandbox::precheck(&seed("template_module", "abi.wasm"), &cfg).unwrap();
    sandbox::precheck(&seed("template_module", "abi-with-log.wasm"), &cfg).unwrap();
    assert!(sandbox::precheck(&seed("template_module", "missing-render.wasm"), &cfg).is_err());
    sandbox::parse_reply(&seed("template_reply", "good.json")).unwrap();
    let chat = seed("request", "chat-full.json");
    openai::parse_request(true, &chat[1..], UnknownFields::Reject).unwrap();
    let text = seed("request", "text.json");
    openai::parse_request(false, &text[1..], UnknownFields::Reject).unwrap();
}
