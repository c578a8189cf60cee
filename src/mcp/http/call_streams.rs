//! A call's own stream: the log notes of a request travel on that request's
//! POST response stream, not on the session's GET stream.
//!
//! rmcp's session worker routes only progress and cancellation
//! notifications to a request's stream; every other notification goes to
//! the GET stream, which many clients never open. [`CallStreams`] wraps the
//! session manager: each request stream it opens gets a small side channel,
//! registered before the request is handed to the session, and the
//! session's transport puts a notification marked with
//! [`CallStream`](crate::mcp::logging::CallStream) on the side channel of
//! the request it names. A note whose request stream is gone (or full)
//! falls back to the session's own routing.
//!
//! The session's transport also tells when the session's worker is gone
//! (its idle expiry, its closing): [`SessionEnds`] fires the session's end
//! then, which cancels the calls still running in it.
//!
//! Without sessions nothing here is needed: the one request's messages all
//! travel on its response already.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, RequestId, ServerJsonRpcMessage, ServerNotification};
use rmcp::transport::Transport;
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::mcp::logging::CallStream;

/// Notes one call may have waiting on its stream (a call sends at most a
/// few); past it, notes take the session's own route.
const NOTES_PER_CALL: usize = 16;

type Routes = Arc<Mutex<HashMap<(SessionId, RequestId), mpsc::Sender<ServerSseMessage>>>>;

fn lock(
    routes: &Routes,
) -> std::sync::MutexGuard<'_, HashMap<(SessionId, RequestId), mpsc::Sender<ServerSseMessage>>> {
    routes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Each live session's end: fired when the session's worker is gone, and
/// forgotten with its transport.
#[derive(Debug, Clone, Default)]
pub(super) struct SessionEnds(Arc<Mutex<HashMap<SessionId, CancellationToken>>>);

impl SessionEnds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, CancellationToken>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The end of session `id` (already fired when it is not live).
    pub(super) fn ended(&self, id: &str) -> CancellationToken {
        self.lock().get(id).cloned().unwrap_or_else(|| {
            let gone = CancellationToken::new();
            gone.cancel();
            gone
        })
    }

    fn open(&self, id: &SessionId) -> CancellationToken {
        let ended = CancellationToken::new();
        self.lock().insert(Arc::clone(id), ended.clone());
        ended
    }
}

/// rmcp's local session manager, with each request's notes on its stream.
#[derive(Debug)]
pub(super) struct CallStreams {
    inner: Arc<LocalSessionManager>,
    routes: Routes,
    ends: SessionEnds,
}

impl CallStreams {
    pub(super) fn new(inner: Arc<LocalSessionManager>, ends: SessionEnds) -> Self {
        CallStreams {
            inner,
            routes: Routes::default(),
            ends,
        }
    }

    fn wrap(
        &self,
        id: SessionId,
        inner: <LocalSessionManager as SessionManager>::Transport,
    ) -> SessionTransport {
        SessionTransport {
            inner,
            ended: self.ends.open(&id),
            ends: self.ends.clone(),
            session: id,
            routes: Arc::clone(&self.routes),
        }
    }
}

/// A session's transport: marked notes to their call's stream, the rest
/// to the session.
pub(super) struct SessionTransport {
    inner: <LocalSessionManager as SessionManager>::Transport,
    session: SessionId,
    routes: Routes,
    /// Fired when the session's worker is gone.
    ended: CancellationToken,
    ends: SessionEnds,
}

impl Drop for SessionTransport {
    fn drop(&mut self) {
        self.ended.cancel();
        self.ends.lock().remove(&self.session);
    }
}

impl SessionTransport {
    /// `item` back when it is not a marked note of a call whose stream is
    /// open and has room.
    fn to_call_stream(&self, item: ServerJsonRpcMessage) -> Option<ServerJsonRpcMessage> {
        let request = match &item {
            ServerJsonRpcMessage::Notification(n) => match &n.notification {
                ServerNotification::LoggingMessageNotification(note) => {
                    note.extensions.get::<CallStream>().map(|c| c.0.clone())
                }
                _ => None,
            },
            _ => None,
        };
        let Some(request) = request else {
            return Some(item);
        };
        let sender = lock(&self.routes)
            .get(&(Arc::clone(&self.session), request))
            .cloned();
        let Some(sender) = sender else {
            return Some(item);
        };
        let message = ServerSseMessage::from_message(item);
        match sender.try_send(message) {
            Ok(()) => None,
            Err(
                mpsc::error::TrySendError::Full(back) | mpsc::error::TrySendError::Closed(back),
            ) => back.message.and_then(|m| Arc::try_unwrap(m).ok()),
        }
    }
}

impl Transport<RoleServer> for SessionTransport {
    type Error =
        <<LocalSessionManager as SessionManager>::Transport as Transport<RoleServer>>::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let rest = self.to_call_stream(item);
        let forwarded = rest.map(|item| self.inner.send(item));
        async move {
            match forwarded {
                Some(send) => send.await,
                None => Ok(()),
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ClientJsonRpcMessage>> + Send {
        let ended = &self.ended;
        let received = self.inner.receive();
        async move {
            let message = received.await;
            if message.is_none() {
                // The worker is gone: the session has ended.
                ended.cancel();
            }
            message
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// A request's stream: its side channel first, then the session's
/// messages; it ends when the session's part ends (after the response).
struct RequestStream<S> {
    notes: mpsc::Receiver<ServerSseMessage>,
    rest: Pin<Box<S>>,
    /// Unregisters the side channel when the stream is dropped.
    _route: Option<Route>,
}

struct Route {
    routes: Routes,
    key: (SessionId, RequestId),
}

impl Drop for Route {
    fn drop(&mut self) {
        lock(&self.routes).remove(&self.key);
    }
}

impl<S: Stream<Item = ServerSseMessage>> Stream for RequestStream<S> {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Poll::Ready(Some(note)) = self.notes.poll_recv(cx) {
            return Poll::Ready(Some(note));
        }
        self.rest.as_mut().poll_next(cx)
    }
}

impl SessionManager for CallStreams {
    type Error = <LocalSessionManager as SessionManager>::Error;
    type Transport = SessionTransport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, inner) = self.inner.create_session().await?;
        Ok((id.clone(), self.wrap(id, inner)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let (notes, route) = match &message {
            ClientJsonRpcMessage::Request(request) => {
                // Registered before the request reaches the session: its
                // handler may send a note at once.
                let key = (Arc::clone(id), request.id.clone());
                let (sender, notes) = mpsc::channel(NOTES_PER_CALL);
                lock(&self.routes).insert(key.clone(), sender);
                let route = Route {
                    routes: Arc::clone(&self.routes),
                    key,
                };
                (notes, Some(route))
            }
            _ => (mpsc::channel(1).1, None),
        };
        let rest = self.inner.create_stream(id, message).await?;
        Ok(RequestStream {
            notes,
            rest: Box::pin(rest),
            _route: route,
        })
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        Ok(match self.inner.restore_session(id.clone()).await? {
            RestoreOutcome::Restored(inner) => RestoreOutcome::Restored(self.wrap(id, inner)),
            RestoreOutcome::AlreadyPresent => RestoreOutcome::AlreadyPresent,
            _ => RestoreOutcome::NotSupported,
        })
    }

    fn event_store(
        &self,
    ) -> Option<Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>> {
        self.inner.event_store()
    }
}
