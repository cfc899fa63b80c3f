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

    /// The shard (path, bytes) holding tensor `name`.
    fn shard_of(&self, name: &str) -> Result<&(PathBuf, Mmap), LoadError> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor {
                path: self.shards.first().map(|s| s.0.clone()).unwrap_or_default(),
                name: name.into(),
            })?;
        Ok(&self.shards[i])
    }

    /// Reads `name` as f32; an FP8 weight (`X.weight`, e4m3) is dequantized with its scale
    /// (`X.weight_scale_inv` or `X.weight_scale`: one for the tensor, one per output row, or
    /// one per block of rows × columns).
    pub fn tensor(&self, name: &str) -> Result<HostTensor, LoadError> {
        let (path, mmap) = self.shard_of(name)?;
        match read_values(path, mmap, name)? {
            (t, false) => Ok(t),
            (codes, true) => {
                let scale = [format!("{name}_scale_inv"), format!("{name}_scale")]
                    .into_iter()
                    .find(|n| self.contains(n))
                    .ok_or_else(|| {
                        LoadError::format(
                            path,
                            format!(
                                "`{name}` is FP8 but has no `{name}_scale_inv` or `{name}_scale`"
                            ),
                        )
                    })?;
                let scale = self.tensor(&scale)?;
                dequantize_fp8(path, name, codes, &scale)
            }
        }
    }
}

impl SafetensorsDir {
    /// `part` of 2-D tensor `name` as f32, checked to be `expected` in whole, reading only the
    /// part's bytes from the mapped file (a tensor-parallel rank's slice: its rows are
    /// contiguous there, its columns a stride of each row). FP8 weights, whose scales index the
    /// whole tensor, are read whole and cut.
    pub fn tensor_part(
        &self,
        name: &str,
        expected: &[usize],
        part: &crate::device::Part<'_>,
    ) -> Result<HostTensor, LoadError> {
        let (path, mmap) = self.shard_of(name)?;
        let st = SafeTensors::deserialize(mmap).map_err(|e| safetensors_error(path, mmap, e))?;
        let view = st
            .tensor(name)
            .map_err(|e| LoadError::format(path, e.to_string()))?;
        if view.shape() != expected {
            return Err(LoadError::Shape {
                path: path.clone(),
                name: name.into(),
                got: view.shape().to_vec(),
                expected: expected.to_vec(),
            });
        }
        let elem = match view.dtype() {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            _ if expected.len() == 2 => {
                let whole = self.tensor(name)?;
                return Ok(part.cut(&whole));
            }
            other => return Err(unsupported(path, name, format!("{other:?}"))),
        };
        let cols = if expected.len() == 2 { expected[1] } else { 1 };
        let bytes = view.data();
        let mut data = Vec::with_capacity(part.shape(expected).iter().product());
        for r in part.rows {
            for row in r.clone() {
                let at = (row * cols + part.cols.start) * elem;
                let b = &bytes[at..at + part.cols.len() * elem];
                data.extend(decode(view.dtype(), b).expect("a dtype decoded above"));
            }
        }
        Ok(HostTensor::new(part.shape(expected), data))
    }
}

/// The tensor names of one safetensors file (`bytes`; `path` names it in errors).
pub fn shard_names(path: &Path, bytes: &[u8]) -> Result<Vec<String>, LoadError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| safetensors_error(path, bytes, e))?;
    Ok(st.names().into_iter().map(String::from).collect())
}

