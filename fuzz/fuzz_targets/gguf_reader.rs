//! GGUF files -> `GgufFile` (header, metadata, tensor table; `GgufFile::from_bytes`, the parser
//! of `GgufFile::open`), then the typed metadata getters and tensor views. Properties: no
//! panic; every tensor's data lies inside the file and has the byte size its type and shape
//! give. (Building the tokenizer from fuzzed metadata is left out: it is most of the time per
//! input, and the chat_template target runs the real vocabularies.)
#![no_main]

use gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data) else { return };
    assert_eq!(file.file_bytes(), data.len() as u64);
    for (key, value) in file.metadata() {
        let _ = (value.type_name(), value.as_integer(), value.as_float(), value.as_str());
        let _ = (file.get_u32(key), file.get_u64(key), file.get_i32(key), file.get_f32(key));
        let _ = (file.get_bool(key), file.get_str(key), file.get_str_array(key));
    }
    let _ = file.architecture();
    for info in file.tensors() {
        let view = file.tensor(&info.name).expect("listed tensor has a view");
        assert_eq!(view.data.len() as u64, info.n_bytes);
        assert!(info.file_offset + info.n_bytes <= data.len() as u64);
    }
});
