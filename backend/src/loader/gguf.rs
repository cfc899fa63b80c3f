//! A native GGUF (v2/v3) reader: header, metadata, tensor directory, and dequantisation of
//! F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K tensors to f32.
//!
//! The file is memory-mapped (or given as bytes, [`GgufFile::from_bytes`]); every read and every
//! size computed from the file is checked, so a truncated or corrupt file gives
//! [`LoadError::Truncated`] / [`LoadError::Format`] instead of a panic (the `gguf` fuzz target
//! holds it to that). Tensors are converted once, when the model is loaded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;

use crate::error::LoadError;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }
}

/// ggml tensor element types that this reader can dequantise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    BF16,
}

const SUPPORTED: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

/// Elements of a K-quant super-block.
const QK_K: usize = 256;

/// A ggml tensor type this loader does not read: `Q2_K`…`Q5_K`'s ids are named, others numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", match .0 { 10..=15 => format!("Q{}_K", .0 - 8), id => format!("ggml type {id}") })]
pub struct UnsupportedGgmlType(pub u32);

impl GgmlType {
    /// The type of ggml id `id`, or the unsupported one it names.
    pub fn from_id(id: u32) -> Result<Self, UnsupportedGgmlType> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::BF16,
            other => return Err(UnsupportedGgmlType(other)),
        })
    }
    /// (elements per block, bytes per block)
    fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4K => (QK_K, 144),
            GgmlType::Q5K => (QK_K, 176),
            GgmlType::Q6K => (QK_K, 210),
        }
    }
}

/// A tensor's directory entry. `dims` is in ggml order: `dims[0]` varies fastest, so a
/// PyTorch `[rows, cols]` weight is stored as `dims = [cols, rows]`.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub dtype: Result<GgmlType, UnsupportedGgmlType>,
    pub offset: u64,
}

impl GgufTensorInfo {
    pub fn num_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Row-major shape (PyTorch order).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An open GGUF file.
pub struct GgufFile {
    path: PathBuf,
    /// The file's bytes: a read-only map, or bytes given to [`GgufFile::from_bytes`].
    bytes: Box<dyn AsRef<[u8]> + Send + Sync>,
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensorInfo>,
    data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], LoadError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| LoadError::Truncated {
                path: self.path.into(),
                what: what.into(),
                needed: (self.pos as u64).saturating_add(n as u64),
                available: self.buf.len() as u64,
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N], LoadError> {
        Ok(self.take(N, what)?.try_into().expect("length checked"))
    }
    fn u32(&mut self, what: &str) -> Result<u32, LoadError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, LoadError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    fn string(&mut self, what: &str) -> Result<String, LoadError> {
        let n = self.u64(what)?;
        let bytes = self.take(usize::try_from(n).unwrap_or(usize::MAX), what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| LoadError::format(self.path, format!("{what}: string is not UTF-8")))
    }
    fn value(&mut self, ty: u32, what: &str, depth: u32) -> Result<GgufValue, LoadError> {
        Ok(match ty {
            0 => GgufValue::U8(self.arr::<1>(what)?[0]),
            1 => GgufValue::I8(self.arr::<1>(what)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.arr(what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.arr(what)?)),
            4 => GgufValue::U32(self.u32(what)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.arr(what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.arr(what)?)),
            7 => GgufValue::Bool(self.arr::<1>(what)?[0] != 0),
            8 => GgufValue::String(self.string(what)?),
            9 => {
                if depth > 2 {
                    return Err(LoadError::format(
                        self.path,
                        format!("{what}: arrays nested too deep"),
                    ));
                }
                let ety = self.u32(what)?;
                let n = self.u64(what)?;
                // Every element takes at least one byte: a count beyond the file is corrupt.
                if n > (self.buf.len() - self.pos) as u64 {
                    return Err(LoadError::Truncated {
                        path: self.path.into(),
                        what: what.into(),
                        needed: (self.pos as u64).saturating_add(n),
                        available: self.buf.len() as u64,
                    });
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(ety, what, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.arr(what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.arr(what)?)),
            other => {
                return Err(LoadError::format(
                    self.path,
                    format!("{what}: unknown value type {other}"),
                ))
            }
        })
    }
}

impl GgufFile {
    /// Opens and parses the header, metadata and tensor directory (no tensor data is read).
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let file = std::fs::File::open(path).map_err(|e| LoadError::io(path, e))?;
        // SAFETY: the map is read-only and private to this process; a file changed underneath a
        // running process is outside what any loader can defend against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| LoadError::io(path, e))?;
        Self::parse(path, Box::new(mmap))
    }

    /// Parses a GGUF file held in memory; `path` names it in errors.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self, LoadError> {
        Self::parse(path, Box::new(bytes))
    }

