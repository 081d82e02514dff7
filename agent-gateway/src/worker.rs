//! Connections to device-workers and episode routing.
//!
//! An episode always goes to the same worker (episode affinity), so the worker's slot for
//! that episode keeps its KV cache between steps. The choice is a stable hash of the episode
//! id over the configured workers; a worker that failed with UNAVAILABLE (unreachable,
//! restarting) is skipped for [`DOWN_FOR`], its episodes going to the next worker in ring
//! order (they lose their cached prefix there, not their answers).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tandem_auth::{BearerInterceptor, ClientTls};
use tandem_proto::step::v1::step_service_client::StepServiceClient;
use tandem_proto::step::v1::{ModelInfo, StatusRequest};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::error::GatewayError;
use crate::screenshot::WorkerVision;

/// One configured worker.
#[derive(Clone)]
pub struct Worker {
    /// The address as configured (`http://127.0.0.1:50051`, `https://...`, `unix:PATH`).
    pub addr: String,
    pub client: WorkerClient,
    /// Its model as its Status last reported it ([`Worker::model`]).
    model: Arc<Mutex<Option<(ModelInfo, Instant)>>>,
    /// The client's channel without the token (gRPC health, [`Worker::not_a_worker`]).
    channel: Channel,
}

/// How long a worker's reported model (its id, its image support) is trusted before
/// [`Worker::model`] asks again (a worker restarted with another model, or with or without
/// `--mmproj`, is seen within this time).
pub const MODEL_TTL: Duration = Duration::from_secs(30);

/// How long [`Worker::model`] waits for the worker's Status.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

impl Worker {
    /// The worker's model (`StatusResponse.model`), cached for [`MODEL_TTL`]; `fresh`: ask
    /// the worker now whatever the cache holds. `None` (not cached) when the Status call fails
    /// or times out ([`STATUS_TIMEOUT`]) or no model is loaded yet.
    pub async fn model(&self, fresh: bool) -> Option<ModelInfo> {
        if !fresh {
            if let Some((m, at)) = &*self.model.lock().unwrap_or_else(PoisonError::into_inner) {
                if at.elapsed() < MODEL_TTL {
                    return Some(m.clone());
                }
            }
        }
        let mut client = self.client.clone();
        let answer = tokio::time::timeout(STATUS_TIMEOUT, client.status(StatusRequest {})).await;
        let model = match answer {
            Ok(Ok(r)) => r.into_inner().model,
            Ok(Err(s)) => {
                tracing::debug!(worker = %self.addr, status = %s, "worker status failed; its model is unknown");
                None
            }
            Err(_) => {
                tracing::debug!(worker = %self.addr, "worker status timed out; its model is unknown");
                None
            }
        };
        let model = model?;
        *self.model.lock().unwrap_or_else(PoisonError::into_inner) = Some((model.clone(), Instant::now()));
        Some(model)
    }

    /// What answers at the worker's address instead of a device-worker, after a call there
    /// failed with `s`: a plain HTTP/1.1 server (after a status that may come from one,
    /// [`tandem_auth::client::maybe_not_grpc`]; [`tandem_auth::client::http1_server`]), or a
    /// gRPC server without StepService (UNIMPLEMENTED; an agent-gateway when its health knows
    /// AgentService, [`crate::health::grpc_server`]). `None` when nothing says it is no worker
    /// (unreachable, still loading, an error the worker sent).
    pub async fn not_a_worker(&self, s: &tonic::Status) -> Option<String> {
        use tandem_proto::step::v1::step_service_server::SERVICE_NAME;
        if tandem_auth::client::maybe_not_grpc(s) {
            if let Some(server) = tandem_auth::client::http1_server(&self.addr).await {
                return Some(format!("it answers plain HTTP/1.1, not gRPC{}", server.looks_like()));
            }
        }
        match s.code() {
            tonic::Code::Unimplemented => Some(match crate::health::grpc_server(self.channel.clone()).await {
                Some(server) => format!("it is {}", server.what()),
                None => format!("it answers gRPC but does not serve {SERVICE_NAME}"),
            }),
            _ => None,
        }
    }

