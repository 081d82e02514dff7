//! gRPC contracts of tandem, generated from `proto/tandem/**.proto` at build time with
//! `protox` (no system `protoc`).
//!
//! - [`step::v1`]: `StepService`, served by the device-worker.
//! - [`agent::v1`]: `AgentService`, served by the agent-gateway.
//! - [`FILE_DESCRIPTOR_SET`]: for gRPC reflection (`grpcurl list`).

pub mod step {
    pub mod v1 {
        tonic::include_proto!("tandem.step.v1");
    }
}

pub mod agent {
    pub mod v1 {
        tonic::include_proto!("tandem.agent.v1");
    }
}

/// Encoded `FileDescriptorSet` of every tandem proto, for `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("tandem_descriptor");
