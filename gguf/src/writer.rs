//! GGUF v3 writer: rewrites an opened GGUF file with extra metadata key/values and extra tensors
//! appended (used by `tandem-tools draft-vocab` to add a trimmed draft output matrix).
//!
//! Output layout (ggml `docs/gguf.md`, little-endian; the same as the reader's, see
//! [`crate::reader`]):
//!
//! ```text
//! magic "GGUF" | version 3 | tensor_count u64 | kv_count u64
//! the source's KV entries, byte for byte and in file order (minus replaced keys), then the new
//! the source's tensor infos in file order (minus replaced tensors), then the new
//! zero padding to the alignment
//! tensor data: the kept tensors in the source's data order, each at the next aligned offset
//! (so a packed source keeps its relative offsets), then the new tensors
//! ```
//! The alignment is the source's (`general.alignment`, default 32), whose KV is copied
//! unchanged. Versions 2 and 3 share this layout, so a v2 source is written as v3.
//!
//! Tensor data are streamed from the source's memory map and from the caller's borrowed chunks
//! through one buffered writer: nothing is held twice in memory. The file is written to
//! `OUT.tmp`, synced, read back with [`GgufFile::open`] and only then renamed to `OUT`; on an
//! error the temporary file is removed.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use dsp::GgmlType;

use crate::error::GgufError;
use crate::reader::{align_up, tensor_bytes, GgufFile, MetaValue, MAX_DIMS};

/// Written GGUF version.
const VERSION: u32 = 3;
/// Buffer of the output writer (large sequential writes).
const WRITE_BUFFER_BYTES: usize = 8 << 20;
/// Zero bytes for padding (the alignment never exceeds what `general.alignment` allows, but
/// padding is written in pieces of at most this size).
const ZEROS: [u8; 4096] = [0; 4096];

// === errors ===

/// Errors of [`write_with_additions`]. Each says what was added and what clashed or did not fit.
#[derive(Debug, thiserror::Error)]
pub enum GgufWriteError {
    /// A new key is already in the source and `replace` is off.
    #[error("metadata key {key:?} is already in the source file (set replace to overwrite it)")]
    KeyExists { key: String },
    /// A new tensor name is already in the source and `replace` is off.
    #[error("tensor {name:?} is already in the source file (set replace to overwrite it)")]
    TensorExists { name: String },
    /// The same key or tensor name appears twice among the additions.
    #[error("{what} {name:?} is added twice")]
    DuplicateAddition { what: &'static str, name: String },
    /// A new value cannot be written (an empty array has no element type; array elements must
    /// share one type).
    #[error("metadata key {key:?}: {reason}")]
    BadValue { key: String, reason: String },
    /// A new tensor's shape is invalid for its type (too many dims, rows not whole blocks).
    #[error("new tensor {name:?}: {source}")]
    TensorShape {
        name: String,
        #[source]
        source: GgufError,
    },
    /// A new tensor's data chunks do not add up to the size its type and dims need.
    #[error(
        "new tensor {name:?} ({ty} dims {dims:?}) needs {expected} bytes of data, got {actual}"
    )]
    TensorSize {
        name: String,
        ty: GgmlType,
        dims: Vec<u64>,
        expected: u64,
        actual: u64,
    },
    /// Creating, writing, syncing or renaming the output failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The written file does not parse back (a bug in this writer).
    #[error("the written file {path} does not read back: {source}")]
    Verify {
        path: PathBuf,
        #[source]
        source: GgufError,
    },
}

// === inputs / outputs ===

/// A tensor to add. Its data is the concatenation of `chunks` (e.g. rows borrowed from the
/// source's memory map), `n_elements / block_size × type_size` bytes in ggml block layout.
#[derive(Clone, Debug)]
pub struct NewTensor<'a> {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order: `dims[0]` is the contiguous (row) length in elements; at most 4 dims.
    pub dims: Vec<u64>,
    pub chunks: Vec<&'a [u8]>,
}

