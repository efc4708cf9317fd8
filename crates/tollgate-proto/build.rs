//! Compiles `proto/tollgate/v1/*.proto` and `proto/tollgate/agent/v1/*.proto`
//! with protox (a pure-Rust protobuf compiler), so building Tollgate never
//! needs a system `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "tollgate/v1/token_bucket.proto",
        "tollgate/v1/admin.proto",
        "tollgate/v1/key_limits.proto",
        "tollgate/v1/partition_limits.proto",
        "tollgate/agent/v1/agent.proto",
    ];
    let paths: Vec<PathBuf> = files.iter().map(|f| proto_root.join(f)).collect();
    for path in &paths {
        println!("cargo:rerun-if-changed={}", path.display());
    }

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    // Each service's reflection lists only its own package's files: the
    // server's the tollgate.v1 files, the agent's its own (and what it
    // imports).
    let (server_files, agent_files) = paths.split_at(files.len() - 1);
    for (name, files) in [
        ("tollgate_descriptor.bin", server_files),
        ("agent_descriptor.bin", agent_files),
    ] {
        let set = protox::compile(files, [&proto_root])?;
        std::fs::write(out_dir.join(name), prost::Message::encode_to_vec(&set))?;
    }
    let descriptors = protox::compile(&paths, [&proto_root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Plain counters: printable as JSON by the CLI without a copy type.
        .type_attribute("tollgate.v1.Consumption", "#[derive(serde::Serialize)]")
        .compile_fds(descriptors)?;
    Ok(())
}
