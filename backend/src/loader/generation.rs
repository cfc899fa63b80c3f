//! An HF model's `generation_config.json`: the ids that end a turn (often more than
//! `config.json`'s one: Llama 3.1 Instruct's `<|eom_id|>` and `<|eot_id|>`, Qwen2.5's
//! `<|im_end|>` and `<|endoftext|>`) and the sampling its authors recommend, which requests
//! that do not set a value get (as vLLM's `--generation-config auto`).

use std::path::Path;

use crate::error::LoadError;
use crate::sampler::SamplingParams;

/// Which sampling values a request set itself (those keep the request's).
#[derive(Debug, Clone, Copy, Default)]
pub struct Given {
    pub temperature: bool,
    pub top_p: bool,
    pub top_k: bool,
    pub min_p: bool,
    pub repetition_penalty: bool,
}

/// What `generation_config.json` says (everything optional; no file: nothing).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// `dir/generation_config.json`, or the default when there is none.
    pub fn of_dir(dir: &Path) -> Result<Self, LoadError> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(Self::default());
        }
        let text = std::fs::read_to_string(&path).map_err(|e| LoadError::io(&path, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| LoadError::Json {
                path: path.clone(),
                source,
            })?;
        let eos_token_ids = match v.get("eos_token_id") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Number(n)) => vec![id(&path, n.as_u64())?],
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|x| id(&path, x.as_u64()))
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(LoadError::format(
                    &path,
                    format!("eos_token_id: an id or a list of ids, not {other}"),
                ))
            }
        };
        let num = |k: &str| -> Result<Option<f64>, LoadError> {
            match v.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| LoadError::format(&path, format!("{k}: a number, not {x}"))),
            }
        };
        Ok(GenerationConfig {
            eos_token_ids,
            temperature: num("temperature")?.map(|x| x as f32),
            top_p: num("top_p")?.map(|x| x as f32),
            top_k: num("top_k")?.map(|x| x as i64),
            min_p: num("min_p")?.map(|x| x as f32),
            repetition_penalty: num("repetition_penalty")?.map(|x| x as f32),
        })
    }

    /// Its values in `s` where the request gave none of its own (`given`).
    pub fn fill(&self, s: &mut SamplingParams, given: Given) {
        if let (false, Some(t)) = (given.temperature, self.temperature) {
            s.temperature = t.max(0.0);
        }
        if let (false, Some(p)) = (given.top_p, self.top_p) {
            s.top_p = p.clamp(0.0, 1.0);
        }
        if let (false, Some(k)) = (given.top_k, self.top_k) {
            s.top_k = usize::try_from(k).unwrap_or(0);
        }
        if let (false, Some(p)) = (given.min_p, self.min_p) {
            s.min_p = p.clamp(0.0, 1.0);
        }
        if let (false, Some(r)) = (given.repetition_penalty, self.repetition_penalty) {
            if r > 0.0 {
                s.repetition_penalty = r;
            }
        }
    }

    /// Whether it recommends any sampling value.
    pub fn has_sampling(&self) -> bool {
        self.temperature.is_some()
            || self.top_p.is_some()
            || self.top_k.is_some()
            || self.min_p.is_some()
            || self.repetition_penalty.is_some()
    }
}

fn id(path: &Path, v: Option<u64>) -> Result<u32, LoadError> {
    v.and_then(|x| u32::try_from(x).ok())
        .ok_or_else(|| LoadError::format(path, "eos_token_id: token ids are whole numbers"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eos_lists_and_sampling_defaults_are_read() {
        let dir = std::env::temp_dir().join(format!("cachet-genconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            GenerationConfig::of_dir(&dir).unwrap(),
            GenerationConfig::default()
        );
        // Llama 3.1 8B Instruct's file.
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
                "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"}"#,
        )
        .unwrap();
        let g = GenerationConfig::of_dir(&dir).unwrap();
        assert_eq!(g.eos_token_ids, [128001, 128008, 128009]);
        assert_eq!(
            (g.temperature, g.top_p, g.top_k),
            (Some(0.6), Some(0.9), None)
        );
        assert!(g.has_sampling());
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"eos_token_id": "x"}"#,
        )
        .unwrap();
        let e = GenerationConfig::of_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("eos_token_id"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The model's recommended values fill what a request left unset; a request's own values
    /// win; without a generation config nothing changes.
    #[test]
    fn generation_config_values_are_defaults_a_request_overrides() {
        let g = GenerationConfig {
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: Some(20),
            repetition_penalty: Some(1.05),
            ..Default::default()
        };
        let given = Given {
            temperature: true,
            ..Default::default()
        };
        let mut s = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        g.fill(&mut s, given);
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.repetition_penalty),
            (0.0, 0.95, 20, 1.05)
        );
        let before = SamplingParams::default();
        let mut s = before.clone();
        GenerationConfig::default().fill(&mut s, given);
        assert_eq!(s, before);
    }

    /// An HF directory's end-of-turn ids are config.json's and generation_config.json's.
    #[test]
    fn a_directory_stops_at_every_end_of_turn_id() {
        let dir = std::env::temp_dir().join(format!("cachet-genconfig-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-qwen3/config.json");
        std::fs::copy(&fixture, dir.join("config.json")).unwrap();
        let before = crate::loader::load_meta(dir.to_str().unwrap()).unwrap();
        let first = before.config.eos_token_ids.clone();
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"eos_token_id": [7, 9], "top_k": 20}"#,
        )
        .unwrap();
        let m = crate::loader::load_meta(dir.to_str().unwrap()).unwrap();
        let mut want = first.clone();
        want.extend([7, 9].into_iter().filter(|i| !first.contains(i)));
        assert_eq!(m.config.eos_token_ids, want);
        assert_eq!(m.generation.top_k, Some(20));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
