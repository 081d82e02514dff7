//! Memory-mapped GGUF reader: header, metadata key/values and tensor views.
//!
//! Layout follows the GGUF specification (ggml `docs/gguf.md`, versions 2 and 3; little-endian):
//!
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count × (key: string, value_type: u32, value)
//! tensor_count × (name: string, n_dims: u32, dims: n_dims × u64, type: u32, offset: u64)
//! padding to general.alignment (default 32)
//! tensor data; each tensor at data_start + offset, offset a multiple of the alignment
//! ```
//! where `string` is `len: u64` followed by `len` UTF-8 bytes. Every read is bounds-checked
//! against the file length, and every tensor's byte range is checked when the file is opened, so
//! a truncated or corrupt file gives a [`GgufError`] instead of a panic or a SIGBUS.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::Path;

use dsp::GgmlType;
use memmap2::Mmap;

pub use crate::error::GgufError;

/// ggml's `GGML_MAX_DIMS`.
pub(crate) const MAX_DIMS: u32 = 4;
/// Alignment of tensor data when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of metadata arrays we accept (real files use depth 1).
const MAX_ARRAY_DEPTH: usize = 4;
const MAGIC: &[u8; 4] = b"GGUF";

// === MetaValue ===

/// One GGUF metadata value. Type ids: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool,
/// 8 string, 9 array, 10 u64, 11 i64, 12 f64.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The GGUF name of the value's type (`"u32"`, `"string"`, `"array"`, ...), for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F32(_) => "f32",
            Self::F64(_) => "f64",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
        }
    }

    /// The value as an `i128` if it is any integer type (lossless for all of them).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(v) => v.into(),
            Self::I8(v) => v.into(),
            Self::U16(v) => v.into(),
            Self::I16(v) => v.into(),
            Self::U32(v) => v.into(),
            Self::I32(v) => v.into(),
            Self::U64(v) => v.into(),
            Self::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as an `f64` if it is a float (f32 widened exactly).
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Array(items) => match items.first() {
                Some(first) => format!("array of {} ({} items)", first.type_name(), items.len()),
                None => "empty array".to_string(),
            },
            v => v.type_name().to_string(),
        }
    }
}

// === TensorInfo / TensorView ===

/// A tensor's entry in the GGUF tensor table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order: `dims[0]` is the contiguous (row) length in elements.
    pub dims: Vec<u64>,
    /// Absolute byte offset of the data in the file.
    pub file_offset: u64,
    /// Size of the data in bytes (`n_elements / block_size * type_size`).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of `dims`).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A borrowed view of one tensor's bytes inside the mapped file.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// GGUF order: `dims[0]` is the contiguous (row) length in elements.
    pub dims: Vec<u64>,
    /// The raw (possibly quantized) data, `n_bytes` long, in ggml block layout.
    pub data: &'a [u8],
}

// === GgufFile ===

