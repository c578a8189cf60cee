//! Accepting: on one thread or several (each on its own single-threaded
//! runtime, on clones of one listener), with a back-off when `accept`
//! fails, until shutdown.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{AtCapacity, Server};

/// The first wait after a failed `accept`, doubled up to
/// [`ACCEPT_BACKOFF_MAX`] while it keeps failing.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The longest wait after a failed `accept`.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

impl Server {
    /// Accepts and serves connections on the current runtime until `stop`
    /// is cancelled, then asks open connections to close once their
    /// requests are done and waits for them; `kill` cuts them.
    async fn accept_until(
        &self,
        listener: tokio::net::TcpListener,
        stop: CancellationToken,
        kill: CancellationToken,
    ) {
        let builder = self.limits.builder();
        let tracker = TaskTracker::new();
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            let Some(slot) = self.registry.before_accept(&stop).await else {
                break;
            };
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => {
                        backoff = ACCEPT_BACKOFF_MIN;
                        accepted
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: nothing can
                        // be accepted until a connection closes. Wait
                        // (longer each time, up to a second) instead of
                        // spinning.
                        self.hooks.accept_failed(&e, backoff);
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            () = stop.cancelled() => break,
                        }
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                        continue;
                    }
                },
                () = stop.cancelled() => break,
            };
            if !self.hooks.on_accept(peer) || !self.reconnect_allowed(peer) {
                continue;
            }
            let Some(registered) =
                self.registry
                    .admit(slot, peer, stop.child_token(), self.hooks.as_ref())
            else {
                continue;
            };
            // Answers go out as many small writes (event streams): without
            // TCP_NODELAY, Nagle's algorithm meets the peer's delayed ACK
            // and stalls them about 40 ms.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
            let (server, builder, kill) = (self.clone(), builder.clone(), kill.clone());
            tracker.spawn(async move {
                server
                    .connection(&builder, tcp, peer, registered, kill)
                    .await;
            });
            if matches!(self.limits.at_capacity, AtCapacity::Reclaim { .. }) {
                // The new connection's task reads its first request head
                // before the next accept, so a flood of silent connections
                // cannot push an honest one out of the handshake phase
                // before it is read.
                tokio::task::yield_now().await;
            }
        }
        // Shutdown has begun: stop listening at once, so that new clients
        // are refused by the system instead of queueing unserved.
        drop(listener);
        tracker.close();
        tracker.wait().await;
    }
}

/// Runs `server` on this thread and `threads - 1` others until `stop`,
/// and until their connections are done.
pub(super) async fn on_threads(
    server: Server,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
    kill: CancellationToken,
) -> std::io::Result<()> {
    let threads = server.limits.threads.max(1);
    if threads == 1 {
        server.accept_until(listener, stop, kill).await;
        return Ok(());
    }
    let listener = listener.into_std()?;
    let mut finished = Vec::with_capacity(threads - 1);
    for index in 1..threads {
        match spawn_acceptor(index, &listener, server.clone(), stop.clone(), kill.clone()) {
            Ok(done) => finished.push(done),
            Err(e) => {
                stop.cancel();
                kill.cancel();
                for done in finished {
                    let _ = done.await;
                }
                return Err(e);
            }
        }
    }
    let listener = tokio::net::TcpListener::from_std(listener)?;
    server.accept_until(listener, stop.clone(), kill).await;
    stop.cancel();
    for done in finished {
        // A thread that ended early has logged why.
        let _ = done.await;
    }
    Ok(())
}

/// Starts serving thread `index` on its own single-threaded runtime, on a
/// clone of `listener`; the receiver resolves when the thread is done.
fn spawn_acceptor(
    index: usize,
    listener: &std::net::TcpListener,
    server: Server,
    stop: CancellationToken,
    kill: CancellationToken,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let listener = listener.try_clone()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (done, finished) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("http-serving-{index}"))
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => server.accept_until(listener, stop, kill).await,
                    Err(e) => tracing::error!(error = %e, index, "serving thread cannot listen"),
                }
            });
            let _ = done.send(());
        })?;
    Ok(finished)
}