    fn parse(path: &Path, bytes: Box<dyn AsRef<[u8]> + Send + Sync>) -> Result<Self, LoadError> {
        let mut c = Cursor {
            buf: (*bytes).as_ref(),
            pos: 0,
            path,
        };
        let magic = c.arr::<4>("GGUF magic")?;
        if &magic != MAGIC {
            return Err(LoadError::format(path, "not a GGUF file (bad magic)"));
        }
        let version = c.u32("GGUF version")?;
        if !(2..=3).contains(&version) {
            return Err(LoadError::format(
                path,
                format!("GGUF version {version} is not supported (2 or 3)"),
            ));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.u32(&key)?;
            let v = c.value(ty, &key, 0)?;
            metadata.insert(key, v);
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let nd = c.u32(&name)?;
            if nd > 4 {
                return Err(LoadError::format(
                    path,
                    format!("tensor `{name}` has {nd} dimensions (max 4)"),
                ));
            }
            let dims = (0..nd)
                .map(|_| c.u64(&name))
                .collect::<Result<Vec<_>, _>>()?;
            // No zero dimension and a product that fits: then every partial product, in any
            // order (shapes are reversed, split and multiplied all over the loader), fits too.
            if dims.contains(&0)
                || dims
                    .iter()
                    .try_fold(1u64, |n, &d| n.checked_mul(d))
                    .is_none()
            {
                return Err(LoadError::format(
                    path,
                    format!("tensor `{name}` has dimensions {dims:?}: a zero, or more elements than fit in 64 bits"),
                ));
            }
            let dtype = GgmlType::from_id(c.u32(&name)?);
            let offset = c.u64(&name)?;
            tensors.push(GgufTensorInfo {
                name,
                dims,
                dtype,
                offset,
            });
        }
        let align = metadata
            .get("general.alignment")
            .and_then(|v| v.as_u64())
            .unwrap_or(DEFAULT_ALIGNMENT);
        if align == 0 {
            return Err(LoadError::format(path, "general.alignment is 0"));
        }
        let data_offset = (c.pos as u64)
            .div_ceil(align)
            .checked_mul(align)
            .ok_or_else(|| {
                LoadError::format(path, format!("general.alignment {align} is absurd"))
            })?;
        Ok(GgufFile {
            path: path.into(),
            bytes,
            version,
            metadata,
            tensors,
            data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    fn required(&self, key: &str) -> Result<&GgufValue, LoadError> {
        self.get(key)
            .ok_or_else(|| LoadError::format(&self.path, format!("metadata lacks `{key}`")))
    }
    pub fn get_u64(&self, key: &str) -> Result<u64, LoadError> {
        self.required(key)?.as_u64().ok_or_else(|| {
            LoadError::format(&self.path, format!("metadata `{key}` is not an integer"))
        })
    }
    pub fn get_f64(&self, key: &str) -> Result<f64, LoadError> {
        self.required(key)?.as_f64().ok_or_else(|| {
            LoadError::format(&self.path, format!("metadata `{key}` is not a number"))
        })
    }
    pub fn get_str(&self, key: &str) -> Result<&str, LoadError> {
        self.required(key)?.as_str().ok_or_else(|| {
            LoadError::format(&self.path, format!("metadata `{key}` is not a string"))
        })
    }
    pub fn get_array(&self, key: &str) -> Result<&[GgufValue], LoadError> {
        self.required(key)?.as_array().ok_or_else(|| {
            LoadError::format(&self.path, format!("metadata `{key}` is not an array"))
        })
    }

    pub fn tensor_info(&self, name: &str) -> Result<&GgufTensorInfo, LoadError> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| LoadError::MissingTensor {
                path: self.path.clone(),
                name: name.into(),
            })
    }

    /// Reads one tensor, dequantised to f32, with its row-major shape.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), LoadError> {
        let info = self.tensor_info(name)?;
        let dtype = info.dtype.map_err(|dtype| LoadError::UnsupportedDtype {
            path: self.path.clone(),
            tensor: name.into(),
            dtype: dtype.to_string(),
            supported: SUPPORTED,
        })?;
        let n = info.num_elements();
        let (per_block, block_bytes) = dtype.block();
        if n % per_block as u64 != 0 {
            return Err(LoadError::format(
                &self.path,
                format!("tensor `{name}`: {n} elements is not a whole number of {per_block}-element blocks"),
            ));
        }
        let file = (*self.bytes).as_ref();
        let end = (n / per_block as u64)
            .checked_mul(block_bytes as u64)
            .and_then(|nbytes| {
                self.data_offset
                    .checked_add(info.offset)?
                    .checked_add(nbytes)
            })
            .unwrap_or(u64::MAX);
        if end > file.len() as u64 {
            return Err(LoadError::Truncated {
                path: self.path.clone(),
                what: format!("tensor `{name}`"),
                needed: end,
                available: file.len() as u64,
            });
        }
        let start = self.data_offset + info.offset; // no overflow: `end` is past it
        let bytes = &file[start as usize..end as usize];
        Ok((info.shape(), dequantize(dtype, bytes, n as usize)))
    }
}

