//! Servers without `--data` started side by side: none takes another's
//! scratch directory for the one of a server that stopped.

use serde_json::json;

use crate::support::local::*;

/// Rounds of parallel starts.
const ROUNDS: usize = 3;
/// Servers started at once in a round.
const AT_ONCE: usize = 10;

/// Catches a starting server that removes a live server's scratch
/// directory (its database then cannot be opened, or vanishes under it):
/// every one of `ROUNDS * AT_ONCE` binaries started in parallel, each
/// sweeping the temporary directory as it starts, serves a write and a
/// read. The servers of earlier rounds are killed (SIGKILL), so later
/// starts do sweep real leftovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_starts_without_data_never_take_each_others_directory() {
    for round in 0..ROUNDS {
        let starts: Vec<_> = (0..AT_ONCE)
            .map(|_| std::thread::spawn(|| LocalBinary::start(&[], &[])))
            .collect();
        let servers: Vec<LocalBinary> = starts.into_iter().map(|s| s.join().unwrap()).collect();
        for (i, server) in servers.iter().enumerate() {
            let slug = format!("r{round}s{i}");
            let (status, body) = post_json(
                &format!("{}/contexts", server.url),
                json!({"slug": slug, "name": "S"}),
            )
            .await;
            assert_eq!(status, 200, "round {round}, server {i}: {body}");
            let (status, body) = get_json(&format!("{}/contexts/{slug}", server.url)).await;
            assert_eq!(status, 200, "round {round}, server {i}: {body}");
        }
        for server in servers {
            server.kill();
        }
    }
}
