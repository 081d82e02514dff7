//! Where a server listens: a TCP address or a Unix-domain socket (`unix:PATH`).
//!
//! A Unix socket is how two processes of one Android app talk: only the app's own user can
//! open it (file mode 0600), nothing else on the device or behind `adb forward` reaches it, so
//! it counts as local for the bind policy ([`crate::AuthArgs::authenticator`]). A stale socket
//! file (nothing accepts on it) is removed at start, one that a live server owns is not; the
//! file is removed when the [`Listener`] is dropped (clean exit).

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::ListenError;

/// A `--listen` value: `127.0.0.1:50051` or `unix:/path/to/socket`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl ListenAddr {
    /// The TCP address, `None` for a Unix socket (the bind policy's input).
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            ListenAddr::Tcp(a) => Some(*a),
            ListenAddr::Unix(_) => None,
        }
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    /// `unix:PATH` → [`ListenAddr::Unix`]; otherwise a socket address (`127.0.0.1:50051`,
    /// `[::1]:50051`). Errors: a message naming the bad value.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(
                    "unix: needs a socket path, e.g. unix:/data/local/tmp/worker.sock".into(),
                );
            }
            return Ok(ListenAddr::Unix(path.into()));
        }
        socket_addr_or(s, "unix:PATH").map(ListenAddr::Tcp)
    }
}

/// A TCP address to listen on, `IP:PORT` (`127.0.0.1:50051`, `[::1]:50051`, `0.0.0.0:8080`;
/// port 0: any free port): the TCP form of every `--listen`-style flag of both servers.
///
/// Errors: a message naming the value and what is wrong with it (no port, a port outside
/// 0-65535, no host, a host that is no IP address), and giving an example.
pub fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    tcp_addr(s, TCP_EXPECTED)
}

/// What [`socket_addr`] takes, for its errors.
const TCP_EXPECTED: &str = "expected IP:PORT, e.g. 127.0.0.1:50051 (this device only) or 0.0.0.0:50051 (every interface)";

/// [`socket_addr`] for a flag that also takes `other` (`unix:PATH`, `off`), which its errors
/// name.
///
/// Errors: as [`socket_addr`].
pub fn socket_addr_or(s: &str, other: &str) -> Result<SocketAddr, String> {
    tcp_addr(s, &format!("{TCP_EXPECTED}, or {other}"))
}

/// [`socket_addr`], its errors ending in `({expected})`.
fn tcp_addr(s: &str, expected: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let Some((host, port)) = s.rsplit_once(':').filter(|(h, _)| !h.starts_with('[') || h.ends_with(']')) else {
        return Err(format!("{s:?} has no port ({expected})"));
    };
    let mut wrong = Vec::new();
    if host.is_empty() {
        wrong.push("no host before the port".to_string());
    } else if host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().is_err() {
        wrong.push(format!("host {host:?} is not an IP address (names are not resolved)"));
    }
    if port.parse::<u16>().is_err() {
        wrong.push(format!("port {port:?} is not a number from 0 to 65535"));
    }
    if wrong.is_empty() {
        wrong.push("not an address".into());
    }
    Err(format!("{s:?}: {} ({expected})", wrong.join(", ")))
}

/// A bound listener. Dropping it closes it (and removes its socket file).
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener, SocketFile),
}

impl Listener {
    /// Binds `addr`; a Unix socket is created with mode 0600 (never reachable with looser
    /// permissions) after removing a stale socket file at the path.
    ///
    /// Errors: [`ListenError::Bind`] when binding fails; [`ListenError::InUse`] when a server
    /// accepts on the socket path or the path is not a socket.
    pub async fn bind(addr: &ListenAddr) -> Result<Self, ListenError> {
        let bind_err = |error| ListenError::Bind {
            addr: addr.to_string(),
            error,
        };
        match addr {
            ListenAddr::Tcp(a) => tokio::net::TcpListener::bind(a)
                .await
                .map(Listener::Tcp)
                .map_err(bind_err),
            ListenAddr::Unix(path) => {
                remove_stale(addr, path)?;
                let (listener, file) = bind_private(path).map_err(bind_err)?;
                Ok(Listener::Unix(listener, file))
            }
        }
    }

    /// Where it listens: the bound TCP address (the real port for `:0`), or `unix:PATH`.
    pub fn local_addr(&self) -> std::io::Result<ListenAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().map(ListenAddr::Tcp),
            Listener::Unix(_, f) => Ok(ListenAddr::Unix(f.path.clone())),
        }
    }
}

/// The socket file of a Unix listener; removed on drop if it is still the one bound.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    dev_ino: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.dev_ino);
        if ours {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the socket file");
            }
        }
    }
}

