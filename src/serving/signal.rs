//! The stop signal of both server commands: Ctrl-C, or SIGTERM on Unix.

/// Resolves on Ctrl-C or (on Unix) SIGTERM; on Ctrl-C alone when SIGTERM
/// cannot be watched.
pub async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