/// What to add to the source file.
#[derive(Clone, Debug, Default)]
pub struct Additions<'a> {
    /// New metadata, written after the source's in this order. Arrays must be non-empty with
    /// elements of one type.
    pub kvs: Vec<(String, MetaValue)>,
    /// New tensors, written after the source's in this order.
    pub tensors: Vec<NewTensor<'a>>,
    /// Drop source keys and tensors that have the names of additions (else such a clash is
    /// [`GgufWriteError::KeyExists`] / [`GgufWriteError::TensorExists`]).
    pub replace: bool,
}

/// What [`write_with_additions`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteSummary {
    /// Size of the output file in bytes.
    pub file_bytes: u64,
    /// Metadata entries and tensors in the output.
    pub n_kvs: usize,
    pub n_tensors: usize,
    /// Source keys and tensors dropped because an addition replaced them.
    pub replaced_kvs: Vec<String>,
    pub replaced_tensors: Vec<String>,
}

// === writer ===

/// Writes `src` with `add` appended to `out` (via `out` + `.tmp`, renamed when complete).
///
/// The source's KV entries are copied byte for byte in file order, its tensor infos in file
/// order with offsets recomputed by packing the data in the source's data order (identical
/// offsets for a packed source), its tensor data byte for byte.
///
/// Errors: name clashes ([`GgufWriteError::KeyExists`], [`GgufWriteError::TensorExists`],
/// [`GgufWriteError::DuplicateAddition`]), unwritable values or tensors
/// ([`GgufWriteError::BadValue`], [`GgufWriteError::TensorShape`],
/// [`GgufWriteError::TensorSize`]), I/O ([`GgufWriteError::Io`]) and a failed read-back
/// ([`GgufWriteError::Verify`]). Nothing is left at `out` or `out.tmp` on error (an existing
/// `out` is untouched).
pub fn write_with_additions(
    src: &GgufFile,
    out: &Path,
    add: &Additions<'_>,
) -> Result<WriteSummary, GgufWriteError> {
    let plan = Plan::new(src, add)?;
    let tmp = tmp_path(out);
    let result = plan
        .write(src, add, &tmp)
        .and_then(|()| verify(&tmp, plan.n_tensors()));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        GgufWriteError::Io {
            op: "renaming the temporary file to",
            path: out.to_path_buf(),
            source,
        }
    })?;
    let file_bytes = std::fs::metadata(out)
        .map_err(|source| GgufWriteError::Io {
            op: "reading the size of",
            path: out.to_path_buf(),
            source,
        })?
        .len();
    Ok(WriteSummary {
        file_bytes,
        n_kvs: plan.kvs.len(),
        n_tensors: plan.n_tensors(),
        replaced_kvs: plan.replaced_kvs,
        replaced_tensors: plan.replaced_tensors,
    })
}

/// `out` with `.tmp` appended to its file name.
pub fn tmp_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// One tensor of the output: its info and where its data comes from.
struct Entry {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    /// Offset relative to the start of the data section.
    offset: u64,
    n_bytes: u64,
    source: DataSource,
}

enum DataSource {
    /// Absolute byte offset in the source file.
    Source(u64),
    /// Index into `Additions::tensors`.
    New(usize),
}

/// The output laid out before anything is written.
struct Plan {
    /// Encoded KV section (raw source entries, then the new ones).
    kvs: Vec<Vec<u8>>,
    /// Tensors in info order; `data_order` gives the order of their data.
    entries: Vec<Entry>,
    data_order: Vec<usize>,
    alignment: u64,
    replaced_kvs: Vec<String>,
    replaced_tensors: Vec<String>,
}