/// An opened, validated, memory-mapped GGUF file.
pub struct GgufFile {
    mmap: Mmap,
    version: u32,
    alignment: u64,
    metadata: BTreeMap<String, MetaValue>,
    /// Each metadata entry's key and byte range (key, type, value) in the file, in file order;
    /// what [`crate::writer`] copies verbatim.
    kv_spans: Vec<(String, std::ops::Range<usize>)>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("file_bytes", &self.file_bytes())
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps the file at `path` and parses and validates its header, metadata and tensor table.
    ///
    /// Errors: [`GgufError::Io`] if it cannot be opened or mapped, [`GgufError::IsDirectory`],
    /// and the format errors
    /// listed on [`GgufError`] (bad magic, version other than 2 or 3, truncation, unknown tensor
    /// types, misaligned or out-of-file tensor data, duplicate names).
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        if file.metadata().map_err(io)?.is_dir() {
            return Err(GgufError::IsDirectory { path: path.to_path_buf() });
        }
        let mmap = map_readonly(&file).map_err(io)?;
        Self::parse(mmap)
    }

    /// Parses and validates a GGUF held in memory (`bytes`, the whole file), as [`Self::open`]
    /// does a file: the bytes are copied into an anonymous read-only mapping. Used by the fuzz
    /// targets (`fuzz/`) and anything that has a GGUF in memory rather than on disk.
    ///
    /// Errors: [`GgufError::Io`] (path `<memory>`) if the mapping cannot be made; otherwise the
    /// format errors of [`Self::open`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: "<memory>".into(),
            source,
        };
        let mut anon = memmap2::MmapMut::map_anon(bytes.len()).map_err(io)?;
        anon.copy_from_slice(bytes);
        Self::parse(anon.make_read_only().map_err(io)?)
    }

    fn parse(mmap: Mmap) -> Result<Self, GgufError> {
        let buf: &[u8] = &mmap;
        let file_bytes = buf.len() as u64;
        let mut r = Reader { buf, pos: 0 };

        let magic = r.bytes(4, || "magic".into())?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                found: magic.escape_ascii().to_string(),
            });
        }
        let version = r.u32(|| "version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion { version });
        }
        let n_tensors_offset = r.pos as u64;
        let n_tensors = r.u64(|| "tensor count".into())?;
        let n_kv_offset = r.pos as u64;
        let n_kv = r.u64(|| "metadata count".into())?;
        // Each KV needs at least 8 (key len) + 4 (type) bytes, each tensor info at least 8+4+4+8.
        r.check_fits(n_kv_offset, n_kv, 12, "metadata entries", || "metadata count".into())?;

        let mut metadata = BTreeMap::new();
        let mut kv_spans = Vec::with_capacity(n_kv as usize);
        for i in 0..n_kv {
            let start = r.pos;
            let key = r.string(|| format!("metadata key #{i}"))?;
            let type_id = r.u32(|| format!("type of metadata key {key:?}"))?;
            let value = r.value(&key, type_id, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(GgufError::DuplicateKey { key });
            }
            kv_spans.push((key, start..r.pos));
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_integer() {
                Some(a) if a > 0 && (a as u128).is_power_of_two() && a <= u32::MAX as i128 => {
                    a as u64
                }
                Some(a) => {
                    return Err(GgufError::InvalidAlignment {
                        alignment: a.clamp(0, u64::MAX as i128) as u64,
                    })
                }
                None => {
                    return Err(GgufError::WrongType {
                        key: "general.alignment".into(),
                        expected: "integer",
                        actual: v.describe(),
                    })
                }
            },
        };

        r.check_fits(n_tensors_offset, n_tensors, 24, "tensors", || "tensor count".into())?;
        let mut raw = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(|| format!("name of tensor #{i}"))?;
            let n_dims = r.u32(|| format!("n_dims of tensor {name:?}"))?;
            if n_dims > MAX_DIMS {
                return Err(GgufError::TooManyDims {
                    tensor: name,
                    n_dims,
                    max: MAX_DIMS,
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(r.u64(|| format!("dim {d} of tensor {name:?}"))?);
            }
            let type_id = r.u32(|| format!("type of tensor {name:?}"))?;
            let offset = r.u64(|| format!("offset of tensor {name:?}"))?;
            raw.push((name, dims, type_id, offset));
        }
        let data_start = align_up(r.pos as u64, alignment);

        let mut tensors = Vec::with_capacity(raw.len());
        let mut by_name = HashMap::with_capacity(raw.len());
        for (name, dims, type_id, offset) in raw {
            if by_name.contains_key(&name) {
                return Err(GgufError::DuplicateTensor { tensor: name });
            }
            let Some(ty) = GgmlType::from_id(type_id) else {
                return Err(GgufError::UnknownTensorType {
                    tensor: name,
                    type_id,
                    type_name: ggml_type_name(type_id),
                });
            };
            let n_bytes = tensor_bytes(&name, ty, &dims)?;
            if offset % alignment != 0 {
                return Err(GgufError::MisalignedTensor {
                    tensor: name,
                    offset,
                    alignment,
                });
            }
            let end = data_start
                .checked_add(offset)
                .and_then(|s| s.checked_add(n_bytes));
            match end {
                Some(end) if end <= file_bytes => {}
                _ => {
                    return Err(GgufError::Truncated {
                        tensor: name,
                        needed: end.unwrap_or(u64::MAX),
                        file_bytes,
                    })
                }
            }
            let file_offset = data_start + offset;
            by_name.insert(name.clone(), tensors.len());
            tensors.push(TensorInfo {
                name,
                ty,
                dims,
                file_offset,
                n_bytes,
            });
        }

        Ok(Self {
            mmap,
            version,
            alignment,
            metadata,
            kv_spans,
            tensors,
            by_name,
        })
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Size of the file in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.mmap.len() as u64
    }

    /// The whole mapped file. Tensor data lie at `TensorInfo::file_offset..+n_bytes`.
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// Alignment of tensor data in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// All metadata key/values, sorted by key.
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    /// Every metadata entry in file order: its key and its raw bytes (key string, type id and
    /// value, exactly as stored), for rewriting the file ([`crate::writer`]).
    pub(crate) fn raw_kvs(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.kv_spans
            .iter()
            .map(|(k, range)| (k.as_str(), &self.mmap[range.clone()]))
    }

    /// The metadata value under `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    /// `general.architecture` (e.g. `"llama"`). Errors: missing key or not a string.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// Looks up a tensor by name. Errors: [`GgufError::TensorNotFound`].
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        self.tensor_opt(name)
            .ok_or_else(|| GgufError::TensorNotFound {
                name: name.to_string(),
            })
    }

    /// Looks up a tensor by name; `None` if absent (e.g. an optional `output.weight`).
    pub fn tensor_opt(&self, name: &str) -> Option<TensorView<'_>> {
        let info = &self.tensors[*self.by_name.get(name)?];
        // Range validated against the file length in `parse`.
        let start = info.file_offset as usize;
        let data = &self.mmap[start..start + info.n_bytes as usize];
        Some(TensorView {
            name: &info.name,
            ty: info.ty,
            dims: info.dims.clone(),
            data,
        })
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.tensors.iter()
    }

    /// Number of tensors.
    pub fn n_tensors(&self) -> usize {
        self.tensors.len()
    }
}

