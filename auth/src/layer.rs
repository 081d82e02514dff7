//! The tower layer that refuses requests without a valid bearer token, before any handler
//! (or body) is read. One layer serves both protocols; only the refusal differs: gRPC answers
//! `UNAUTHENTICATED` ([`AuthLayer::grpc`]), HTTP answers 401 with an OpenAI error object and
//! `WWW-Authenticate: Bearer` ([`AuthLayer::openai_http`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::tokens::Authenticator;

/// The gRPC health service's path prefix, open unless `--health-requires-auth`.
pub const GRPC_HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// No `authorization` header.
    Missing,
    /// An `authorization` header that is not `Bearer <token>`.
    Malformed,
    /// A bearer token that is not one of the accepted ones.
    Wrong,
}

impl Rejection {
    /// The message sent back (never echoes the presented token).
    pub fn message(self) -> &'static str {
        match self {
            Rejection::Missing => "missing bearer token: send the header `authorization: Bearer <token>`",
            Rejection::Malformed => "the authorization header is not `Bearer <token>`",
            Rejection::Wrong => "invalid bearer token",
        }
    }

    /// The message a gRPC client gets: [`Rejection::message`], and for a missing token the
    /// flags of tandem's own clients that send one (a gRPC client is more often one of them
    /// than an HTTP client is).
    pub fn grpc_message(self) -> &'static str {
        match self {
            Rejection::Missing => "missing bearer token: give the token file with --token-file (to a worker: --worker-token-file), or send `authorization: Bearer <token>`",
            other => other.message(),
        }
    }
}

type Reject<B> = Arc<dyn Fn(Rejection) -> http::Response<B> + Send + Sync>;
type OnRefusal = Arc<dyn Fn(Rejection) + Send + Sync>;