impl Plan {
    fn new(src: &GgufFile, add: &Additions<'_>) -> Result<Self, GgufWriteError> {
        let new_keys = unique(add.kvs.iter().map(|(k, _)| k.as_str()), "metadata key")?;
        let new_names = unique(add.tensors.iter().map(|t| t.name.as_str()), "tensor")?;

        let mut kvs = Vec::new();
        let mut replaced_kvs = Vec::new();
        for (key, raw) in src.raw_kvs() {
            if new_keys.contains(key) {
                if !add.replace {
                    return Err(GgufWriteError::KeyExists {
                        key: key.to_string(),
                    });
                }
                replaced_kvs.push(key.to_string());
            } else {
                kvs.push(raw.to_vec());
            }
        }
        for (key, value) in &add.kvs {
            let mut buf = Vec::new();
            put_string(&mut buf, key);
            encode_value(key, value, &mut buf)?;
            kvs.push(buf);
        }

        let mut entries = Vec::new();
        let mut replaced_tensors = Vec::new();
        for t in src.tensors() {
            if new_names.contains(t.name.as_str()) {
                if !add.replace {
                    return Err(GgufWriteError::TensorExists {
                        name: t.name.clone(),
                    });
                }
                replaced_tensors.push(t.name.clone());
                continue;
            }
            entries.push(Entry {
                name: t.name.clone(),
                ty: t.ty,
                dims: t.dims.clone(),
                offset: 0,
                n_bytes: t.n_bytes,
                source: DataSource::Source(t.file_offset),
            });
        }
        let n_kept = entries.len();
        for (i, t) in add.tensors.iter().enumerate() {
            let shape_err = |source| GgufWriteError::TensorShape {
                name: t.name.clone(),
                source,
            };
            if t.dims.len() > MAX_DIMS as usize {
                return Err(shape_err(GgufError::TooManyDims {
                    tensor: t.name.clone(),
                    n_dims: t.dims.len() as u32,
                    max: MAX_DIMS,
                }));
            }
            let expected = tensor_bytes(&t.name, t.ty, &t.dims).map_err(shape_err)?;
            let actual: u64 = t.chunks.iter().map(|c| c.len() as u64).sum();
            if actual != expected {
                return Err(GgufWriteError::TensorSize {
                    name: t.name.clone(),
                    ty: t.ty,
                    dims: t.dims.clone(),
                    expected,
                    actual,
                });
            }
            entries.push(Entry {
                name: t.name.clone(),
                ty: t.ty,
                dims: t.dims.clone(),
                offset: 0,
                n_bytes: expected,
                source: DataSource::New(i),
            });
        }

        // Data order: kept tensors as the source stores them, then the new ones.
        let mut data_order: Vec<usize> = (0..entries.len()).collect();
        data_order[..n_kept].sort_by_key(|&i| match entries[i].source {
            DataSource::Source(off) => off,
            DataSource::New(_) => u64::MAX,
        });
        let alignment = src.alignment();
        let mut cursor = 0u64;
        for &i in &data_order {
            let e = &mut entries[i];
            e.offset = align_up(cursor, alignment);
            cursor = e.offset + e.n_bytes;
        }

        Ok(Self {
            kvs,
            entries,
            data_order,
            alignment,
            replaced_kvs,
            replaced_tensors,
        })
    }

    fn n_tensors(&self) -> usize {
        self.entries.len()
    }

    /// The header, KV section and tensor infos, unpadded.
    fn header(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for kv in &self.kvs {
            h.extend_from_slice(kv);
        }
        for e in &self.entries {
            put_string(&mut h, &e.name);
            h.extend_from_slice(&(e.dims.len() as u32).to_le_bytes());
            for d in &e.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&e.ty.id().to_le_bytes());
            h.extend_from_slice(&e.offset.to_le_bytes());
        }
        h
    }

    fn write(
        &self,
        src: &GgufFile,
        add: &Additions<'_>,
        path: &Path,
    ) -> Result<(), GgufWriteError> {
        let io = |op: &'static str| {
            move |source| GgufWriteError::Io {
                op,
                path: path.to_path_buf(),
                source,
            }
        };
        let file = File::create(path).map_err(io("creating"))?;
        let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
        let header = self.header();
        w.write_all(&header).map_err(io("writing"))?;
        let data_start = align_up(header.len() as u64, self.alignment);
        let mut pos = header.len() as u64;
        pad(&mut w, data_start - pos).map_err(io("writing"))?;
        pos = data_start;

        let bytes = src.bytes();
        for &i in &self.data_order {
            let e = &self.entries[i];
            pad(&mut w, data_start + e.offset - pos).map_err(io("writing"))?;
            match e.source {
                DataSource::Source(off) => {
                    // Range validated against the source's length when it was opened.
                    let range = off as usize..(off + e.n_bytes) as usize;
                    w.write_all(&bytes[range]).map_err(io("writing"))?;
                }
                DataSource::New(j) => {
                    for chunk in &add.tensors[j].chunks {
                        w.write_all(chunk).map_err(io("writing"))?;
                    }
                }
            }
            pos = data_start + e.offset + e.n_bytes;
        }
        let file = w.into_inner().map_err(|e| io("writing")(e.into_error()))?;
        file.sync_all().map_err(io("syncing"))?;
        Ok(())
    }
}

