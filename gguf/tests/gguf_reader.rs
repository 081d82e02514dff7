//! GGUF reader: the real SmolLM2 file loads; synthetic and damaged files give the right error
//! and never panic.


use gguf::GgufError;
use gguf::reader::{GgufFile, MetaValue};
use dsp::GgmlType;
use test_support::{model_path, write_temp_bytes, GgufBuilder, RawTensor, Val};

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let f = write_temp_bytes(bytes);
    GgufFile::open(f.path())
}

fn small() -> GgufBuilder {
    GgufBuilder::default()
        .kv("general.architecture", Val::Str("llama".into()))
        .kv("llama.block_count", Val::U32(2))
        .kv("small.u8", Val::U8(7))
        .kv("small.neg", Val::I32(-3))
        .kv("small.f", Val::F32(0.5))
        .kv("small.flag", Val::Bool(true))
        .kv("small.big", Val::U64(1 << 40))
        .kv("small.names", Val::StrArr(vec!["a".into(), "bb".into()]))
        .kv("small.ints", Val::I32Arr(vec![1, -2, 3]))
        .f32_tensor("a.weight", &[4, 3])
        .f32_tensor("b.weight", &[5])
}

// === synthetic files ===

/// [`small`] with one more 1-D tensor `name` of `len` elements of GGML type id `type_id`
/// and `data_len` zero bytes, as file bytes.
fn small_with_tensor(name: &str, len: u64, type_id: u32, data_len: usize) -> Vec<u8> {
    let mut b = small();
    b.tensors.push(RawTensor {
        name: name.into(),
        dims: vec![len],
        type_id,
        data: vec![0; data_len],
        offset: None,
    });
    b.build()
}

#[test]
fn synthetic_file_round_trips_metadata_and_tensors() {
    let f = small().write_temp();
    let g = GgufFile::open(f.path()).expect("valid file opens");
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture().expect("arch"), "llama");
    assert_eq!(g.get_u32("llama.block_count").expect("u32"), 2);
    // Any integer type that fits is accepted.
    assert_eq!(g.get_u32("small.u8").expect("u8 as u32"), 7);
    assert_eq!(g.get_i32("small.neg").expect("i32"), -3);
    assert_eq!(g.get_u64("small.big").expect("u64"), 1 << 40);
    for key in ["small.neg", "small.big", "small.f"] {
        assert!(
            matches!(g.get_u32(key), Err(GgufError::WrongType { .. })),
            "{key}"
        );
    }
    assert!(matches!(
        g.get_u32("no.such"),
        Err(GgufError::MissingKey { .. })
    ));
    assert_eq!(g.get_u32_opt("no.such"), None);
    assert_eq!(g.get_u32_opt("small.f"), None);
    assert_eq!(g.get_u32_opt("small.u8"), Some(7));
    assert_eq!(g.get_f32("small.f").expect("f32"), 0.5);
    assert!(g.get_bool("small.flag").expect("bool"));
    assert_eq!(
        g.get_str_array("small.names").expect("strs"),
        vec!["a", "bb"]
    );
    assert_eq!(g.get_i32_array("small.ints").expect("ints"), vec![1, -2, 3]);
    assert!(matches!(
        g.get_u32_array("small.ints"),
        Err(GgufError::WrongType { .. })
    ));
    assert_eq!(g.get("small.u8"), Some(&MetaValue::U8(7)));

    assert_eq!(g.tensors().count(), 2);
    let a = g.tensor("a.weight").expect("tensor a");
    assert_eq!(a.ty, GgmlType::F32);
    assert_eq!(a.dims, vec![4, 3]);
    assert_eq!(a.data.len(), 12 * 4);
    let vals: Vec<f32> = a
        .data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(vals, (0..12).map(|i| i as f32).collect::<Vec<_>>());
    let b = g.tensor("b.weight").expect("tensor b");
    assert_eq!(b.data.len(), 5 * 4);
    assert_eq!(
        f32::from_le_bytes([b.data[16], b.data[17], b.data[18], b.data[19]]),
        4.0
    );
    for t in g.tensors() {
        assert_eq!(t.file_offset % g.alignment(), 0, "{} aligned", t.name);
    }
    assert!(matches!(
        g.tensor("missing"),
        Err(GgufError::TensorNotFound { .. })
    ));
    assert!(g.tensor_opt("missing").is_none());
}