/// Requires `authorization: Bearer <token>` with a token the [`Authenticator`] accepts on
/// every request whose path does not start with one of the open prefixes. Without an
/// authenticator (authentication off) every request passes.
pub struct AuthLayer<B> {
    auth: Option<Authenticator>,
    open_prefixes: Arc<[&'static str]>,
    reject: Reject<B>,
    on_refusal: Option<OnRefusal>,
}

impl<B> Clone for AuthLayer<B> {
    fn clone(&self) -> Self {
        Self {
            auth: self.auth.clone(),
            open_prefixes: self.open_prefixes.clone(),
            reject: self.reject.clone(),
            on_refusal: self.on_refusal.clone(),
        }
    }
}

impl<B> AuthLayer<B> {
    /// A layer that answers refused requests with `reject`; paths starting with one of
    /// `open_prefixes` need no token.
    pub fn new(
        auth: Option<Authenticator>,
        open_prefixes: &[&'static str],
        reject: impl Fn(Rejection) -> http::Response<B> + Send + Sync + 'static,
    ) -> Self {
        Self {
            auth,
            open_prefixes: open_prefixes.into(),
            reject: Arc::new(reject),
            on_refusal: None,
        }
    }

    /// Calls `f` once for every refused request, before the refusal is sent (the server's
    /// metrics count it: the layer runs before any handler, so handlers never see these).
    pub fn on_refusal(mut self, f: impl Fn(Rejection) + Send + Sync + 'static) -> Self {
        self.on_refusal = Some(Arc::new(f));
        self
    }

    /// Whether `req` may pass: `Err` says why not.
    pub fn check<R>(&self, req: &http::Request<R>) -> Result<(), Rejection> {
        let Some(auth) = &self.auth else { return Ok(()) };
        let path = req.uri().path();
        if self.open_prefixes.iter().any(|p| path.starts_with(p)) {
            return Ok(());
        }
        let value = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .ok_or(Rejection::Missing)?;
        let token = bearer_token(value.as_bytes()).ok_or(Rejection::Malformed)?;
        if auth.accepts(token) {
            Ok(())
        } else {
            Err(Rejection::Wrong)
        }
    }
}

/// The token of an `authorization` value `Bearer <token>` (scheme case-insensitive, RFC 6750
/// §2.1).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

impl AuthLayer<tonic::body::Body> {
    /// For a tonic server: refusals are gRPC `UNAUTHENTICATED`; the health service stays open
    /// unless `health_requires_auth` (orchestrators and `agent-gateway health` probe it).
    pub fn grpc(auth: Option<Authenticator>, health_requires_auth: bool) -> Self {
        let open: &[&'static str] = if health_requires_auth {
            &[]
        } else {
            &[GRPC_HEALTH_PREFIX]
        };
        Self::new(auth, open, |r| {
            tonic::Status::unauthenticated(r.grpc_message()).into_http()
        })
    }
}

impl<B: From<String>> AuthLayer<B> {
    /// For an OpenAI-compatible HTTP server: refusals are 401 with
    /// `{"error": {"message", "type": "authentication_error", "code": "invalid_api_key"}}` and
    /// `WWW-Authenticate: Bearer` (what OpenAI clients expect for a bad API key); paths
    /// starting with one of `open_prefixes` need no token.
    pub fn openai_http(auth: Option<Authenticator>, open_prefixes: &[&'static str]) -> Self {
        Self::new(auth, open_prefixes, |r| {
            let body = serde_json::json!({"error": {
                "message": r.message(), "type": "authentication_error",
                "param": null, "code": "invalid_api_key",
            }});
            let mut resp = http::Response::new(B::from(body.to_string()));
            *resp.status_mut() = http::StatusCode::UNAUTHORIZED;
            let h = resp.headers_mut();
            h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
            h.insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
            resp
        })
    }
}

impl<S, B> tower_layer::Layer<S> for AuthLayer<B> {
    type Service = AuthService<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`AuthLayer`] wraps around a server's routes.
pub struct AuthService<S, B> {
    inner: S,
    layer: AuthLayer<B>,
}

impl<S: Clone, B> Clone for AuthService<S, B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, ReqB, B> tower_service::Service<http::Request<ReqB>> for AuthService<S, B>
where
    S: tower_service::Service<http::Request<ReqB>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        match self.layer.check(&req) {
            Ok(()) => Box::pin(self.inner.call(req)),
            Err(r) => {
                tracing::warn!(path = req.uri().path(), reason = ?r, "request refused: not authenticated");
                if let Some(f) = &self.layer.on_refusal {
                    f(r);
                }
                let resp = (self.layer.reject)(r);
                Box::pin(async move { Ok(resp) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer() -> AuthLayer<String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        let auth = Authenticator::from_file(&path).unwrap();
        AuthLayer::openai_http(Some(auth), &["/health"])
    }

    fn req(path: &str, auth: Option<&str>) -> http::Request<()> {
        let mut b = http::Request::builder().uri(path);
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn check_needs_a_bearer_token_except_on_open_paths() {
        let l = layer();
        assert_eq!(l.check(&req("/v1/models", None)), Err(Rejection::Missing));
        assert_eq!(l.check(&req("/v1/models", Some("Basic abc"))), Err(Rejection::Malformed));
        assert_eq!(l.check(&req("/v1/models", Some("Bearer "))), Err(Rejection::Malformed));
        assert_eq!(l.check(&req("/v1/models", Some("Bearer wrong-token-000000"))), Err(Rejection::Wrong));
        assert_eq!(l.check(&req("/v1/models", Some("Bearer 0123456789abcdef0123"))), Ok(()));
        assert_eq!(l.check(&req("/v1/models", Some("bearer  0123456789abcdef0123 "))), Ok(()));
        assert_eq!(l.check(&req("/health", None)), Ok(()));
        let off: AuthLayer<String> = AuthLayer::openai_http(None, &[]);
        assert_eq!(off.check(&req("/v1/models", None)), Ok(()), "no authenticator: auth off");
    }

    #[test]
    fn http_refusals_are_openai_401s() {
        let resp = (layer().reject)(Rejection::Wrong);
        assert_eq!(resp.status(), 401);
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        let v: serde_json::Value = serde_json::from_str(resp.body()).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(v["error"]["message"], "invalid bearer token");
    }
}
