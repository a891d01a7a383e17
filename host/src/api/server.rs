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
//! - **TLS**, when given ([`super::tls`]), is handshaken in the
//!   connection's own task, within the header-read timeout.
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

/// Serves `app` on `listener` under `limits`, over `tls` when given, until
/// `shutdown` completes, then drains (see the module docs).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ServerLimits,
    tls: Option<super::tls::Tls>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    if let Some(tls) = &tls {
        tls.spawn_reloader();
    }
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
        let (app, watcher) = (app.clone(), graceful.watcher());
        match &tls {
            None => {
                tokio::spawn(serve_connection(stream, app, limits, watcher, permit));
            }
            Some(tls) => {
                let acceptor = tls.acceptor().clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => serve_connection(stream, app, limits, watcher, permit).await,
                        Ok(Err(e)) => tracing::debug!("an API connection's TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!("closing an API connection whose TLS handshake did not finish"),
                    }
                });
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("requests still under way {DRAIN:?} after the shutdown began; closing them");
    }
    Ok(())
}

/// Serves one connection's requests until it closes, holding its `permit`.
async fn serve_connection<I>(
    io: I,
    app: axum::Router,
    limits: ServerLimits,
    watcher: hyper_util::server::graceful::Watcher,
    permit: tokio::sync::OwnedSemaphorePermit,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let _permit = permit;
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    if let Err(e) = watcher.watch(connection).await {
        tracing::debug!("API connection ended: {e}");
    }
}