/// `codes` (a 2-D weight's e4m3 values) times `scale`: one value, one per row (`[rows]` or
/// `[rows, 1]`), or one per block (`[⌈rows/br⌉, ⌈cols/bc⌉]`, the block sizes those imply).
fn dequantize_fp8(
    path: &Path,
    name: &str,
    mut codes: HostTensor,
    scale: &HostTensor,
) -> Result<HostTensor, LoadError> {
    let [rows, cols] = codes.shape[..] else {
        return Err(LoadError::format(
            path,
            format!("FP8 tensor `{name}` is not 2-D: {:?}", codes.shape),
        ));
    };
    let s = &scale.data;
    let dims: Vec<usize> = scale.shape.iter().copied().filter(|&d| d != 1).collect();
    // Row r's scales: `count` of them from `first(r)`, one per `bc` columns.
    type First = Box<dyn Fn(usize) -> usize>;
    let (first, count, bc): (First, usize, usize) = match (s.len(), dims.len()) {
        (1, _) => (Box::new(|_| 0), 1, cols),
        (n, 1) if n == rows => (Box::new(|r| r), 1, cols),
        (_, 2) if scale.shape.len() == 2 => {
            let (sr, sc) = (scale.shape[0], scale.shape[1]);
            let (br, bc) = (rows.div_ceil(sr), cols.div_ceil(sc));
            if rows.div_ceil(br) != sr || cols.div_ceil(bc) != sc {
                return Err(LoadError::format(
                    path,
                    format!("`{name}`: scale blocks {sr}×{sc} do not tile {rows}×{cols}"),
                ));
            }
            (Box::new(move |r| (r / br) * sc), sc, bc)
        }
        _ => {
            return Err(LoadError::format(
                path,
                format!(
                    "`{name}`: a scale of shape {:?} is not per tensor, per row or per block of {rows}×{cols}",
                    scale.shape
                ),
            ))
        }
    };
    for (r, row) in codes.data.chunks_exact_mut(cols).enumerate() {
        let at = first(r);
        for (block, &k) in row.chunks_mut(bc).zip(&s[at..at + count]) {
            block.iter_mut().for_each(|v| *v *= k);
        }
    }
    Ok(codes)
}

/// Reads tensor `name` of one safetensors file as f32 (an FP8 tensor is refused: its scale
/// lives in another tensor, which [`SafetensorsDir::tensor`] applies).
pub fn read_tensor(path: &Path, bytes: &[u8], name: &str) -> Result<HostTensor, LoadError> {
    match read_values(path, bytes, name)? {
        (t, false) => Ok(t),
        (_, true) => Err(unsupported(path, name, "F8_E4M3".into())),
    }
}

/// Tensor `name` of one safetensors file (one header parse) as f32 values, and whether they are
/// FP8 codes decoded without their scale.
fn read_values(path: &Path, bytes: &[u8], name: &str) -> Result<(HostTensor, bool), LoadError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| safetensors_error(path, bytes, e))?;
    let view = st
        .tensor(name)
        .map_err(|e| LoadError::format(path, e.to_string()))?;
    let data = decode(view.dtype(), view.data())
        .ok_or_else(|| unsupported(path, name, format!("{:?}", view.dtype())))?;
    let fp8 = view.dtype() == Dtype::F8_E4M3;
    Ok((
        HostTensor {
            shape: view.shape().to_vec(),
            data,
        },
        fp8,
    ))
}

/// `bytes` of `dtype` as f32 (e4m3 codes without their scale); `None` for another dtype.
/// Converted in chunks on rayon's threads: reading a mapped file from the page cache (or the
/// disk) and widening it is the load's work on the host, and one core does not keep up with a
/// GPU's upload.
fn decode(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    use rayon::prelude::*;
    let width = match dtype {
        Dtype::F32 => 4,
        Dtype::F16 | Dtype::BF16 => 2,
        Dtype::F8_E4M3 => 1,
        _ => return None,
    };
    let convert = |b: &[u8], out: &mut [f32]| match dtype {
        Dtype::F32 => out
            .iter_mut()
            .zip(b.chunks_exact(4))
            .for_each(|(o, b)| *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Dtype::F16 => out
            .iter_mut()
            .zip(b.chunks_exact(2))
            .for_each(|(o, b)| *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        Dtype::BF16 => out.iter_mut().zip(b.chunks_exact(2)).for_each(|(o, b)| {
            *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
        }),
        _ => out
            .iter_mut()
            .zip(b)
            .for_each(|(o, &c)| *o = crate::device::fp8::decode_e4m3(c)),
    };
    let mut out = vec![0f32; bytes.len() / width];
    // 1 MiB of output a task: large enough to amortise the task, small enough to spread a
    // projection over every core.
    const CHUNK: usize = 1 << 18;
    out.par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * width))
        .for_each(|(o, b)| convert(b, o));
    Some(out)
}

fn unsupported(path: &Path, name: &str, dtype: String) -> LoadError {
    LoadError::UnsupportedDtype {
        path: path.into(),
        tensor: name.into(),
        dtype,
        supported: "F32, F16, BF16, and F8_E4M3 weights with their scales",
    }
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