impl GgufFile {
    /// `part` of 2-D tensor `name` (row-major shape `[rows, cols]`, checked to be `expected`),
    /// dequantising only its rows: a row is whole blocks in the file, so a rank's rows are read
    /// alone; its columns are cut from them. `None` where the tensor is not 2-D or its rows are
    /// not whole blocks (the caller reads it whole).
    pub fn tensor_f32_part(
        &self,
        name: &str,
        expected: &[usize],
        part: &crate::device::Part<'_>,
    ) -> Result<Option<Vec<f32>>, LoadError> {
        let info = self.tensor_info(name)?;
        let shape = info.shape();
        if shape != expected {
            return Err(LoadError::Shape {
                path: self.path.clone(),
                name: name.into(),
                got: shape,
                expected: expected.to_vec(),
            });
        }
        let Ok(dtype) = info.dtype else {
            return Ok(None);
        };
        let [rows, cols] = shape[..] else {
            return Ok(None);
        };
        let (per_block, block_bytes) = dtype.block();
        if cols % per_block != 0 {
            return Ok(None);
        }
        let row_bytes = cols / per_block * block_bytes;
        let file = (*self.bytes).as_ref();
        let start = (self.data_offset + info.offset) as usize;
        if start.saturating_add(rows * row_bytes) > file.len() {
            return Err(LoadError::Truncated {
                path: self.path.clone(),
                what: format!("tensor `{name}`"),
                needed: (start + rows * row_bytes) as u64,
                available: file.len() as u64,
            });
        }
        let mut out = Vec::with_capacity(part.shape(expected).iter().product());
        for r in part.rows {
            let bytes = &file[start + r.start * row_bytes..start + r.end * row_bytes];
            let values = dequantize(dtype, bytes, r.len() * cols);
            if part.cols == (0..cols) {
                out.extend(values);
            } else {
                for row in values.chunks_exact(cols) {
                    out.extend_from_slice(&row[part.cols.clone()]);
                }
            }
        }
        Ok(Some(out))
    }
}