#[test]
fn custom_alignment_is_honoured() {
    let mut b = small().kv("general.alignment", Val::U32(64));
    b.alignment = 64;
    let f = b.write_temp();
    let g = GgufFile::open(f.path()).expect("opens");
    assert_eq!(g.alignment(), 64);
    let t = g.tensor("b.weight").expect("b");
    assert_eq!(
        f32::from_le_bytes([t.data[0], t.data[1], t.data[2], t.data[3]]),
        0.0
    );
    for t in g.tensors() {
        assert_eq!(t.file_offset % 64, 0);
    }
}

#[test]
fn bad_alignment_value_is_rejected() {
    let b = small().kv("general.alignment", Val::U32(48));
    assert!(matches!(
        open_bytes(&b.build()),
        Err(GgufError::InvalidAlignment { alignment: 48 })
    ));
}

#[test]
fn bad_magic_and_versions_are_rejected() {
    let mut b = small();
    b.magic = *b"GGUX";
    assert!(matches!(
        open_bytes(&b.build()),
        Err(GgufError::BadMagic { .. })
    ));
    // A zip file's magic reads as text with its non-printable bytes escaped.
    let mut zip = b"PK\x03\x04".to_vec();
    zip.extend_from_slice(&[0u8; 60]);
    let err = open_bytes(&zip).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"not a GGUF file: it starts with "PK\x03\x04", expected "GGUF""#
    );
    // A directory is named as one (the mapping's OS error said "No such device").
    let dir = tempfile::tempdir().unwrap();
    match GgufFile::open(dir.path()) {
        Err(GgufError::IsDirectory { path }) => assert_eq!(path, dir.path()),
        other => panic!("expected IsDirectory, got {other:?}"),
    }
    for v in [1u32, 4, 99] {
        let mut b = small();
        b.version = v;
        match open_bytes(&b.build()) {
            Err(GgufError::UnsupportedVersion { version }) => assert_eq!(version, v),
            other => panic!("version {v}: expected UnsupportedVersion, got {other:?}"),
        }
    }
    let mut b = small();
    b.version = 2;
    assert_eq!(open_bytes(&b.build()).expect("v2 opens").version(), 2);
}

#[test]
fn misaligned_duplicate_and_unknown_tensors_are_rejected() {
    let mut b = small();
    b.tensors[1].offset = Some(12 * 4 + 4); // 52: not a multiple of 32
    match open_bytes(&b.build()) {
        Err(GgufError::MisalignedTensor {
            tensor,
            offset,
            alignment,
        }) => {
            assert_eq!((tensor.as_str(), offset, alignment), ("b.weight", 52, 32));
        }
        other => panic!("expected MisalignedTensor, got {other:?}"),
    }

    let mut b = small();
    b.tensors[1].name = "a.weight".into();
    assert!(
        matches!(open_bytes(&b.build()), Err(GgufError::DuplicateTensor { tensor }) if tensor == "a.weight")
    );

    match open_bytes(&small_with_tensor("q5k", 256, 13, 176)) {
        Err(GgufError::UnknownTensorType {
            tensor,
            type_id,
            type_name,
        }) => {
            assert_eq!((tensor.as_str(), type_id, type_name), ("q5k", 13, "q5_K"));
        }
        other => panic!("expected UnknownTensorType, got {other:?}"),
    }

    assert!(matches!(
        open_bytes(&small_with_tensor("odd", 33, 2, 36)),
        Err(GgufError::BadShape { .. })
    ));

    let mut b = small();
    b.tensors[0].dims = vec![1, 1, 1, 1, 12];
    assert!(matches!(
        open_bytes(&b.build()),
        Err(GgufError::TooManyDims { n_dims: 5, .. })
    ));

    let b = small().kv("llama.block_count", Val::U32(3));
    assert!(matches!(
        open_bytes(&b.build()),
        Err(GgufError::DuplicateKey { .. })
    ));
}

#[test]
fn oversized_lengths_are_rejected_without_allocating() {
    // A string whose declared length runs past the end of the file.
    let mut bytes = small().build();
    // The first key's length field sits right after the 24-byte header.
    bytes[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        open_bytes(&bytes),
        Err(GgufError::LengthExceedsFile { .. })
    ));
    // A tensor count no file of this size can hold.
    let mut bytes = small().build();
    bytes[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    match open_bytes(&bytes) {
        Err(
            e @ GgufError::LengthExceedsFile {
                offset: 8,
                len,
                unit: "tensors",
                needed,
                remaining,
                file_bytes,
                ..
            },
        ) => {
            assert_eq!(len, 1 << 60);
            assert!(needed > remaining && remaining < file_bytes);
            // The message counts tensors as tensors and bytes as bytes, and says why.
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("declares {len} tensors"))
                    && msg.contains(&format!("only {remaining} bytes"))
                    && msg.contains("truncated or corrupt"),
                "{msg}"
            );
        }
        other => panic!("expected LengthExceedsFile for the tensor count, got {other:?}"),
    }
}