/// Removes the socket file at `path` if nothing accepts on it.
fn remove_stale(addr: &ListenAddr, path: &Path) -> Result<(), ListenError> {
    use std::os::unix::fs::FileTypeExt;
    let in_use = |detail: String| ListenError::InUse {
        addr: addr.to_string(),
        detail,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(ListenError::Bind {
                addr: addr.to_string(),
                error,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(in_use(
            "the path exists and is not a socket; remove it or choose another path".into(),
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(in_use("another server is listening on this socket".into())),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(|error| ListenError::Bind {
                addr: addr.to_string(),
                error,
            })?;
            tracing::info!(path = %path.display(), "removed a stale socket file (nothing was listening)");
            Ok(())
        }
        Err(e) => Err(in_use(format!(
            "cannot tell whether a server uses it ({e}); remove it if none does"
        ))),
    }
}

/// Binds a Unix socket at `path` with mode 0600: created in a fresh 0700 directory next to
/// it, restricted, then renamed into place, so no other user can connect in between.
fn bind_private(path: &Path) -> std::io::Result<(tokio::net::UnixListener, SocketFile)> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the socket path has no file name"))?;
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let private = parent.join(format!(
        ".{}.{}.bind",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let tmp = private.join("s");
    let bound = (|| -> std::io::Result<tokio::net::UnixListener> {
        let listener = tokio::net::UnixListener::bind(&tmp)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir(&private);
    let listener = bound?;
    let meta = std::fs::symlink_metadata(path)?;
    Ok((
        listener,
        SocketFile {
            path: path.into(),
            dev_ino: (meta.dev(), meta.ino()),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_and_print() {
        assert_eq!(
            "127.0.0.1:5"
                .parse::<ListenAddr>()
                .unwrap()
                .tcp()
                .unwrap()
                .port(),
            5
        );
        let u: ListenAddr = "unix:/tmp/w.sock".parse().unwrap();
        assert_eq!(u, ListenAddr::Unix("/tmp/w.sock".into()));
        assert!(u.tcp().is_none());
        for s in ["unix:/tmp/w.sock", "[::1]:50051"] {
            assert_eq!(s.parse::<ListenAddr>().unwrap().to_string(), s);
        }
        assert!("unix:"
            .parse::<ListenAddr>()
            .unwrap_err()
            .contains("socket path"));
        assert!("localhost"
            .parse::<ListenAddr>()
            .unwrap_err()
            .contains("\"localhost\""));
    }

    /// A TCP listen address is IP:PORT; every other form says what is wrong, with an example.
    #[test]
    fn tcp_listen_addresses_say_what_is_wrong() {
        assert_eq!(socket_addr(" 0.0.0.0:0 ").unwrap().to_string(), "0.0.0.0:0");
        assert_eq!(socket_addr("[::1]:65535").unwrap().to_string(), "[::1]:65535");
        for (bad, why) in [
            (":99999", "\":99999\": no host before the port, port \"99999\" is not a number from 0 to 65535"),
            (":8080", "\":8080\": no host before the port"),
            ("127.0.0.1:70000", "port \"70000\" is not a number from 0 to 65535"),
            ("localhost:8080", "host \"localhost\" is not an IP address"),
            ("8080", "\"8080\" has no port"),
            ("[::1]", "has no port"),
        ] {
            let err = socket_addr(bad).expect_err(bad);
            assert!(err.contains(why) && err.ends_with("(expected IP:PORT, e.g. 127.0.0.1:50051 (this device only) or 0.0.0.0:50051 (every interface))"), "{bad}: {err}");
        }
        let err = ":99999".parse::<ListenAddr>().unwrap_err();
        assert!(err.contains("no host before the port") && err.ends_with("(every interface), or unix:PATH)"), "{err}");
    }

    #[tokio::test]
    async fn unix_socket_is_0600_stale_files_go_live_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.sock");
        let addr = ListenAddr::Unix(path.clone());
        let first = Listener::bind(&addr).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        assert_eq!(first.local_addr().unwrap(), addr);
        std::os::unix::net::UnixStream::connect(&path).expect("the renamed socket accepts");
        let err = Listener::bind(&addr)
            .await
            .err()
            .expect("a live socket is not taken over")
            .to_string();
        assert!(err.contains("another server is listening"), "{err}");
        drop(first);
        assert!(!path.exists(), "removed on drop");

        // A stale socket (its listener gone without removing it) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let again = Listener::bind(&addr).await.unwrap();
        std::os::unix::net::UnixStream::connect(&path).unwrap();
        drop(again);

        let file = dir.path().join("plain");
        std::fs::write(&file, "data").unwrap();
        let err = Listener::bind(&ListenAddr::Unix(file.clone()))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no leftovers"
        );
    }
}