/// Dequantises `n` elements of `dtype` from `bytes` (whose length the caller checked).
pub fn dequantize(dtype: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    let h = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
    match dtype {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(h)),
        GgmlType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        GgmlType::Q8_0 => {
            for blk in bytes.chunks_exact(34) {
                let d = h(&blk[0..2]);
                out.extend(blk[2..34].iter().map(|&q| q as i8 as f32 * d));
            }
        }
        GgmlType::Q4_0 => {
            for blk in bytes.chunks_exact(18) {
                let d = h(&blk[0..2]);
                let qs = &blk[2..18];
                out.extend(qs.iter().map(|&q| ((q & 0x0f) as i32 - 8) as f32 * d));
                out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
            }
        }
        GgmlType::Q4_1 => {
            for blk in bytes.chunks_exact(20) {
                let d = h(&blk[0..2]);
                let m = h(&blk[2..4]);
                let qs = &blk[4..20];
                out.extend(qs.iter().map(|&q| (q & 0x0f) as f32 * d + m));
                out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            // d (f16)[, m (f16)], 32 fifth bits (u32), 16 bytes of nibbles: element j takes the
            // low nibble of byte j and bit j, element j + 16 the high nibble and bit j + 16.
            let with_min = dtype == GgmlType::Q5_1;
            let size = if with_min { 24 } else { 22 };
            for blk in bytes.chunks_exact(size) {
                let d = h(&blk[0..2]);
                let (m, rest) = if with_min {
                    (h(&blk[2..4]), &blk[4..])
                } else {
                    (-16.0 * d, &blk[2..])
                };
                let qh = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
                let qs = &rest[4..20];
                let fifth = |j: usize| ((qh >> j) & 1) as u8;
                out.extend((0..16).map(|j| (qs[j] & 0x0f | fifth(j) << 4) as f32 * d + m));
                out.extend((0..16).map(|j| (qs[j] >> 4 | fifth(j + 16) << 4) as f32 * d + m));
            }
        }
        GgmlType::Q4K | GgmlType::Q5K => {
            // d, dmin (f16), 12 bytes of eight 6-bit (scale, min) pairs, [32 bytes of fifth
            // bits,] 128 bytes of nibbles; each 64 elements are two sub-blocks of 32: the low
            // then the high nibbles of 32 bytes.
            let five = dtype == GgmlType::Q5K;
            let size = if five { 176 } else { 144 };
            for blk in bytes.chunks_exact(size) {
                let (d, dmin) = (h(&blk[0..2]), h(&blk[2..4]));
                let scales = &blk[4..16];
                let (qh, qs) = if five {
                    (&blk[16..48], &blk[48..176])
                } else {
                    (&[][..], &blk[16..144])
                };
                for j in 0..4 {
                    let ql = &qs[32 * j..32 * j + 32];
                    for half in 0..2 {
                        let (sc, mn) = k_scale_min(2 * j + half, scales);
                        let (dd, mm) = (d * sc as f32, dmin * mn as f32);
                        let bit = 2 * j + half;
                        out.extend((0..32).map(|l| {
                            let nib = if half == 0 { ql[l] & 0x0f } else { ql[l] >> 4 };
                            let hi = if five { (qh[l] >> bit & 1) << 4 } else { 0 };
                            dd * (nib | hi) as f32 - mm
                        }));
                    }
                }
            }
        }
        GgmlType::Q6K => {
            // 128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8 scales (one per 16
            // elements), d (f16); two halves of 128 elements.
            for blk in bytes.chunks_exact(210) {
                let d = h(&blk[208..210]);
                let mut y = [0.0f32; QK_K];
                for half in 0..2 {
                    let ql = &blk[64 * half..64 * half + 64];
                    let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
                    let sc = &blk[192 + 8 * half..192 + 8 * half + 8];
                    let y = &mut y[128 * half..128 * half + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q = [
                            (ql[l] & 0x0f | (qh[l] & 3) << 4) as i32 - 32,
                            (ql[l + 32] & 0x0f | (qh[l] >> 2 & 3) << 4) as i32 - 32,
                            (ql[l] >> 4 | (qh[l] >> 4 & 3) << 4) as i32 - 32,
                            (ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4) as i32 - 32,
                        ];
                        for (k, &qv) in q.iter().enumerate() {
                            y[l + 32 * k] = d * (sc[is + 2 * k] as i8) as f32 * qv as f32;
                        }
                    }
                }
                out.extend_from_slice(&y);
            }
        }
    }
    assert_eq!(out.len(), n);
    out
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K super-block: the first four
/// pairs are the low 6 bits of bytes 0..4 and 4..8; the last four take their low 4 bits from
/// bytes 8..12 and their top 2 bits from the spare bits of bytes 0..8.
fn k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantizes_each_block_format() {
        let d = f16::from_f32(0.5).to_le_bytes();
        let m = f16::from_f32(-1.0).to_le_bytes();
        // Q4_0: (q - 8) * d; low nibbles are elements 0..16, high nibbles 16..32.
        let mut q40 = d.to_vec();
        q40.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        let x = dequantize(GgmlType::Q4_0, &q40, 32);
        assert_eq!(x[0], -4.0);
        assert_eq!(x[15], 3.5);
        assert_eq!(x[16], 3.5);
        assert_eq!(x[31], -4.0);
        // Q4_1: q * d + m
        let mut q41 = [d, m].concat();
        q41.extend((0..16u8).map(|i| i | (i << 4)));
        let x = dequantize(GgmlType::Q4_1, &q41, 32);
        assert_eq!((x[0], x[3], x[19]), (-1.0, 0.5, 0.5));
        // Q8_0: q * d
        let mut q8 = d.to_vec();
        q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let x = dequantize(GgmlType::Q8_0, &q8, 32);
        assert_eq!((x[0], x[16], x[31]), (-8.0, 0.0, 7.5));
        // F16, BF16, F32
        assert_eq!(
            dequantize(GgmlType::F16, &f16::from_f32(1.5).to_le_bytes(), 1),
            vec![1.5]
        );
        assert_eq!(
            dequantize(GgmlType::BF16, &bf16::from_f32(-2.0).to_le_bytes(), 1),
            vec![-2.0]
        );
        assert_eq!(
            dequantize(GgmlType::F32, &3.25f32.to_le_bytes(), 1),
            vec![3.25]
        );
    }
}