// === typed metadata getters ===

fn wrong(key: &str, expected: &'static str, v: &MetaValue) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        actual: v.describe(),
    }
}

fn int_as<T: TryFrom<i128>>(
    key: &str,
    expected: &'static str,
    v: &MetaValue,
) -> Result<T, GgufError> {
    v.as_integer()
        .and_then(|i| T::try_from(i).ok())
        .ok_or_else(|| wrong(key, expected, v))
}

fn array<'a>(
    key: &str,
    expected: &'static str,
    v: &'a MetaValue,
) -> Result<&'a [MetaValue], GgufError> {
    match v {
        MetaValue::Array(items) => Ok(items),
        _ => Err(wrong(key, expected, v)),
    }
}

fn conv_u32(k: &str, v: &MetaValue) -> Result<u32, GgufError> {
    int_as(k, "integer fitting u32", v)
}
fn conv_u64(k: &str, v: &MetaValue) -> Result<u64, GgufError> {
    int_as(k, "integer fitting u64", v)
}
fn conv_i32(k: &str, v: &MetaValue) -> Result<i32, GgufError> {
    int_as(k, "integer fitting i32", v)
}
fn conv_f32(k: &str, v: &MetaValue) -> Result<f32, GgufError> {
    v.as_float()
        .map(|f| f as f32)
        .ok_or_else(|| wrong(k, "float", v))
}
fn conv_bool(k: &str, v: &MetaValue) -> Result<bool, GgufError> {
    match v {
        MetaValue::Bool(b) => Ok(*b),
        _ => Err(wrong(k, "bool", v)),
    }
}
fn conv_str<'a>(k: &str, v: &'a MetaValue) -> Result<&'a str, GgufError> {
    v.as_str().ok_or_else(|| wrong(k, "string", v))
}
fn conv_str_array<'a>(k: &str, v: &'a MetaValue) -> Result<Vec<&'a str>, GgufError> {
    array(k, "array of string", v)?
        .iter()
        .map(|e| e.as_str().ok_or_else(|| wrong(k, "array of string", v)))
        .collect()
}
fn conv_i32_array(k: &str, v: &MetaValue) -> Result<Vec<i32>, GgufError> {
    array(k, "array of integer", v)?
        .iter()
        .map(|e| int_as(k, "array of integer fitting i32", e))
        .collect()
}
fn conv_u32_array(k: &str, v: &MetaValue) -> Result<Vec<u32>, GgufError> {
    array(k, "array of integer", v)?
        .iter()
        .map(|e| int_as(k, "array of integer fitting u32", e))
        .collect()
}
fn conv_f32_array(k: &str, v: &MetaValue) -> Result<Vec<f32>, GgufError> {
    array(k, "array of float", v)?
        .iter()
        .map(|e| {
            e.as_float()
                .map(|f| f as f32)
                .ok_or_else(|| wrong(k, "array of float", v))
        })
        .collect()
}

