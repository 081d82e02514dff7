//! The client side: a tonic interceptor that sends `authorization: Bearer <token>`.

use std::path::Path;

use tonic::metadata::MetadataValue;

use crate::error::AuthError;
use crate::tokens::TokenSet;

/// Adds the bearer token to every request of a tonic client (none when built with
/// [`BearerInterceptor::none`]). Used by the gateway's worker client
/// (`--worker-token-file`).
#[derive(Clone, Default)]
pub struct BearerInterceptor {
    value: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl std::fmt::Debug for BearerInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.value.is_some() { "BearerInterceptor(token)" } else { "BearerInterceptor(none)" })
    }
}

impl BearerInterceptor {
    /// Sends no token.
    pub fn none() -> Self {
        Self::default()
    }

    /// Sends the first token of the token file `path` (the format of
    /// [`TokenSet::parse`]).
    ///
    /// Errors: as [`TokenSet::load`].
    pub fn from_file(path: &Path) -> Result<Self, AuthError> {
        let set = TokenSet::load(path)?;
        let token = set.first().expect("a parsed token set is not empty");
        let text = format!("Bearer {}", String::from_utf8_lossy(token));
        let value = text.parse().map_err(|_| AuthError::BadTokens {
            path: path.to_path_buf(),
            detail: "the token cannot be sent as a header value".into(),
        })?;
        Ok(Self { value: Some(value) })
    }
}

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.value {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}
