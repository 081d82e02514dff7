//! Compiles `tandem/**/*.proto` with `protox` (pure Rust), so no system `protoc` is needed.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["tandem/step/v1/step.proto", "tandem/agent/v1/agent.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("tandem_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        .compile_fds(fds)?;
    Ok(())
}