/// Opens the written file and checks its tensor count.
fn verify(path: &Path, n_tensors: usize) -> Result<(), GgufWriteError> {
    let verr = |source| GgufWriteError::Verify {
        path: path.to_path_buf(),
        source,
    };
    let back = GgufFile::open(path).map_err(verr)?;
    if back.n_tensors() != n_tensors {
        return Err(verr(GgufError::TensorNotFound {
            name: format!(
                "(read back {} tensors, wrote {n_tensors})",
                back.n_tensors()
            ),
        }));
    }
    Ok(())
}

/// The names as a set; errors on a repeat.
fn unique<'n>(
    names: impl Iterator<Item = &'n str>,
    what: &'static str,
) -> Result<HashSet<&'n str>, GgufWriteError> {
    let mut set = HashSet::new();
    for n in names {
        if !set.insert(n) {
            return Err(GgufWriteError::DuplicateAddition {
                what,
                name: n.to_string(),
            });
        }
    }
    Ok(set)
}

fn pad(w: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// GGUF value type id of `v` (see [`MetaValue`]).
fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

/// Appends `v`'s type id and value.
fn encode_value(key: &str, v: &MetaValue, buf: &mut Vec<u8>) -> Result<(), GgufWriteError> {
    buf.extend_from_slice(&type_id(v).to_le_bytes());
    encode_payload(key, v, buf)
}

/// Appends `v`'s value without its type id (array elements).
fn encode_payload(key: &str, v: &MetaValue, buf: &mut Vec<u8>) -> Result<(), GgufWriteError> {
    match v {
        MetaValue::U8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => buf.push(u8::from(*x)),
        MetaValue::String(s) => put_string(buf, s),
        MetaValue::Array(items) => {
            let Some(first) = items.first() else {
                return Err(GgufWriteError::BadValue {
                    key: key.to_string(),
                    reason: "an empty array has no element type to write".into(),
                });
            };
            let elem = type_id(first);
            if let Some(other) = items.iter().find(|x| type_id(x) != elem) {
                return Err(GgufWriteError::BadValue {
                    key: key.to_string(),
                    reason: format!(
                        "array elements must share one type: {} then {}",
                        first.type_name(),
                        other.type_name()
                    ),
                });
            }
            buf.extend_from_slice(&elem.to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            // Elements are bare payloads; a nested array's payload starts with its own
            // element type and count.
            for x in items {
                encode_payload(key, x, buf)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../device-worker/tests/fixtures/qwen35/tiny-qwen35-q8_0.gguf"
    );

    fn fixture() -> GgufFile {
        GgufFile::open(Path::new(FIXTURE)).expect("fixture opens")
    }

    /// Row `i` of a 2-D tensor's raw bytes.
    fn row<'a>(f: &'a GgufFile, name: &str, i: usize) -> &'a [u8] {
        let t = f.tensor(name).expect("tensor");
        let row_bytes = t.data.len() / t.dims[1] as usize;
        &t.data[i * row_bytes..(i + 1) * row_bytes]
    }

    fn first_offset(f: &GgufFile) -> u64 {
        f.tensors().map(|t| t.file_offset).min().unwrap_or(0)
    }

    #[test]
    fn round_trip_keeps_every_kv_and_tensor_and_adds_new_ones() {
        let src = fixture();
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out.gguf");
        let ids = MetaValue::Array(vec![MetaValue::U32(5), MetaValue::U32(2)]);
        let add = Additions {
            kvs: vec![
                ("test.ids".into(), ids.clone()),
                ("test.note".into(), MetaValue::String("hi".into())),
            ],
            tensors: vec![NewTensor {
                name: "test.rows.weight".into(),
                ty: GgmlType::Q8_0,
                dims: vec![64, 2],
                chunks: vec![
                    row(&src, "token_embd.weight", 5),
                    row(&src, "token_embd.weight", 2),
                ],
            }],
            replace: false,
        };
        let summary = write_with_additions(&src, &out, &add).expect("write");
        assert!(!tmp_path(&out).exists());
        let back = GgufFile::open(&out).expect("read back");
        assert_eq!(summary.file_bytes, back.file_bytes());
        assert_eq!(summary.n_tensors, src.n_tensors() + 1);
        assert_eq!(summary.n_kvs, src.metadata().len() + 2);
        assert_eq!(back.version(), 3);
        assert_eq!(back.alignment(), src.alignment());

        // Metadata: the source's, byte for byte and in order, then the new ones.
        let src_raw: Vec<_> = src.raw_kvs().collect();
        let back_raw: Vec<_> = back.raw_kvs().collect();
        assert_eq!(&back_raw[..src_raw.len()], &src_raw[..]);
        for (k, v) in src.metadata() {
            assert_eq!(back.get(k), Some(v), "key {k}");
        }
        assert_eq!(back.get("test.ids"), Some(&ids));
        assert_eq!(back.get_str("test.note").ok(), Some("hi"));

        // Tensors: same names, order, types, dims, bytes and relative offsets.
        let (s0, b0) = (first_offset(&src), first_offset(&back));
        for (s, b) in src.tensors().zip(back.tensors()) {
            assert_eq!((&s.name, s.ty, &s.dims), (&b.name, b.ty, &b.dims));
            assert_eq!(s.file_offset - s0, b.file_offset - b0, "{}", s.name);
            let (sv, bv) = (src.tensor(&s.name).unwrap(), back.tensor(&b.name).unwrap());
            assert!(sv.data == bv.data, "bytes of {}", s.name);
        }
        let t = back.tensor("test.rows.weight").expect("new tensor");
        assert_eq!((t.ty, t.dims.clone()), (GgmlType::Q8_0, vec![64, 2]));
        let expected = [
            row(&src, "token_embd.weight", 5),
            row(&src, "token_embd.weight", 2),
        ]
        .concat();
        assert!(t.data == &expected[..]);
    }

    #[test]
    fn no_additions_reproduce_a_packed_v3_source_byte_for_byte() {
        let src = fixture();
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out.gguf");
        write_with_additions(&src, &out, &Additions::default()).expect("write");
        let a = std::fs::read(FIXTURE).expect("read fixture");
        let b = std::fs::read(&out).expect("read copy");
        assert_eq!(a.len(), b.len());
        assert!(a == b, "the copy differs from the source");
    }

    #[test]
    fn every_value_type_round_trips() {
        let src = fixture();
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out.gguf");
        use MetaValue as M;
        let values = vec![
            M::U8(7),
            M::I8(-7),
            M::U16(700),
            M::I16(-700),
            M::U32(70_000),
            M::I32(-70_000),
            M::U64(1 << 40),
            M::I64(-(1 << 40)),
            M::F32(1.5),
            M::F64(-2.25),
            M::Bool(true),
            M::String("é".into()),
            M::Array(vec![M::String("a".into()), M::String("bc".into())]),
            M::Array(vec![
                M::Array(vec![M::U8(1), M::U8(2)]),
                M::Array(vec![M::I64(3)]),
            ]),
        ];
        let add = Additions {
            kvs: values
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("test.v{i}"), v.clone()))
                .collect(),
            ..Default::default()
        };
        write_with_additions(&src, &out, &add).expect("write");
        let back = GgufFile::open(&out).expect("read back");
        for (i, v) in values.iter().enumerate() {
            assert_eq!(back.get(&format!("test.v{i}")), Some(v), "value {i}");
        }
    }

    #[test]
    fn clashes_are_refused_unless_replace() {
        let src = fixture();
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out.gguf");
        let norm = vec![0u8; 64 * 4];
        let mut add = Additions {
            kvs: vec![("general.name".into(), MetaValue::String("renamed".into()))],
            tensors: vec![NewTensor {
                name: "output_norm.weight".into(),
                ty: GgmlType::F32,
                dims: vec![64],
                chunks: vec![&norm],
            }],
            replace: false,
        };
        assert!(matches!(
            write_with_additions(&src, &out, &add),
            Err(GgufWriteError::KeyExists { key }) if key == "general.name"
        ));
        add.kvs.clear();
        assert!(matches!(
            write_with_additions(&src, &out, &add),
            Err(GgufWriteError::TensorExists { name }) if name == "output_norm.weight"
        ));
        assert!(!out.exists());

        add.kvs = vec![("general.name".into(), MetaValue::String("renamed".into()))];
        add.replace = true;
        let summary = write_with_additions(&src, &out, &add).expect("replace");
        assert_eq!(summary.replaced_kvs, vec!["general.name".to_string()]);
        assert_eq!(
            summary.replaced_tensors,
            vec!["output_norm.weight".to_string()]
        );
        let back = GgufFile::open(&out).expect("read back");
        assert_eq!(back.n_tensors(), src.n_tensors());
        assert_eq!(back.metadata().len(), src.metadata().len());
        assert_eq!(back.get_str("general.name").ok(), Some("renamed"));
        assert!(back.tensor("output_norm.weight").unwrap().data == &norm[..]);
        let embd = |f: &GgufFile| f.tensor("token_embd.weight").unwrap().data.to_vec();
        assert_eq!(embd(&back), embd(&src));
    }

    #[test]
    fn bad_additions_are_refused_and_leave_no_file() {
        let src = fixture();
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out.gguf");
        std::fs::write(&out, b"keep").expect("write");
        let short = [0u8; 100];
        let tensor = |name: &str, ty, dims: Vec<u64>| NewTensor {
            name: name.into(),
            ty,
            dims,
            chunks: vec![&short[..]],
        };
        let cases: Vec<(Additions<'_>, &str)> = vec![
            (
                Additions {
                    tensors: vec![tensor("t", GgmlType::F32, vec![64])],
                    ..Default::default()
                },
                "TensorSize",
            ),
            (
                Additions {
                    tensors: vec![tensor("t", GgmlType::Q8_0, vec![33, 1])],
                    ..Default::default()
                },
                "TensorShape",
            ),
            (
                Additions {
                    tensors: vec![tensor("t", GgmlType::F32, vec![1, 1, 1, 1, 1])],
                    ..Default::default()
                },
                "TensorShape",
            ),
            (
                Additions {
                    kvs: vec![("a".into(), MetaValue::Array(vec![]))],
                    ..Default::default()
                },
                "BadValue",
            ),
            (
                Additions {
                    kvs: vec![(
                        "a".into(),
                        MetaValue::Array(vec![MetaValue::U32(1), MetaValue::I32(1)]),
                    )],
                    ..Default::default()
                },
                "BadValue",
            ),
            (
                Additions {
                    kvs: vec![
                        ("a".into(), MetaValue::U8(1)),
                        ("a".into(), MetaValue::U8(2)),
                    ],
                    ..Default::default()
                },
                "DuplicateAddition",
            ),
        ];
        for (add, want) in cases {
            let err = write_with_additions(&src, &out, &add).expect_err(want);
            assert!(format!("{err:?}").starts_with(want), "{want}: got {err:?}");
            assert_eq!(std::fs::read(&out).expect("read"), b"keep");
            assert!(!tmp_path(&out).exists());
        }
    }

    #[test]
    fn truncated_source_is_a_clear_error() {
        let bytes = std::fs::read(FIXTURE).expect("read fixture");
        let dir = tempfile::tempdir().expect("tempdir");
        let cut = dir.path().join("cut.gguf");
        std::fs::write(&cut, &bytes[..bytes.len() - 100]).expect("write");
        let err = GgufFile::open(&cut).expect_err("truncated file must not open");
        let GgufError::Truncated {
            tensor,
            needed,
            file_bytes,
        } = &err
        else {
            panic!("expected Truncated, got {err:?}");
        };
        assert_eq!(*file_bytes, bytes.len() as u64 - 100);
        assert!(*needed > *file_bytes);
        assert!(!tensor.is_empty());
        assert!(err.to_string().contains("truncated model file"), "{err}");
    }
}