macro_rules! getters {
    ($(#[$doc:meta] $name:ident, $opt:ident -> $ty:ty, $conv:ident;)*) => {
        impl GgufFile {
            $(
                #[$doc]
                /// Errors: [`GgufError::MissingKey`], or [`GgufError::WrongType`] if the value
                /// has another type or does not fit.
                pub fn $name(&self, key: &str) -> Result<$ty, GgufError> {
                    $conv(key, self.require(key)?)
                }

                #[$doc]
                /// `None` if the key is absent. A value present with another type also gives
                /// `None` (logged as a warning); use the non-`_opt` getter to get the error.
                pub fn $opt(&self, key: &str) -> Option<$ty> {
                    match $conv(key, self.get(key)?) {
                        Ok(x) => Some(x),
                        Err(e) => {
                            tracing::warn!("ignoring GGUF metadata: {e}");
                            None
                        }
                    }
                }
            )*
        }
    };
}

getters! {
    /// Any integer value that fits in `u32`.
    get_u32, get_u32_opt -> u32, conv_u32;
    /// Any integer value that fits in `u64`.
    get_u64, get_u64_opt -> u64, conv_u64;
    /// Any integer value that fits in `i32`.
    get_i32, get_i32_opt -> i32, conv_i32;
    /// An f32 or f64 value (f64 narrowed to f32).
    get_f32, get_f32_opt -> f32, conv_f32;
    /// A bool value.
    get_bool, get_bool_opt -> bool, conv_bool;
    /// A string value.
    get_str, get_str_opt -> &str, conv_str;
    /// An array of strings.
    get_str_array, get_str_array_opt -> Vec<&str>, conv_str_array;
    /// An array of integers that each fit in `i32`.
    get_i32_array, get_i32_array_opt -> Vec<i32>, conv_i32_array;
    /// An array of integers that each fit in `u32`.
    get_u32_array, get_u32_array_opt -> Vec<u32>, conv_u32_array;
    /// An array of floats (f32 or f64, narrowed to f32).
    get_f32_array, get_f32_array_opt -> Vec<f32>, conv_f32_array;
}

// === helpers ===

/// Maps `file` read-only.
#[allow(unsafe_code)]
fn map_readonly(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the mapping is read-only and every range we read from it is checked against its
    // length at open time. The remaining hazard is another process truncating or rewriting the
    // model file while it is mapped, which the worker's deployment rules out (model files are
    // immutable once installed).
    unsafe { Mmap::map(file) }
}

pub(crate) fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a).saturating_mul(a)
}

/// Byte size of a tensor of type `ty` and shape `dims`. Rows (`dims[0]`) must hold whole blocks.
pub(crate) fn tensor_bytes(name: &str, ty: GgmlType, dims: &[u64]) -> Result<u64, GgufError> {
    let bad = |reason| GgufError::BadShape {
        tensor: name.to_string(),
        ty,
        dims: dims.to_vec(),
        reason,
    };
    let row = dims.first().copied().unwrap_or(1);
    let block = ty.block_size() as u64;
    if row % block != 0 {
        return Err(bad("row length is not a multiple of the block size"));
    }
    let n = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("element count overflows u64"))?;
    (n / block)
        .checked_mul(ty.type_size() as u64)
        .ok_or_else(|| bad("byte size overflows u64"))
}

