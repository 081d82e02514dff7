//! What a gRPC server runs behind, and its serving loop, shared by the worker's StepService
//! and the gateway's AgentService: the [`AuthLayer`], TLS ([`ServerTls`]), whether reflection
//! is served, and a TCP or Unix-socket [`Listener`].

use crate::error::GrpcServeError;
use crate::layer::AuthLayer;
use crate::listen::Listener;
use crate::tls::ServerTls;

/// A gRPC server's protections.
#[derive(Clone)]
pub struct GrpcSecurity {
    /// Bearer tokens (or none: every call passes).
    pub auth: AuthLayer<tonic::body::Body>,
    /// TLS (or mutual TLS); `None`: plaintext.
    pub tls: Option<ServerTls>,
    /// Serve gRPC reflection (v1 and v1alpha; `--reflection`). Off by default: it tells
    /// anyone who connects every method and message.
    pub reflection: bool,
    /// Most concurrent HTTP/2 streams (calls) one client connection may open
    /// (`--grpc-max-concurrent-streams`; tonic's `max_concurrent_streams`): a client past it
    /// waits for one of its calls to end.
    pub max_concurrent_streams: u32,
    /// Largest request message a service decodes, bytes (tonic's
    /// `max_decoding_message_size`): the path's one budget, [`tandem_proto::MAX_MESSAGE_BYTES`], unless
    /// a test lowers it; a larger message gets OUT_OF_RANGE (tonic 0.14).
    pub max_message_bytes: usize,
}

/// Default [`GrpcSecurity::max_concurrent_streams`]: 64 (a gateway multiplexes the steps of
/// all its episodes over one connection per worker; a worker runs a few slots).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 64;

impl GrpcSecurity {
    /// `auth` only: plaintext, no reflection.
    pub fn auth(auth: AuthLayer<tonic::body::Body>) -> Self {
        Self {
            auth,
            tls: None,
            reflection: false,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_message_bytes: tandem_proto::MAX_MESSAGE_BYTES,
        }
    }

    /// No token, plaintext, no reflection (tests, local development).
    pub fn open() -> Self {
        Self::auth(AuthLayer::grpc(None, false))
    }
}

/// The server builder [`server`] returns: tonic's, behind the auth layer.
pub type GrpcServer = tonic::transport::Server<
    tower_layer::Stack<AuthLayer<tonic::body::Body>, tower_layer::Identity>,
>;

/// The router a [`GrpcServer`] becomes once services are added; [`serve`] runs it.
pub type GrpcRouter = tonic::transport::server::Router<
    tower_layer::Stack<AuthLayer<tonic::body::Body>, tower_layer::Identity>,
>;

/// A tonic server with `security`'s TLS and auth layer (add the services, then [`serve`]).
///
/// Errors: tonic refusing the TLS configuration (the files were checked at load).
pub fn server(security: &GrpcSecurity) -> Result<GrpcServer, tonic::transport::Error> {
    let mut builder =
        tonic::transport::Server::builder().max_concurrent_streams(Some(security.max_concurrent_streams.max(1)));
    if let Some(tls) = &security.tls {
        builder = builder.tls_config(tls.grpc())?;
    }
    Ok(builder.layer(security.auth.clone()))
}

/// `router` with gRPC reflection (v1 and v1alpha: grpcurl and older clients ask for either)
/// over `descriptor_sets` (encoded `FileDescriptorSet`s) when `security.reflection` is set;
/// `router` unchanged otherwise.
///
/// Errors: a descriptor set that does not decode.
pub fn with_reflection(
    router: GrpcRouter,
    security: &GrpcSecurity,
    descriptor_sets: &[&'static [u8]],
) -> Result<GrpcRouter, tonic_reflection::server::Error> {
    if !security.reflection {
        return Ok(router);
    }
    let builder = || {
        descriptor_sets
            .iter()
            .fold(tonic_reflection::server::Builder::configure(), |b, set| {
                b.register_encoded_file_descriptor_set(set)
            })
    };
    Ok(router
        .add_service(builder().build_v1()?)
        .add_service(builder().build_v1alpha()?))
}

/// [`with_reflection`] over `descriptor_sets` (when `security` asks for it), then [`serve`]:
/// the end of every server's start (StepService, AgentService).
///
/// Errors: [`GrpcServeError::Reflection`], [`GrpcServeError::Server`].
pub async fn serve_reflected(
    router: GrpcRouter,
    security: &GrpcSecurity,
    descriptor_sets: &[&'static [u8]],
    listener: Listener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), GrpcServeError> {
    let router = with_reflection(router, security, descriptor_sets)?;
    Ok(serve(router, listener, shutdown).await?)
}

/// Serves `router` on `listener` until `shutdown` resolves; a Unix socket's file is removed
/// when serving ends.
///
/// Errors: the server failing (tonic's transport error).
pub async fn serve(
    router: GrpcRouter,
    listener: Listener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    match listener {
        Listener::Tcp(l) => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(l),
                    shutdown,
                )
                .await
        }
        Listener::Unix(l, _file) => {
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(l),
                    shutdown,
                )
                .await
        }
    }
}
