//! Tensor parallelism on the CPU device (issue 23): every tiny family split over 2 and 4 ranks
//! (threads of this process with shared-memory collectives) gives transformers' logits and the
//! unsplit model's within f32 rounding, and through the engine — batched, chunked, with prefix
//! hits — transformers' greedy tokens. Shapes that do not split are refused, naming what does not
//! divide.

use cachet_backend::device::ForwardBatch;
use cachet_backend::engine::{Engine, EngineConfig};
use cachet_backend::kv::SimpleAllocator;
use cachet_backend::scheduler::SchedulerConfig;
use cachet_backend::shard::split;
use cachet_tests::*;

/// Each tiny fixture and the rank counts its heads, KV heads and MLP split over (KV heads fewer
/// than the ranks are kept by the ranks that use them: tiny-qwen2-yarn has one).
const MODELS: [(&str, &[usize]); 9] = [
    ("tiny-gqa-llama3", &[2]),
    ("tiny-mha-tied", &[2, 4]),
    ("tiny-qwen2", &[2, 4]),
    ("tiny-qwen2-yarn", &[2, 4]),
    ("tiny-qwen3", &[2, 4]),
    ("tiny-gemma3", &[2, 4]),
    ("tiny-mistral-window", &[2, 4]),
    // Every expert's columns split over the ranks, the router whole on each.
    ("tiny-qwen3-moe", &[2, 4]),
    ("tiny-mixtral", &[2, 4]),
];

#[test]
fn split_models_give_transformers_logits_and_the_unsplit_ones() {
    for (name, splits) in MODELS {
        let m = tiny(name);
        let reference = read_json(&format!("{name}_reference.json"));
        let mut whole = device_runner(DeviceKind::Cpu, &m, 16);
        for &n in splits {
            let mut r = tp_runner(&m, 16, n).unwrap();
            // The runner speaks for the whole model, not a rank's share of it.
            assert_eq!(r.config().num_attention_heads, m.config.num_attention_heads);
            assert_eq!(r.config().intermediate_size, m.config.intermediate_size);
            for case in reference["cases"].as_array().unwrap() {
                let what = format!("{name} over {n} ranks");
                let (ids, _, got) = check_case_logits(r.as_mut(), case, 1e-4, &what);
                let unsplit = all_logits(whole.as_mut(), &ids);
                let err = rel_err(&got.data, &unsplit.data);
                assert!(err <= 1e-5, "{what}: {err:e} from the unsplit model");
            }
        }
    }
}

#[test]
fn the_engine_serves_a_split_model_like_transformers() {
    for (name, splits) in MODELS {
        let reference = read_json(&format!("{name}_reference.json"));
        let Some(greedy) = reference["greedy"].as_array() else {
            continue; // fixtures made before the greedy cases: logits only (above)
        };
        let m = tiny(name);
        let cases: Vec<(Vec<u32>, Vec<u32>, Option<usize>)> = greedy
            .iter()
            .map(|c| (ids_of(&c["prompt"]), ids_of(&c["output"]), None))
            .collect();
        let n = splits[splits.len() - 1];
        // Both prompts at once, 16-token steps (chunked prefill beside decodes), twice (the
        // second round hits the prefix cache).
        let cfg = EngineConfig {
            scheduler: SchedulerConfig {
                max_num_batched_tokens: 16,
                ..Default::default()
            },
            ..Default::default()
        };
        let e = Engine::start(tp_runner(&m, 64, n).unwrap(), m.tokenizer.clone(), cfg);
        let what = format!("{name} over {n} ranks");
        check_engine_greedy_rounds(DeviceKind::Cpu, &m, &e, &cases, &what);
    }
}

#[test]
fn shapes_that_do_not_split_are_refused_naming_what_does_not_divide() {
    let m = tiny("tiny-gqa-llama3"); // 6 heads, 2 KV heads, 200 hidden units
    let err = |n| tp_runner(&m, 16, n).err().expect("refused").to_string();
    assert!(err(4).contains("6 attention heads"), "{}", err(4));
    assert!(err(3).contains("200 hidden units"), "{}", err(3));
    assert!(err(0).contains("at least 1"), "{}", err(0));
    let m = tiny("tiny-qwen2"); // 112 hidden units
    assert!(tp_runner(&m, 16, 8)
        .err()
        .unwrap()
        .to_string()
        .contains("attention heads"));
}

