//! The HTTP server loop: hyper-util connections (HTTP/1.1 with a
//! header-read timeout, or HTTP/2), with `TCP_NODELAY`, until shutdown.

use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio_util::sync::CancellationToken;

/// How long a client has to send a request head; then the connection is
/// closed (a silent peer gets no lasting connection).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may finish after shutdown begins.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `stop` is cancelled, then lets open
/// connections finish (up to a grace time).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stop: CancellationToken,
    header_read_timeout: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        // Event streams are many small writes: without TCP_NODELAY, Nagle's
        // algorithm meets the peer's delayed ACK and stalls frames ~40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let connection = builder
            .serve_connection_with_upgrades(
                TokioIo::new(tcp),
                TowerToHyperService::new(app.clone()),
            )
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                let timed_out = e
                    .downcast_ref::<hyper::Error>()
                    .is_some_and(hyper::Error::is_timeout);
                if timed_out {
                    tracing::debug!(%peer, "request head not received in time; connection closed");
                } else {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            }
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(CLOSE_GRACE) => {
            tracing::debug!("connections still open at shutdown");
        }
    }
}
