//! The HTTP server under the API: accepts connections and serves each with
//! hyper, bounding what a client can hold open before any request of its
//! reaches the router (which bounds requests: see [`super::admission`]).
//!
//! - **Open connections** are capped ([`ServerLimits::max_connections`]): one
//!   past the cap is closed at once, rather than left waiting in the
//!   kernel's queue where a liveness probe would wait behind it.
//! - **Headers** must arrive within [`ServerLimits::header_read_timeout`] of
//!   the connection opening, and a keep-alive connection's next request
//!   within that long of the last response: a client that connects and
//!   sends nothing (slowloris), or leaves a connection idle, is closed.
//!   (hyper starts its header timer whenever it waits for a request's head,
//!   so one timer bounds both.)
//! - **Shutdown** stops accepting, lets requests under way finish (at most
//!   [`DRAIN`]) and closes idle connections at once.
//!
//! The server never decides who may do what: that is the router's
//! authentication and admission, per tenant.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How the server bounds connections.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Connections open at once; one more is closed as soon as it is
    /// accepted.
    pub max_connections: usize,
    /// The longest a connection may take to send a request's headers,
    /// counted from when it opened or answered its last request: so also
    /// the longest a connection stays open idle.
    pub header_read_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits { max_connections: 1024, header_read_timeout: Duration::from_secs(30) }
    }
}

/// The longest shutdown waits for requests under way.
pub const DRAIN: Duration = Duration::from_secs(30);

/// A pause after a failed `accept` (too many open files, say), so the loop
/// does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` under `limits` until `shutdown` completes,
/// then drains (see the module docs).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    tracing::warn!("accepting an API connection: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            tracing::debug!("closing an API connection: {} are open already", limits.max_connections);
            drop(stream);
            continue;
        };
        // Small answers go out at once (no Nagle wait for the next write).
        let _ = stream.set_nodelay(true);
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection.await {
                tracing::debug!("API connection ended: {e}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("requests still under way {DRAIN:?} after the shutdown began; closing them");
    }
    Ok(())
}