#[test]
fn smollm2_over_three_ranks_gives_the_unsplit_logits() {
    // Real weights: 9 heads, 3 KV heads and 1,536 MLP units, three each per rank.
    let m = smollm2();
    let ids = m
        .tokenizer
        .as_ref()
        .unwrap()
        .encode("The capital of France is Paris, and the capital of Italy is")
        .unwrap();
    let whole = all_logits(device_runner(DeviceKind::Cpu, m, 16).as_mut(), &ids);
    let split = all_logits(tp_runner(m, 16, 3).unwrap().as_mut(), &ids);
    let err = rel_err(&split.data, &whole.data);
    assert!(err <= 1e-5, "{err:e} from the unsplit model");
}

#[test]
fn a_step_refused_on_every_rank_leaves_the_split_model_serving() {
    let m = tiny("tiny-qwen2");
    let mut r = tp_runner(&m, 16, 2).unwrap();
    let mut alloc = SimpleAllocator::new(16, 16);
    let mut table = Vec::new();
    alloc.ensure(&mut table, 3).unwrap();
    let mut b = ForwardBatch::default();
    // A token id past the 300-token vocabulary.
    b.push_seq(&[1, 5_000, 2], 0, &table, 16, false);
    b.logit_rows = vec![2];
    let e = match r.forward(&b) {
        Ok(_) => panic!("a token past the vocabulary was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("5000"), "{e}");
    let ids = [3, 17, 250, 9];
    let want = all_logits(device_runner(DeviceKind::Cpu, &m, 16).as_mut(), &ids);
    let got = all_logits(r.as_mut(), &ids);
    assert!(rel_err(&got.data, &want.data) <= 1e-5);
}

#[test]
fn dummy_weights_made_split_are_the_unsplit_dummy_models() {
    // `--load-format dummy` over ranks: each rank draws its part of the unsplit dummy model
    // (uneven vocabularies, tied and untied heads, biases, experts).
    for (name, splits) in MODELS {
        let config = tiny(name).config;
        let ids: Vec<u32> = [3u32, 17, 250, 9, 41, 7, 120]
            .iter()
            .map(|&t| t % config.vocab_size as u32)
            .collect();
        let whole = all_logits(
            dummy_runner(DeviceKind::Cpu, &config, 16, 1)
                .unwrap()
                .as_mut(),
            &ids,
        );
        for &n in splits {
            let split = all_logits(
                dummy_runner(DeviceKind::Cpu, &config, 16, n)
                    .unwrap()
                    .as_mut(),
                &ids,
            );
            let err = rel_err(&split.data, &whole.data);
            assert!(
                err <= 1e-5,
                "{name} over {n} ranks: {err:e} from the unsplit dummy model"
            );
        }
    }
}

gpu_test! {
    /// The CUDA dummy generator draws a rank's rows and columns without the rest of the
    /// tensor, and they are the whole tensor's values there.
    #[allow(clippy::single_range_in_vec_init)] // a part of one row range is a case here
    fn cuda_dummy_parts_are_the_whole_dummy_tensors_parts() {
        use cachet_backend::device::cuda::{CudaDevice, CudaOptions};
        use cachet_backend::device::{Device, Part};
        use cachet_backend::tensor::HostTensor;
        let dev = CudaDevice::new(0, 16, CudaOptions::from_env(None).unwrap()).unwrap();
        let shape = [96usize, 40];
        let whole = HostTensor::new(shape.to_vec(), dev.to_host(&dev.random(&shape, 11, 0.0, 1.0).unwrap()).unwrap());
        for (rows, cols) in [
            (vec![0..96], 0..40),
            (vec![8..24, 40..48, 90..96], 0..40),
            (vec![0..96], 13..29),
            (vec![5..6], 39..40),
        ] {
            let part = Part { rows: &rows, cols };
            let got = dev.to_host(&dev.random_part(&shape, &part, 11, 0.0, 1.0).unwrap()).unwrap();
            assert_eq!(got, part.cut(&whole).data, "{part:?}");
        }
        // A 1-D tensor's parts are ranges of its elements.
        let whole = dev.to_host(&dev.random(&[300], 5, 1.0, 0.5).unwrap()).unwrap();
        let rows = [10..20, 200..210];
        let got = dev
            .to_host(&dev.random_part(&[300], &Part { rows: &rows, cols: 0..1 }, 5, 1.0, 0.5).unwrap())
            .unwrap();
        assert_eq!(got, [&whole[10..20], &whole[200..210]].concat());
    }
}

gpu_test! {
    /// One GPU as a tensor-parallel group of one: the model goes through NCCL's all-reduce and
    /// all-gather (copies, for one rank) eagerly and inside the decode graphs, and gives the
    /// plain runner's logits and, through the engine, transformers' greedy tokens.
    fn one_gpu_through_nccl_gives_the_plain_runners_logits() {
        for (name, _) in MODELS {
            let m = tiny(name);
            let reference = read_json(&format!("{name}_reference.json"));
            let mut plain = device_runner(DeviceKind::Cuda, &m, 16);
            let mut tp = cuda_tp_runner(&m, 16, 1).unwrap();
            assert!(tp.cuda_graphs().is_some(), "{name}: decode graphs captured with NCCL in them");
            let secs = tp.time_all_reduce(4 * m.config.hidden_size, 16).unwrap();
            assert!(secs.is_some_and(|s| s > 0.0), "{name}: NCCL all-reduces timed: {secs:?}");
            for case in reference["cases"].as_array().unwrap() {
                let ids = ids_of(&case["ids"]);
                let (a, b) = (all_logits(plain.as_mut(), &ids), all_logits(tp.as_mut(), &ids));
                let err = rel_err(&b.data, &a.data);
                assert!(err <= 1e-3, "{name}, {} tokens: {err:e} from the plain runner", ids.len());
            }
            // The rank reading its slices from the files (here all of them) on the GPU.
            let spec = fixtures().join(name);
            let mut read = cuda_files_tp_runner(spec.to_str().unwrap(), &m.config, 16, 1).unwrap();
            let ids = ids_of(&reference["cases"][0]["ids"]);
            let (a, b) = (all_logits(plain.as_mut(), &ids), all_logits(read.as_mut(), &ids));
            assert!(rel_err(&b.data, &a.data) <= 1e-3, "{name}: read from its files");
            if let Some(greedy) = reference["greedy"].as_array() {
                let cases: Vec<(Vec<u32>, Vec<u32>, Option<usize>)> = greedy
                    .iter()
                    .map(|c| (ids_of(&c["prompt"]), ids_of(&c["output"]), first_route_tie(&c["route_gaps"])))
                    .collect();
                let e = Engine::start(cuda_tp_runner(&m, 64, 1).unwrap(), m.tokenizer.clone(), EngineConfig::default());
                check_engine_greedy_rounds(DeviceKind::Cuda, &m, &e, &cases, &format!("{name} through NCCL"));
            }
        }
    }
}

gpu_test! {
    /// Every tiny family split over two GPUs through NCCL: transformers' logits within the
    /// GPU's bf16 tolerance and the one-GPU model's, greedy through the engine; dummy weights
    /// made split equal to the one-GPU dummy model's. Needs two GPUs (says so and stops
    /// with fewer).
    fn split_over_two_gpus_gives_transformers_logits_and_the_unsplit_ones() {
        let gpus = cuda_gpus();
        if gpus < 2 {
            eprintln!("skipped: {gpus} GPU(s) visible, tensor parallelism over NCCL needs 2");
            return;
        }
        for (name, _) in MODELS {
            let m = tiny(name);
            let reference = read_json(&format!("{name}_reference.json"));
            let mut whole = device_runner(DeviceKind::Cuda, &m, 16);
            let mut r = cuda_tp_runner(&m, 16, 2).unwrap();
            for case in reference["cases"].as_array().unwrap() {
                let what = format!("{name} over 2 GPUs");
                // A mixture of experts as far as bf16 can follow transformers' routing.
                let Some(case) = &case_before_route_tie(DeviceKind::Cuda, case) else {
                    continue;
                };
                let (ids, _, got) = check_case_logits(r.as_mut(), case, 3e-2, &what);
                let unsplit = all_logits(whole.as_mut(), &ids);
                let err = rel_err(&got.data, &unsplit.data);
                assert!(err <= 2e-2, "{what}: {err:e} from the one-GPU model");
            }
            // Each GPU's rank reading its slices from the files: the same model.
            let spec = fixtures().join(name);
            let mut read = cuda_files_tp_runner(spec.to_str().unwrap(), &m.config, 16, 2).unwrap();
            let ids = ids_of(&reference["cases"][0]["ids"]);
            let (a, b) = (all_logits(r.as_mut(), &ids), all_logits(read.as_mut(), &ids));
            assert!(rel_err(&b.data, &a.data) <= 1e-3, "{name}: read from its files over 2 GPUs");
            let config = &m.config;
            // Random routers have near ties anywhere, where bf16 sums over two GPUs may pick
            // another expert: the dummy split of MoE models is held exactly on the CPU (above).
            if config.moe.is_none() {
                let ids: Vec<u32> = (0..40u32).map(|t| (t * 37 + 5) % config.vocab_size as u32).collect();
                let one = all_logits(dummy_runner(DeviceKind::Cuda, config, 16, 1).unwrap().as_mut(), &ids);
                let two = all_logits(dummy_runner(DeviceKind::Cuda, config, 16, 2).unwrap().as_mut(), &ids);
                let err = rel_err(&two.data, &one.data);
                assert!(err <= 2e-2, "{name}: dummy weights over 2 GPUs {err:e} from one");
            }
            if let Some(greedy) = reference["greedy"].as_array() {
                let cases: Vec<(Vec<u32>, Vec<u32>, Option<usize>)> = greedy
                    .iter()
                    .map(|c| (ids_of(&c["prompt"]), ids_of(&c["output"]), first_route_tie(&c["route_gaps"])))
                    .collect();
                let e = Engine::start(cuda_tp_runner(&m, 64, 2).unwrap(), m.tokenizer.clone(), EngineConfig::default());
                check_engine_greedy_rounds(DeviceKind::Cuda, &m, &e, &cases, &format!("{name} over 2 GPUs"));
            }
        }
    }
}

/// The 70B shape of the tensor-parallel benchmarks (examples/configs/llama3-70b.json) has
/// Llama-3-70B's published size, 70.6 B parameters, and splits over 2, 4 and 8 GPUs.
#[test]
fn the_70b_example_shape_has_its_published_size_and_splits() {
    let path = fixtures().join("../../examples/configs/llama3-70b.json");
    let c = cachet_backend::config::ModelConfig::from_hf_json(&path).unwrap();
    let p = c.num_parameters() as f64;
    assert!((p / 70.6e9 - 1.0).abs() < 0.01, "{p:e} parameters");
    for n in [2, 4, 8] {
        cachet_backend::shard::check(&c, n).unwrap();
    }
}

/// Every fixture's files (HF safetensors, GGUF with llama.cpp's q/k row order, quantized GGUF,
/// stacked and per-expert MoE layouts) and the ranks they split over.
fn sharded_files() -> Vec<(std::path::PathBuf, Vec<usize>)> {
    let mut files: Vec<_> = MODELS
        .iter()
        .map(|(name, splits)| (fixtures().join(name), splits.to_vec()))
        .collect();
    files.push((fixtures().join("tiny-mixtral.gguf"), vec![2]));
    // FP8 checkpoints, scaled per channel and per block (read whole and cut: the scales index
    // the whole tensor).
    files.push((fixtures().join("tiny-qwen3-fp8-channel"), vec![2]));
    files.push((fixtures().join("tiny-qwen3-fp8-block"), vec![2]));
    files.push((fixtures().join("tiny-qwen3-moe.gguf"), vec![2, 4]));
    files.push((smollm2_path(), vec![3]));
    files
}

#[test]
fn a_ranks_slices_read_from_the_files_are_those_cut_from_the_whole_model() {
    for (path, splits) in sharded_files() {
        let spec = path.to_str().unwrap();
        let whole = cachet_backend::loader::load(spec, false).unwrap();
        for n in splits {
            for r in 0..n {
                let read = cachet_backend::loader::WeightReader::open(spec, Some((r, n)))
                    .and_then(|w| w.read_all(false))
                    .unwrap();
                let cut = cachet_backend::model::tensor_parallel::shard_weights(
                    &whole.weights.as_refs(),
                    &whole.config,
                    r,
                    n,
                );
                assert!(
                    read == cut,
                    "{spec}: rank {r} of {n} read differs from its cut"
                );
                // Vocabulary-parallel: a rank holds its block of the embedding's rows.
                let block = split(whole.config.vocab_size, r, n);
                assert_eq!(
                    read.embed.shape[0],
                    block.len(),
                    "{spec}: rank {r}'s embedding"
                );
            }
        }
    }
}

/// The bytes of `tensor`'s rows `rows` (all columns) or of its columns `cols` (all rows) in an
/// f32 safetensors file, overwritten with NaN.
fn poison(
    bytes: &mut [u8],
    tensor: &str,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header[tensor];
    assert_eq!(t["dtype"], "F32", "{tensor}");
    let width = t["shape"][1].as_u64().unwrap() as usize;
    let start = 8 + n + t["data_offsets"][0].as_u64().unwrap() as usize;
    for row in rows {
        for col in cols.clone() {
            let at = start + (row * width + col) * 4;
            bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        }
    }
}

#[test]
fn a_rank_reads_none_of_the_other_ranks_slices() {
    // tiny-gqa-llama3 (6 heads of 12, 2 KV heads, 200 hidden units) over 2 ranks, with every
    // slice of layer 0 that rank 0 does not hold turned to NaN in a copy of its file: rank 0
    // still gets its slices exactly (it never decodes the others), the whole model does not.
    let src = fixtures().join("tiny-gqa-llama3");
    let dir = std::env::temp_dir().join(format!("cachet-shard-read-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let l = "model.layers.0";
    poison(
        &mut bytes,
        &format!("{l}.self_attn.q_proj.weight"),
        36..72,
        0..72,
    );
    poison(
        &mut bytes,
        &format!("{l}.self_attn.k_proj.weight"),
        12..24,
        0..72,
    );
    poison(
        &mut bytes,
        &format!("{l}.self_attn.v_proj.weight"),
        12..24,
        0..72,
    );
    poison(
        &mut bytes,
        &format!("{l}.self_attn.o_proj.weight"),
        0..72,
        36..72,
    );
    poison(
        &mut bytes,
        &format!("{l}.mlp.gate_proj.weight"),
        100..200,
        0..72,
    );
    poison(
        &mut bytes,
        &format!("{l}.mlp.up_proj.weight"),
        100..200,
        0..72,
    );
    poison(
        &mut bytes,
        &format!("{l}.mlp.down_proj.weight"),
        0..72,
        100..200,
    );
    poison(&mut bytes, "lm_head.weight", 156..311, 0..72);
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    let spec = dir.to_str().unwrap();
    let original = cachet_backend::loader::load(src.to_str().unwrap(), false).unwrap();
    let want = cachet_backend::model::tensor_parallel::shard_weights(
        &original.weights.as_refs(),
        &original.config,
        0,
        2,
    );
    let read = cachet_backend::loader::WeightReader::open(spec, Some((0, 2)))
        .and_then(|w| w.read_all(false))
        .unwrap();
    let poisoned = cachet_backend::loader::load(spec, false).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(read == want, "rank 0's slices read from the poisoned file");
    assert!(
        poisoned.weights.layers[0]
            .qkv
            .data
            .iter()
            .any(|v| v.is_nan()),
        "the poison is in the file"
    );
}

#[test]
fn the_ranks_all_reduces_are_timed_together_and_leave_the_model_serving() {
    // `bench forward` adds a split step's all-reduces, timed on their own, to its floor.
    let m = tiny("tiny-qwen2");
    let mut r = tp_runner(&m, 16, 2).unwrap();
    let secs = r.time_all_reduce(4 * m.config.hidden_size, 8).unwrap();
    assert!(secs.is_some_and(|s| s > 0.0), "{secs:?}");
    let mut whole = device_runner(DeviceKind::Cpu, &m, 16);
    assert_eq!(
        whole.time_all_reduce(64, 8).unwrap(),
        None,
        "one device: nothing to time"
    );
    let ids = [3, 17, 250, 9];
    let want = all_logits(whole.as_mut(), &ids);
    let got = all_logits(r.as_mut(), &ids);
    assert!(rel_err(&got.data, &want.data) <= 1e-5);
}

#[test]
fn a_model_uploaded_as_it_is_read_gives_the_loaded_models_logits() {
    // `cachet serve` reads a model's tensors as it uploads them (one layer on the host at a
    // time): the same logits as the model loaded whole, for HF and GGUF files, whole and split.
    for (path, n) in [
        (fixtures().join("tiny-qwen2"), 2),
        (fixtures().join("tiny-gemma3"), 2),
        (fixtures().join("tiny-qwen3-moe.gguf"), 2),
        (smollm2_path(), 3),
    ] {
        let spec = path.to_str().unwrap();
        let m = cachet_backend::loader::load(spec, false).unwrap();
        let ids: Vec<u32> = [3u32, 17, 250, 9, 41]
            .iter()
            .map(|&t| t % m.config.vocab_size as u32)
            .collect();
        let want = all_logits(device_runner(DeviceKind::Cpu, &m, 16).as_mut(), &ids);
        for ranks in [1, n] {
            let got = all_logits(
                files_tp_runner(spec, &m.config, 16, ranks)
                    .unwrap()
                    .as_mut(),
                &ids,
            );
            let err = rel_err(&got.data, &want.data);
            let tol = if ranks == 1 { 0.0 } else { 1e-5 };
            assert!(err <= tol, "{spec} over {ranks}: {err:e}");
        }
    }
}
