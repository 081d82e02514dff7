//! Connections to device-workers and episode routing.
//!
//! An episode always goes to the same worker (episode affinity), so the worker's slot for
//! that episode keeps its KV cache between steps. The choice is a stable hash of the episode
//! id over the configured workers.

use tandem_proto::step::v1::step_service_client::StepServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::GatewayError;

/// One configured worker.
#[derive(Clone)]
pub struct Worker {
    /// The address as configured (`http://127.0.0.1:50051`).
    pub addr: String,
    pub client: StepServiceClient<Channel>,
}

/// Routes episodes to workers.
#[derive(Clone)]
pub struct Router {
    workers: Vec<Worker>,
}

impl Router {
    /// Lazily connecting clients for `addrs` (connections open on first use, so the
    /// gateway can start before its workers).
    ///
    /// Errors: [`GatewayError::Config`] for no worker or an invalid address.
    pub fn new(addrs: &[String]) -> Result<Self, GatewayError> {
        if addrs.is_empty() {
            return Err(GatewayError::Config("at least one --worker address is needed".into()));
        }
        let workers = addrs
            .iter()
            .map(|a| {
                let uri = if a.contains("://") { a.clone() } else { format!("http://{a}") };
                let ep = Endpoint::from_shared(uri.clone())
                    .map_err(|e| GatewayError::Config(format!("invalid worker address {a:?}: {e}")))?
                    .connect_timeout(std::time::Duration::from_secs(5))
                    .tcp_nodelay(true);
                Ok(Worker { addr: uri, client: StepServiceClient::new(ep.connect_lazy()) })
            })
            .collect::<Result<Vec<_>, GatewayError>>()?;
        Ok(Self { workers })
    }

    /// The worker for `episode_id` (FNV-1a hash modulo the number of workers).
    pub fn route(&self, episode_id: &str) -> &Worker {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in episode_id.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        &self.workers[(h % self.workers.len() as u64) as usize]
    }

    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
