//! One connection: served by hyper-util behind the per-connection request
//! limit, until it ends, is closed for silence or idleness, has a response
//! its peer does not read cut, or is cut by `kill`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{ConnectInfo, Request};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use super::activity::{Activity, with_write_progress};
use super::registry::Registered;
use super::{ForwardedClients, Limits, Server, instant_after};

/// How long a connection that was asked to close for idleness may take
/// before it is cut.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long past the request deadline a response may take to reach its
/// peer (its last bytes after the deadline cut a stream) before the
/// connection is cut.
const UNREAD_GRACE: Duration = Duration::from_secs(2);

/// The longest a connection's timer waits between checks while requests
/// may start: a response left unread is cut within this much of being due.
const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// Answers a request shed by the per-connection concurrency limit.
async fn overloaded(error: BoxError) -> Response {
    let (status, reason) = if error.is::<tower::load_shed::error::Overloaded>() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "server busy: too many requests in flight on this connection; retry later",
        )
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "request failed")
    };
    (status, reason).into_response()
}

/// What a connection's timer found.
enum Check {
    /// Nothing due: look again then.
    At(Instant),
    /// No request in flight for the idle timeout: close gracefully.
    Idle,
    /// No request head in time: close at once.
    Silent,
    /// A response not read by its deadline: cut the connection.
    Unread,
}

impl Limits {
    /// How often a connection looks at its requests at least.
    fn check_every(&self) -> Duration {
        let every = match self.response_deadline {
            Some(d) => (d.request_timeout / 4).min(d.write_stall_timeout / 2),
            None => self.idle_timeout / 3,
        };
        every.clamp(Duration::from_millis(250), MAX_CHECK_INTERVAL)
    }

    /// Checked each time a connection's timer fires: before the first
    /// request head, the head deadline; while requests run, that the
    /// oldest one's response is out by its deadline (HTTP/2 flow control
    /// and pings keep a connection open, never a response its peer does
    /// not read); once idle, the idle deadline of the last request.
    /// Between those at least every `every`, so that a request started
    /// after the timer was armed is seen in time.
    fn check(&self, activity: &Activity, opened: Instant, every: Duration) -> Check {
        let now = Instant::now();
        let soon = instant_after(now, every);
        if !activity.seen() {
            let head_deadline = instant_after(opened, self.head_timeout);
            return if now < head_deadline {
                Check::At(head_deadline.min(soon))
            } else {
                Check::Silent
            };
        }
        match activity.oldest() {
            Ok(oldest) => {
                let Some(deadline) = self.response_deadline else {
                    return Check::At(soon);
                };
                let cut = instant_after(
                    oldest,
                    deadline.request_timeout.saturating_add(UNREAD_GRACE),
                );
                // A response its peer has not taken anything of for the
                // write-stall timeout is cut too.
                let stall_cut = activity
                    .stalled_since()
                    .map(|since| instant_after(since, deadline.write_stall_timeout));
                let cut = stall_cut.map_or(cut, |stall| stall.min(cut));
                if cut <= now {
                    Check::Unread
                } else {
                    Check::At(cut.min(soon))
                }
            }
            Err(idle_since) => {
                let due = instant_after(idle_since, self.idle_timeout);
                if due > now {
                    Check::At(due.min(soon))
                } else {
                    Check::Idle
                }
            }
        }
    }
}

impl Server {
    /// The service of one connection: the app, each request counted on
    /// `activity` until its response body is done, behind the
    /// per-connection request limit.
    fn connection_service(
        &self,
        peer: SocketAddr,
        activity: Arc<Activity>,
        forwarded: Option<ForwardedClients>,
    ) -> TowerToHyperService<
        impl tower::Service<
            Request<hyper::body::Incoming>,
            Response = Response,
            Error = std::convert::Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static,
    > {
        let app = self.app.clone();
        let watch_stall = self.limits.response_deadline.is_some();
        let service = tower::service_fn(move |mut request: Request<hyper::body::Incoming>| {
            let busy = activity.start();
            request.extensions_mut().insert(ConnectInfo(peer));
            if let Some(forwarded) = &forwarded {
                request.extensions_mut().insert(forwarded.clone());
            }
            let app = app.clone();
            async move {
                let response = app.oneshot(request.map(axum::body::Body::new)).await;
                response.map(|r| with_write_progress(r, busy, watch_stall))
            }
        });
        let limit = self
            .limits
            .max_requests_per_connection
            .map_or(Semaphore::MAX_PERMITS, |n| {
                n.clamp(1, Semaphore::MAX_PERMITS)
            });
        let service = ServiceBuilder::new()
            .layer(HandleErrorLayer::new(overloaded))
            .load_shed()
            .concurrency_limit(limit)
            .service(service);
        TowerToHyperService::new(service)
    }

    /// Serves one registered connection until it ends, is closed for
    /// silence or idleness, or is cut by `kill`; asked to close (reclaimed,
    /// or the server stops), its open requests finish, and one without a
    /// request yet closes at once.
    pub(super) async fn connection(
        self,
        builder: &auto::Builder<TokioExecutor>,
        tcp: tokio::net::TcpStream,
        peer: SocketAddr,
        registered: Registered,
        kill: CancellationToken,
    ) {
        self.hooks.opened();
        let opened = Instant::now();
        let conn = Arc::clone(&registered.conn);
        let forwarded = self.forwarded_clients(peer);
        let service = self.connection_service(peer, Arc::clone(&conn.activity), forwarded.clone());
        let connection = builder.serve_connection(TokioIo::new(tcp), service);
        tokio::pin!(connection);
        let every = self.limits.check_every();
        let first = self
            .limits
            .head_timeout
            .min(self.limits.idle_timeout)
            .min(every);
        let timer = tokio::time::sleep_until(instant_after(opened, first));
        tokio::pin!(timer);
        let (close, killed) = (conn.close.cancelled(), kill.cancelled());
        tokio::pin!(close, killed);
        let (mut closing, mut asked) = (false, false);
        loop {
            tokio::select! {
                biased;
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    break;
                }
                () = &mut timer => {
                    if closing {
                        break;
                    }
                    match self.limits.check(&conn.activity, opened, every) {
                        Check::At(at) => timer.as_mut().reset(at),
                        Check::Idle => {
                            tracing::debug!(%peer, "idle connection closed");
                            connection.as_mut().graceful_shutdown();
                            closing = true;
                            timer.as_mut().reset(instant_after(Instant::now(), CLOSE_GRACE));
                        }
                        // Nothing earned yet: cut at once, whatever the protocol.
                        Check::Silent => {
                            self.hooks.silent(peer);
                            break;
                        }
                        // Dropping the connection resets its streams and
                        // drops their bodies, and with them their slots.
                        Check::Unread => {
                            self.hooks.unread(peer);
                            self.cut_for_no_progress(peer, forwarded.as_ref());
                            break;
                        }
                    }
                }
                () = &mut close, if !asked => {
                    asked = true;
                    if !conn.activity.seen() {
                        tracing::debug!(%peer, "connection closed before its first request");
                        break;
                    }
                    connection.as_mut().graceful_shutdown();
                }
                () = &mut killed => break,
            }
        }
        self.hooks.closed();
        drop(registered);
    }
}