    /// Whether the worker takes images: its `StatusResponse.model.vision` (a vision projector,
    /// `--mmproj`), from [`Worker::model`]. [`WorkerVision::Unknown`] when its model is unknown.
    pub async fn vision(&self) -> WorkerVision {
        match self.model(false).await {
            None => WorkerVision::Unknown,
            Some(m) if m.vision.is_some() => WorkerVision::Yes,
            Some(_) => WorkerVision::No,
        }
    }
}

/// A StepService client that sends the gateway's bearer token (`--worker-token-file`), if any.
pub type WorkerClient = StepServiceClient<InterceptedService<Channel, BearerInterceptor>>;

/// A lazily connecting channel to the worker at `a` and the address as [`Worker::addr`]
/// ([`tandem_auth::client::channel`]).
fn channel(a: &str, tls: Option<&ClientTls>) -> Result<(String, Channel), GatewayError> {
    tandem_auth::client::channel(a, tls, "--worker-tls-ca").map_err(|e| GatewayError::Config(format!("worker {e}")))
}

/// How long a worker that answered UNAVAILABLE is skipped by [`Router::route`].
pub const DOWN_FOR: Duration = Duration::from_secs(10);

/// Routes episodes to workers.
#[derive(Clone)]
pub struct Router {
    workers: Vec<Worker>,
    /// Per worker: skipped until this time (ms since the Unix epoch; 0 = healthy).
    down_until_ms: Arc<Vec<AtomicU64>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Router {
    /// Lazily connecting clients for `addrs` (connections open on first use, so the
    /// gateway can start before its workers).
    ///
    /// Errors: [`GatewayError::Config`] for no worker or an invalid address.
    pub fn new(addrs: &[String]) -> Result<Self, GatewayError> {
        Self::with_token(addrs, BearerInterceptor::none())
    }

    /// [`Router::new`] whose clients send `token` with every call.
    ///
    /// Errors: as [`Router::new`].
    pub fn with_token(addrs: &[String], token: BearerInterceptor) -> Result<Self, GatewayError> {
        Self::connect(addrs, token, None)
    }

    /// [`Router::with_token`] for workers at `http://HOST:PORT` (or `HOST:PORT`), `https://`
    /// (verified with `tls`: its CA, client certificate and domain) or `unix:PATH` (a Unix
    /// socket, see `device-worker serve --listen unix:PATH`).
    ///
    /// Errors: [`GatewayError::Config`] for no worker, an invalid address, or an `https://`
    /// worker without `tls` (`--worker-tls-ca`).
    pub fn connect(addrs: &[String], token: BearerInterceptor, tls: Option<&ClientTls>) -> Result<Self, GatewayError> {
        if addrs.is_empty() {
            return Err(GatewayError::Config("at least one --worker address is needed".into()));
        }
        let workers = addrs
            .iter()
            .map(|a| {
                let (addr, channel) = channel(a, tls)?;
                Ok(Worker {
                    addr,
                    client: StepServiceClient::with_interceptor(channel.clone(), token.clone()),
                    model: Arc::default(),
                    channel,
                })
            })
            .collect::<Result<Vec<_>, GatewayError>>()?;
        let down_until_ms = Arc::new(workers.iter().map(|_| AtomicU64::new(0)).collect());
        Ok(Self { workers, down_until_ms })
    }

    /// Asks every worker for its Status at start (at once, each within [`STATUS_TIMEOUT`]): an
    /// address that answers but is no device-worker ([`Worker::not_a_worker`]: the gateway's
    /// own ports, a worker's metrics port, another server) is a configuration error; a worker
    /// that does not answer (not started yet, loading, down) is logged and the gateway starts
    /// anyway, routing to it once it answers. Answers are cached as [`Worker::model`]'s.
    ///
    /// Errors: [`GatewayError::Config`] naming the first such `--worker` and what it seems to be.
    pub async fn check_workers_answer(&self) -> Result<(), GatewayError> {
        let mut probes = tokio::task::JoinSet::new();
        for (i, w) in self.workers.iter().enumerate() {
            let w = w.clone();
            probes.spawn(async move {
                let mut client = w.client.clone();
                let problem = match tokio::time::timeout(STATUS_TIMEOUT, client.status(StatusRequest {})).await {
                    Ok(Ok(r)) => {
                        if let Some(m) = r.into_inner().model {
                            *w.model.lock().unwrap_or_else(PoisonError::into_inner) = Some((m, Instant::now()));
                        }
                        None
                    }
                    Ok(Err(s)) => match w.not_a_worker(&s).await {
                        Some(why) => Some(Err(why)),
                        None => Some(Ok(tandem_auth::client::status_text(&s))),
                    },
                    Err(_) => Some(Ok(format!("no answer within {} s", STATUS_TIMEOUT.as_secs()))),
                };
                (i, problem)
            });
        }
        let mut found: Vec<(usize, Result<String, String>)> = vec![];
        while let Some(done) = probes.join_next().await {
            if let Ok((i, Some(problem))) = done {
                found.push((i, problem));
            }
        }
        found.sort_by_key(|(i, _)| *i);
        for (i, problem) in found {
            let addr = &self.workers[i].addr;
            match problem {
                Err(why) => {
                    return Err(GatewayError::Config(format!(
                        "--worker {addr} is not a device-worker: {why}; pass a worker's gRPC address, its `device-worker serve --listen` (default 127.0.0.1:50051)"
                    )))
                }
                Ok(why) => tracing::warn!(worker = %addr, error = %why, "worker does not answer (yet); starting anyway"),
            }
        }
        Ok(())
    }

    /// The worker for `episode_id`: FNV-1a hash modulo the number of workers, or the next one
    /// in ring order that is not marked down (the hashed one when all are).
    pub fn route(&self, episode_id: &str) -> &Worker {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in episode_id.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let n = self.workers.len();
        let first = (h % n as u64) as usize;
        let now = now_ms();
        (0..n)
            .map(|k| (first + k) % n)
            .find(|&i| self.down_until_ms[i].load(Ordering::Relaxed) <= now)
            .map_or(&self.workers[first], |i| &self.workers[i])
    }

    /// Marks the worker at `addr` down for [`DOWN_FOR`] (after an UNAVAILABLE answer).
    pub fn mark_down(&self, addr: &str) {
        if let Some(i) = self.workers.iter().position(|w| w.addr == addr) {
            let until = now_ms() + DOWN_FOR.as_millis() as u64;
            self.down_until_ms[i].store(until, Ordering::Relaxed);
            tracing::warn!(worker = addr, down_s = DOWN_FOR.as_secs(), "worker unavailable; routing around it");
        }
    }

    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn worker_addresses_are_checked_at_start() {
        let r = Router::new(&["127.0.0.1:1".into(), "unix:/tmp/w.sock".into()]).unwrap();
        let addrs: Vec<_> = r.workers().iter().map(|w| w.addr.as_str()).collect();
        assert_eq!(addrs, ["http://127.0.0.1:1", "unix:/tmp/w.sock"]);
        let err = |a: &str| Router::new(&[a.to_string()]).err().expect("refused").to_string();
        assert!(err("unix:").contains("needs a socket path"));
        assert!(err("https://127.0.0.1:1").contains("no --worker-tls-ca"));
    }

    #[tokio::test]
    async fn routing_is_stable_and_spreads_episodes() {
        let r = Router::new(&["127.0.0.1:1".into(), "127.0.0.1:2".into(), "127.0.0.1:3".into()]).unwrap();
        let a = r.route("episode-42").addr.clone();
        for _ in 0..5 {
            assert_eq!(r.route("episode-42").addr, a);
        }
        let used: std::collections::HashSet<_> = (0..50).map(|i| r.route(&format!("e{i}")).addr.clone()).collect();
        assert_eq!(used.len(), 3);
        assert!(Router::new(&[]).is_err());
    }

    #[tokio::test]
    async fn a_worker_marked_down_is_skipped_and_its_episodes_move_to_the_next() {
        let r = Router::new(&["127.0.0.1:1".into(), "127.0.0.1:2".into()]).unwrap();
        let (a, b) = (r.workers()[0].addr.clone(), r.workers()[1].addr.clone());
        let on_a = (0..50).map(|i| format!("e{i}")).find(|e| r.route(e).addr == a).unwrap();
        r.mark_down(&a);
        assert_eq!(r.route(&on_a).addr, b);
        // Every worker down: the hashed one (nothing better to do).
        r.mark_down(&b);
        assert_eq!(r.route(&on_a).addr, a);
    }
}
