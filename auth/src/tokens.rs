//! The accepted bearer tokens: parsed from a file, reloadable, compared in constant time.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use subtle::ConstantTimeEq;

use crate::error::AuthError;

/// Shortest token accepted (characters): a shorter one is guessable over loopback.
pub const MIN_TOKEN_LEN: usize = 16;

/// A set of accepted tokens.
#[derive(Clone, Default)]
pub struct TokenSet {
    tokens: Vec<Vec<u8>>,
}

impl std::fmt::Debug for TokenSet {
    /// Never prints a token, only how many there are.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenSet({} tokens)", self.tokens.len())
    }
}

impl TokenSet {
    /// Parses a token file's text: one token per line, surrounding whitespace ignored, blank
    /// lines and lines starting with `#` skipped.
    ///
    /// Errors: [`AuthError::BadTokens`] (with `path` for the message) when there is no token,
    /// a token is shorter than [`MIN_TOKEN_LEN`] or contains whitespace or a non-visible
    /// character (it could not travel in an `authorization` header).
    pub fn parse(text: &str, path: &Path) -> Result<Self, AuthError> {
        let bad = |detail: String| AuthError::BadTokens {
            path: path.to_path_buf(),
            detail,
        };
        let mut tokens = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            if t.len() < MIN_TOKEN_LEN {
                return Err(bad(format!(
                    "the token on line {} has {} characters; use at least {MIN_TOKEN_LEN} \
                     (e.g. `openssl rand -hex 32`)",
                    i + 1,
                    t.len()
                )));
            }
            if !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad(format!(
                    "the token on line {} has a space or a non-ASCII character",
                    i + 1
                )));
            }
            tokens.push(t.as_bytes().to_vec());
        }
        if tokens.is_empty() {
            return Err(bad("no token in the file (one token per line; # starts a comment)".into()));
        }
        Ok(Self { tokens })
    }

    /// Reads and parses `path` ([`TokenSet::parse`]). Logs a warning naming the file and its
    /// mode when other users can read it ([`shared_mode`]); the file is still used (a
    /// container runtime may mount a secret 0644).
    ///
    /// Errors: [`AuthError::Read`]; as [`TokenSet::parse`].
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let set = Self::parse(&text, path)?;
        if let Some(mode) = shared_mode(path) {
            tracing::warn!(
                "token file {} has mode {mode:04o}: other users of this host can read its tokens; `chmod 600 {}` keeps them private",
                path.display(),
                path.display()
            );
        }
        Ok(set)
    }

    /// How many tokens the set holds.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the set is empty (never for a parsed set).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether `presented` is one of the tokens. Every token is compared, each in constant
    /// time for its length (`subtle`), so the time taken says nothing about how much of a
    /// guess was right.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let mut ok = subtle::Choice::from(0);
        for t in &self.tokens {
            ok |= t.as_slice().ct_eq(presented);
        }
        ok.into()
    }

    /// The first token (what a client sends).
    pub fn first(&self) -> Option<&[u8]> {
        self.tokens.first().map(Vec::as_slice)
    }
}

/// The permission bits of the file `path` (symbolic links followed) when its group or others
/// may read it; `None` for a private file, one whose mode cannot be read, or off Unix.
pub fn shared_mode(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
        (mode & 0o044 != 0).then_some(mode)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// The tokens a server accepts, loaded from a file and swapped atomically by
/// [`Authenticator::reload`] (the servers call it on SIGHUP, see
/// [`Authenticator::reload_on_sighup`]). Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct Authenticator {
    path: PathBuf,
    tokens: Arc<RwLock<Arc<TokenSet>>>,
}

