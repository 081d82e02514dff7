//! gRPC contracts of tandem, generated from `proto/tandem/**.proto` at build time with
//! `protox` (no system `protoc`).
//!
//! - [`step::v1`]: `StepService`, served by the device-worker.
//! - [`agent::v1`]: `AgentService`, served by the agent-gateway.
//! - [`FILE_DESCRIPTOR_SET`]: for gRPC reflection (`grpcurl list`).
//! - [`limits`]: the fields' value rules, one function each, checked by both servers.

pub mod limits;

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

/// The one request-size budget of the whole path, in bytes: the largest gRPC message either
/// server decodes (StepService, AgentService; tonic's default, stated here once) and the
/// gateway's HTTP body limit, so whatever the HTTP endpoint accepts also fits the gRPC hop to
/// the worker (a JSON chat request is never smaller than its protobuf form). Inside it, the
/// worker refuses a prompt whose text alone is over the context before tokenizing it.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