#[test]
fn every_truncation_of_a_small_file_errors_without_panicking() {
    let bytes = small().build();
    let full = GgufFile::open(write_temp_bytes(&bytes).path()).expect("full file opens");
    let data_start = full
        .tensors()
        .map(|t| t.file_offset)
        .min()
        .expect("has tensors");
    for n in 0..bytes.len() {
        match open_bytes(&bytes[..n]) {
            Err(GgufError::Truncated {
                needed, file_bytes, ..
            }) => {
                assert!(
                    n as u64 >= data_start.saturating_sub(31),
                    "cut {n} in header reported as data truncation"
                );
                assert_eq!(file_bytes, n as u64);
                assert!(needed > file_bytes);
            }
            Err(
                GgufError::HeaderTruncated { file_bytes, .. }
                | GgufError::LengthExceedsFile { file_bytes, .. },
            ) => {
                assert_eq!(file_bytes, n as u64);
                assert!(
                    (n as u64) < data_start,
                    "cut {n} in data reported as header truncation"
                );
            }
            other => panic!("cut at {n}: expected a truncation error, got {other:?}"),
        }
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    let bytes = small().build();
    // Deterministic LCG (Numerical Recipes constants) so failures reproduce.
    let mut state = 0x1234_5678_u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    for _ in 0..2000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() as usize) % b.len();
            b[i] = next() as u8;
        }
        // Either outcome is fine; reaching here without a panic is the property.
        if let Ok(g) = open_bytes(&b) {
            for t in g.tensors() {
                let v = g.tensor(&t.name).expect("listed tensor resolves");
                assert_eq!(v.data.len() as u64, t.n_bytes);
            }
        }
    }
}

// === the real model ===

#[test]
fn real_smollm2_file_loads() {
    let path = model_path();
    let g = GgufFile::open(&path).expect("real model opens");
    assert_eq!(g.version(), 3);
    assert_eq!(g.architecture().expect("arch"), "llama");
    assert_eq!(g.tensors().count(), 272);
    assert_eq!(g.get_u32("llama.block_count").expect("block_count"), 30);
    assert_eq!(g.get_u32("llama.embedding_length").expect("n_embd"), 576);
    assert_eq!(
        g.get_str("tokenizer.ggml.model").expect("tok model"),
        "gpt2"
    );
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens")
            .expect("tokens")
            .len(),
        49152
    );
    assert_eq!(
        g.get_i32_array("tokenizer.ggml.token_type")
            .expect("types")
            .len(),
        49152
    );
    assert!(!g.get_bool("tokenizer.ggml.add_bos_token").expect("add_bos"));
    assert!(
        (g.get_f32("llama.attention.layer_norm_rms_epsilon")
            .expect("eps")
            - 1e-5)
            .abs()
            < 1e-9
    );
    assert_eq!(
        g.file_bytes(),
        std::fs::metadata(&path).expect("stat").len()
    );

    let emb = g.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(emb.dims, vec![576, 49152]);
    let row = emb
        .ty
        .row_bytes(576)
        .expect("576 is a whole number of blocks");
    assert_eq!(emb.data.len(), row * 49152);
    let mut n_bytes = 0u64;
    for t in g.tensors() {
        let v = g.tensor(&t.name).expect("listed tensor resolves");
        let rows: u64 = t.dims[1..].iter().product();
        assert_eq!(
            v.data.len() as u64,
            t.ty.row_bytes(t.dims[0] as usize).expect("whole blocks") as u64 * rows
        );
        n_bytes += t.n_bytes;
    }
    assert!(n_bytes <= g.file_bytes());
}

/// Offset of the first occurrence of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle present in the model file")
}

fn gguf_string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