impl Authenticator {
    /// Loads the tokens of `path`.
    ///
    /// Errors: as [`TokenSet::load`].
    pub fn from_file(path: &Path) -> Result<Self, AuthError> {
        let set = TokenSet::load(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            tokens: Arc::new(RwLock::new(Arc::new(set))),
        })
    }

    /// The token file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the token file again and, when it parses, makes its tokens the accepted ones
    /// (requests in flight keep the set they were checked with). Returns the token count.
    ///
    /// Errors: as [`TokenSet::load`]; the previous tokens stay in force.
    pub fn reload(&self) -> Result<usize, AuthError> {
        let set = TokenSet::load(&self.path)?;
        let n = set.len();
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(set);
        Ok(n)
    }

    /// Whether `presented` is an accepted token.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        let set = self.tokens.read().unwrap_or_else(|p| p.into_inner()).clone();
        set.accepts(presented)
    }

    /// Spawns a task (on the current Tokio runtime) that reloads the tokens on every SIGHUP
    /// and logs the outcome; a file that fails to load is logged and the old tokens kept.
    /// Does nothing where SIGHUP does not exist.
    pub fn reload_on_sighup(&self) {
        let auth = self.clone();
        on_sighup("token reloads need a restart", move || match auth.reload() {
            Ok(n) => tracing::info!(tokens = n, file = %auth.path.display(), "auth tokens reloaded"),
            Err(e) => tracing::error!("auth tokens not reloaded (the previous ones stay): {e}"),
        });
    }
}

/// Spawns a task (on the current Tokio runtime) that calls `reload` on every SIGHUP; when the
/// handler cannot be installed, warns "cannot install the SIGHUP handler: {without}". Does
/// nothing where SIGHUP does not exist. The one SIGHUP loop of the accepted tokens
/// ([`Authenticator::reload_on_sighup`]) and of the client's token
/// ([`crate::client::BearerInterceptor::reload_on_sighup`]).
pub(crate) fn on_sighup(without: &'static str, reload: impl Fn() + Send + 'static) {
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot install the SIGHUP handler: {without}");
            return;
        };
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                reload();
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (without, reload);
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123";
    const B: &str = "fedcba9876543210fedc";

    #[test]
    fn parse_skips_comments_and_blanks_and_rejects_short_or_spaced_tokens() {
        let p = Path::new("tokens");
        let set = TokenSet::parse(&format!("# comment\n\n  {A}  \n{B}\n"), p).unwrap();
        assert_eq!(set.len(), 2);
        assert!(set.accepts(A.as_bytes()) && set.accepts(B.as_bytes()));
        assert!(!set.accepts(b"0123456789abcdef012"), "a prefix is not the token");
        assert!(!set.accepts(format!("{A}x").as_bytes()), "nor a longer string");
        assert!(!set.accepts(b""));
        let err = TokenSet::parse("short\n", p).unwrap_err().to_string();
        assert!(err.contains("line 1 has 5 characters"), "{err}");
        let err = TokenSet::parse("# only a comment\n", p).unwrap_err().to_string();
        assert!(err.contains("no token"), "{err}");
        let err = TokenSet::parse("0123456789 abcdef0123\n", p).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        assert_eq!(format!("{set:?}"), "TokenSet(2 tokens)", "Debug never shows a token");
    }

    #[test]
    fn reload_swaps_the_tokens_and_keeps_them_when_the_file_is_bad() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, A).unwrap();
        let auth = Authenticator::from_file(&path).unwrap();
        assert!(auth.accepts(A.as_bytes()) && !auth.accepts(B.as_bytes()));
        std::fs::write(&path, B).unwrap();
        assert_eq!(auth.reload().unwrap(), 1);
        assert!(!auth.accepts(A.as_bytes()) && auth.accepts(B.as_bytes()));
        std::fs::write(&path, "").unwrap();
        assert!(auth.reload().is_err());
        assert!(auth.accepts(B.as_bytes()), "a bad file leaves the previous tokens in force");
        let missing = Authenticator::from_file(&dir.path().join("none")).unwrap_err();
        assert!(matches!(missing, AuthError::Read { .. }), "{missing}");
    }

    /// A token file other users can read is reported with its mode (0644, 0640), a private
    /// one (0600, 0400) is not.
    #[test]
    fn shared_mode_is_the_mode_of_a_file_others_can_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, A).unwrap();
        for (mode, shared) in [(0o644, Some(0o644)), (0o640, Some(0o640)), (0o604, Some(0o604)), (0o600, None), (0o400, None)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(shared_mode(&path), shared, "{mode:o}");
        }
        assert_eq!(shared_mode(&dir.path().join("none")), None);
    }
}
