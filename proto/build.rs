//! Generates the ax.v1 messages and gRPC stubs with protox, so no system `protoc` is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "ax/v1/types.proto",
        "ax/v1/worker.proto",
        "ax/v1/control.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["."])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("ax_v1_descriptor.bin");
    let encoded = prost::Message::encode_to_vec(&descriptors);
    std::fs::write(&descriptor_path, &encoded)?;
    // The protobuf JSON mapping of every message, for the HTTP API (`/api/v1`).
    // Every field is written, defaults too, so a reader sees `"exitCode": 0` rather than
    // having to know what an absent field means.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .emit_fields()
        .build(&[".ax.v1"])?;
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        // The worker RPC is called `Connect`, which would clash with the generated `connect`
        // constructor; clients build a `Channel` themselves instead.
        .build_transport(false)
        // prost's codec, but a request that does not decode is INVALID_ARGUMENT (`codec.rs`).
        .codec_path("crate::codec::AxCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