/// ggml's name for a type id, including types this build cannot load (`ggml.h` `ggml_type`).
pub fn ggml_type_name(id: u32) -> &'static str {
    match id {
        0 => "f32",
        1 => "f16",
        2 => "q4_0",
        3 => "q4_1",
        4 | 5 => "removed (q4_2/q4_3)",
        6 => "q5_0",
        7 => "q5_1",
        8 => "q8_0",
        9 => "q8_1",
        10 => "q2_K",
        11 => "q3_K",
        12 => "q4_K",
        13 => "q5_K",
        14 => "q6_K",
        15 => "q8_K",
        16 => "iq2_xxs",
        17 => "iq2_xs",
        18 => "iq3_xxs",
        19 => "iq1_s",
        20 => "iq4_nl",
        21 => "iq3_s",
        22 => "iq2_s",
        23 => "iq4_xs",
        24 => "i8",
        25 => "i16",
        26 => "i32",
        27 => "i64",
        28 => "f64",
        29 => "iq1_m",
        30 => "bf16",
        34 => "tq1_0",
        35 => "tq2_0",
        39 => "mxfp4",
        _ => "unknown",
    }
}

/// Bounds-checked little-endian reader over the mapped header.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn file_bytes(&self) -> u64 {
        self.buf.len() as u64
    }

    fn bytes(&mut self, n: usize, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::HeaderTruncated {
                what: what(),
                offset: self.pos as u64,
                needed: n as u64,
                file_bytes: self.file_bytes(),
            }),
        }
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let s = self.bytes(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Errors with [`GgufError::LengthExceedsFile`] if `len` items of at least `item_bytes`
    /// each (declared at `offset`) cannot fit in the bytes after the current position.
    fn check_fits(
        &self,
        offset: u64,
        len: u64,
        item_bytes: u64,
        unit: &'static str,
        what: impl FnOnce() -> String,
    ) -> Result<(), GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        let needed = len.saturating_mul(item_bytes);
        if needed > remaining {
            return Err(GgufError::LengthExceedsFile {
                what: what(),
                offset,
                len,
                unit,
                needed,
                remaining,
                file_bytes: self.file_bytes(),
            });
        }
        Ok(())
    }

    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let offset = self.pos as u64;
        let len = self.u64(|| format!("length of {}", what()))?;
        self.check_fits(offset, len, 1, "bytes", &what)?;
        let s = self.bytes(len as usize, &what)?;
        String::from_utf8(s.to_vec()).map_err(|_| GgufError::InvalidUtf8 { what: what() })
    }

    fn value(&mut self, key: &str, type_id: u32, depth: usize) -> Result<MetaValue, GgufError> {
        let what = || format!("value of metadata key {key:?}");
        Ok(match type_id {
            0 => MetaValue::U8(u8::from_le_bytes(self.array(what)?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => MetaValue::Bool(u8::from_le_bytes(self.array(what)?) != 0),
            8 => MetaValue::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        key: key.to_string(),
                        max_depth: MAX_ARRAY_DEPTH,
                    });
                }
                let elem_type = self.u32(|| format!("array element type of key {key:?}"))?;
                let offset = self.pos as u64;
                let count = self.u64(|| format!("array length of key {key:?}"))?;
                let min_bytes = match elem_type {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    _ => {
                        return Err(GgufError::UnknownValueType {
                            key: key.to_string(),
                            type_id: elem_type,
                        })
                    }
                };
                self.check_fits(offset, count, min_bytes, "elements", || {
                    format!("array under metadata key {key:?}")
                })?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(key, elem_type, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_string(),
                    type_id,
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_to_multiples() {
        assert_eq!(align_up(0, 32), 0);
        assert_eq!(align_up(1, 32), 32);
        assert_eq!(align_up(32, 32), 32);
        assert_eq!(align_up(33, 32), 64);
    }

    #[test]
    fn tensor_bytes_checks_blocks_and_overflow() {
        assert_eq!(
            tensor_bytes("t", GgmlType::Q4_1, &[576, 2]).ok(),
            Some(2 * 18 * 20)
        );
        assert!(matches!(
            tensor_bytes("t", GgmlType::Q4_1, &[33]),
            Err(GgufError::BadShape { .. })
        ));
        assert!(matches!(
            tensor_bytes("t", GgmlType::F32, &[u64::MAX, 2]),
            Err(GgufError::BadShape { .. })
        ));
    }
}