#[test]
fn truncated_real_file_gives_errors_not_sigbus() {
    let path = model_path();
    let bytes = std::fs::read(&path).expect("read model");
    let full = GgufFile::open(&path).expect("opens");
    let data_start = full
        .tensors()
        .map(|t| t.file_offset)
        .min()
        .expect("tensors");
    let kv_tokens = find(&bytes, &gguf_string("tokenizer.ggml.tokens"));
    let tensor_infos = find(&bytes, &gguf_string("token_embd.weight"));
    assert!(kv_tokens < tensor_infos && (tensor_infos as u64) < data_start);

    let header_cuts = [
        0,
        3,
        6,
        15,
        23,
        30,
        kv_tokens + 5,
        kv_tokens + 40,
        kv_tokens + 100_000,
        tensor_infos + 3,
        tensor_infos + 30,
    ];
    for n in header_cuts {
        match open_bytes(&bytes[..n]) {
            Err(
                GgufError::HeaderTruncated { file_bytes, .. }
                | GgufError::LengthExceedsFile { file_bytes, .. },
            ) => {
                assert_eq!(file_bytes, n as u64, "cut {n}");
            }
            other => panic!(
                "header cut at {n}: expected HeaderTruncated/LengthExceedsFile, got {other:?}"
            ),
        }
    }
    let data_cuts = [data_start as usize + 10, bytes.len() / 2, bytes.len() - 1];
    for n in data_cuts {
        match open_bytes(&bytes[..n]) {
            Err(GgufError::Truncated {
                tensor,
                needed,
                file_bytes,
            }) => {
                assert_eq!(file_bytes, n as u64);
                assert!(needed > file_bytes, "cut {n}: {tensor} needs {needed}");
                // The named tensor is the first (in file order) whose data runs past the cut.
                let first = full
                    .tensors()
                    .find(|t| t.file_offset + t.n_bytes > n as u64)
                    .expect("some tensor cut");
                assert_eq!(tensor, first.name);
                assert_eq!(needed, first.file_offset + first.n_bytes);
            }
            other => panic!("data cut at {n}: expected Truncated, got {other:?}"),
        }
    }
}

#[test]
fn edited_real_file_with_unknown_type_or_version_is_rejected() {
    let path = model_path();
    let bytes = std::fs::read(&path).expect("read model");
    // token_embd.weight: name, n_dims=2 (u32), two u64 dims, then the u32 type id.
    let name_at = find(&bytes, &gguf_string("token_embd.weight"));
    let type_at = name_at + 8 + "token_embd.weight".len() + 4 + 2 * 8;
    let mut edited = bytes.clone();
    assert_eq!(
        u32::from_le_bytes(edited[type_at..type_at + 4].try_into().expect("4 bytes")),
        8,
        "token_embd is q8_0"
    );
    edited[type_at..type_at + 4].copy_from_slice(&13u32.to_le_bytes());
    match open_bytes(&edited) {
        Err(GgufError::UnknownTensorType {
            tensor,
            type_id,
            type_name,
        }) => {
            assert_eq!(
                (tensor.as_str(), type_id, type_name),
                ("token_embd.weight", 13, "q5_K")
            );
            let msg = GgufError::UnknownTensorType {
                tensor,
                type_id,
                type_name,
            }
            .to_string();
            assert!(
                msg.contains("token_embd.weight") && msg.contains("13") && msg.contains("q5_K"),
                "{msg}"
            );
        }
        other => panic!("expected UnknownTensorType, got {other:?}"),
    }

    let mut v4 = bytes[..4096].to_vec();
    v4[4..8].copy_from_slice(&4u32.to_le_bytes());
    assert!(matches!(
        open_bytes(&v4),
        Err(GgufError::UnsupportedVersion { version: 4 })
    ));
}

/// `GgufFile::from_bytes` (the fuzz targets' entry) parses what `open` parses, to the same
/// metadata, tensor table and tensor bytes, and refuses what `open` refuses with the same error.
#[test]
fn from_bytes_matches_open() {
    let bytes = small().build();
    let (mem, file) = (GgufFile::from_bytes(&bytes).expect("parses"), open_bytes(&bytes).expect("opens"));
    assert_eq!(mem.file_bytes(), bytes.len() as u64);
    assert_eq!(mem.metadata(), file.metadata());
    assert_eq!(mem.n_tensors(), 2);
    for info in file.tensors() {
        assert_eq!(mem.tensor(&info.name).expect("in memory").data, file.tensor(&info.name).expect("in file").data);
    }
    for bad in [&bytes[..bytes.len() - 1], &b"GGUF"[..], &[][..]] {
        let (m, f) = (GgufFile::from_bytes(bad).expect_err("refused"), open_bytes(bad).expect_err("refused"));
        assert_eq!(m.to_string(), f.to_string());
    }
}
