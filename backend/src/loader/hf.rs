//! HF layout: `config.json` + `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`). Shards are memory-mapped; f32 / f16 / bf16 tensors are
//! converted to f32 once, when asked for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::HostTensor;
use crate::error::LoadError;

/// All safetensors shards of one model directory.
pub struct SafetensorsDir {
    shards: Vec<(PathBuf, Mmap)>,
    /// tensor name → index into `shards`
    index: BTreeMap<String, usize>,
}

impl SafetensorsDir {
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_path.exists() {
            let text =
                std::fs::read_to_string(&index_path).map_err(|e| LoadError::io(&index_path, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|source| LoadError::Json {
                    path: index_path.clone(),
                    source,
                })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| LoadError::format(&index_path, "no `weight_map` object"))?;
            let mut names: Vec<String> = map
                .values()
                .filter_map(|f| f.as_str().map(String::from))
                .collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            let single = dir.join("model.safetensors");
            if !single.exists() {
                return Err(LoadError::NotFound {
                    path: single,
                    hint: "an HF model directory needs model.safetensors or model.safetensors.index.json".into(),
                });
            }
            vec![single]
        };
        let mut shards = Vec::new();
        let mut index = BTreeMap::new();
        for path in files {
            let file = std::fs::File::open(&path).map_err(|e| LoadError::io(&path, e))?;
            // SAFETY: read-only private map; see gguf.rs.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| LoadError::io(&path, e))?;
            for n in shard_names(&path, &mmap)? {
                index.insert(n, shards.len());
            }
            shards.push((path, mmap));
        }
        Ok(SafetensorsDir { shards, index })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Reads `name` as f32.
    pub fn tensor(&self, name: &str) -> Result<HostTensor, LoadError> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor {
                path: self.shards.first().map(|s| s.0.clone()).unwrap_or_default(),
                name: name.into(),
            })?;
        let (path, mmap) = &self.shards[i];
        read_tensor(path, mmap, name)
    }
}

/// The tensor names of one safetensors file (`bytes`; `path` names it in errors).
pub fn shard_names(path: &Path, bytes: &[u8]) -> Result<Vec<String>, LoadError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| safetensors_error(path, bytes, e))?;
    Ok(st.names().into_iter().map(String::from).collect())
}

/// Reads tensor `name` of one safetensors file as f32.
pub fn read_tensor(path: &Path, bytes: &[u8], name: &str) -> Result<HostTensor, LoadError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| safetensors_error(path, bytes, e))?;
    let view = st
        .tensor(name)
        .map_err(|e| LoadError::format(path, e.to_string()))?;
    let bytes = view.data();
    let data: Vec<f32> = match view.dtype() {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(LoadError::UnsupportedDtype {
                path: path.into(),
                tensor: name.into(),
                dtype: format!("{other:?}"),
                supported: "F32, F16, BF16",
            })
        }
    };
    Ok(HostTensor {
        shape: view.shape().to_vec(),
        data,
    })
}

fn safetensors_error(path: &Path, bytes: &[u8], e: safetensors::SafeTensorError) -> LoadError {
    use safetensors::SafeTensorError as E;
    match e {
        E::MetadataIncompleteBuffer
        | E::HeaderTooSmall
        | E::InvalidOffset(_)
        | E::InvalidHeaderLength => LoadError::Truncated {
            path: path.into(),
            what: format!("safetensors data ({e})"),
            needed: declared_len(bytes).unwrap_or(8),
            available: bytes.len() as u64,
        },
        other => LoadError::format(path, format!("not a valid safetensors file: {other}")),
    }
}

/// The file length a safetensors header promises: 8 + header length + the largest data offset.
fn declared_len(bytes: &[u8]) -> Option<u64> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let header = bytes.get(8..8usize.checked_add(usize::try_from(n).ok()?)?);
    let Some(header) = header else {
        return Some(n.saturating_add(8));
    };
    let v: serde_json::Value = serde_json::from_slice(header).ok()?;
    let end = v
        .as_object()?
        .values()
        .filter_map(|t| t.get("data_offsets")?.as_array()?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    Some(n.saturating_add(8).saturating_add(end))
}
