//! A minimal GGUF writer for synthetic test files (every value type, tensors of any type,
//! and deliberately broken layouts for the reader's error paths).

/// A metadata value to write.
#[derive(Clone, Debug)]
pub enum Val {
    U8(u8),
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    I32Arr(Vec<i32>),
    F32Arr(Vec<f32>),
}

/// A tensor to write: name, GGUF dims, ggml type id, data bytes, optional forced offset.
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
    pub offset: Option<u64>,
}

/// Writes GGUF bytes (little-endian) following ggml `docs/gguf.md`.
#[derive(Clone, Debug)]
pub struct GgufBuilder {
    pub magic: [u8; 4],
    pub version: u32,
    pub alignment: u64,
    pub kvs: Vec<(String, Val)>,
    pub tensors: Vec<RawTensor>,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        Self {
            magic: *b"GGUF",
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

/// The value type of a GGUF array (9), its element type and its length (u64).
fn put_array_header(out: &mut Vec<u8>, elem_type: u32, len: usize) {
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&elem_type.to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl GgufBuilder {
    pub fn kv(mut self, key: &str, v: Val) -> Self {
        self.kvs.push((key.to_string(), v));
        self
    }

    /// Adds an f32 tensor of `dims` filled with `0.0, 1.0, 2.0, ...`.
    pub fn f32_tensor(mut self, name: &str, dims: &[u64]) -> Self {
        let n: u64 = dims.iter().product();
        let data = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
        self.tensors.push(RawTensor {
            name: name.into(),
            dims: dims.to_vec(),
            type_id: 0,
            data,
            offset: None,
        });
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            match v {
                Val::U8(x) => {
                    out.extend_from_slice(&0u32.to_le_bytes());
                    out.push(*x);
                }
                Val::U32(x) => {
                    out.extend_from_slice(&4u32.to_le_bytes());
                    out.extend_from_slice(&x.to_le_bytes());
                }
                Val::I32(x) => {
                    out.extend_from_slice(&5u32.to_le_bytes());
                    out.extend_from_slice(&x.to_le_bytes());
                }
                Val::F32(x) => {
                    out.extend_from_slice(&6u32.to_le_bytes());
                    out.extend_from_slice(&x.to_le_bytes());
                }
                Val::Bool(x) => {
                    out.extend_from_slice(&7u32.to_le_bytes());
                    out.push(*x as u8);
                }
                Val::Str(s) => {
                    out.extend_from_slice(&8u32.to_le_bytes());
                    put_str(&mut out, s);
                }
                Val::U64(x) => {
                    out.extend_from_slice(&10u32.to_le_bytes());
                    out.extend_from_slice(&x.to_le_bytes());
                }
                Val::StrArr(a) => {
                    put_array_header(&mut out, 8, a.len());
                    for s in a {
                        put_str(&mut out, s);
                    }
                }
                Val::I32Arr(a) => {
                    put_array_header(&mut out, 5, a.len());
                    a.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
                }
                Val::F32Arr(a) => {
                    put_array_header(&mut out, 6, a.len());
                    a.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
                }
            }
        }
        let align = |x: u64| x.div_ceil(self.alignment) * self.alignment;
        let mut next = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            let off = t.offset.unwrap_or_else(|| align(next));
            offsets.push(off);
            next = off + t.data.len() as u64;
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
        }
        let data_start = align(out.len() as u64);
        out.resize(data_start as usize, 0);
        for (t, off) in self.tensors.iter().zip(offsets) {
            let at = (data_start + off) as usize;
            if out.len() < at + t.data.len() {
                out.resize(at + t.data.len(), 0);
            }
            out[at..at + t.data.len()].copy_from_slice(&t.data);
        }
        out
    }

    /// Writes the file into a fresh temp file and returns it (deleted on drop).
    pub fn write_temp(&self) -> tempfile::NamedTempFile {
        write_temp_bytes(&self.build())
    }
}

pub fn write_temp_bytes(bytes: &[u8]) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(bytes).expect("write temp file");
    f.flush().expect("flush temp file");
    f
}

/// The metadata of a `qwen3vl_merger` vision projector (architecture `clip`; n_embd 8, one
/// block, patch 16, 4×4 positions) projecting to `projection_dim`, without tensors: enough
/// for the header checks; the vision tests add the tensors.
pub fn projector_metadata(projection_dim: u32) -> GgufBuilder {
    let mut b = GgufBuilder::default()
        .kv("general.architecture", Val::Str("clip".into()))
        .kv("clip.projector_type", Val::Str("qwen3vl_merger".into()))
        .kv("clip.has_vision_encoder", Val::Bool(true));
    for (k, v) in [
        ("image_size", 64),
        ("patch_size", 16),
        ("embedding_length", 8),
        ("feed_forward_length", 16),
        ("block_count", 1),
        ("attention.head_count", 2),
        ("projection_dim", projection_dim),
        ("spatial_merge_size", 2),
    ] {
        b = b.kv(&format!("clip.vision.{k}"), Val::U32(v));
    }
    b.kv("clip.vision.attention.layer_norm_epsilon", Val::F32(1e-6))
        .kv("clip.vision.image_mean", Val::F32Arr(vec![0.5; 3]))
        .kv("clip.vision.image_std", Val::F32Arr(vec![0.5; 3]))
}
