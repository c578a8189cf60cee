//! Where a call's notifications (progress, log notes) go.
//!
//! A call served by an rmcp service loop (stdio, a session) sends them
//! through its peer, which the loop writes on the call's stream. A
//! stateless HTTP call is answered by the transport itself, without a
//! service loop of its own: its notifications go into a bounded channel
//! that the transport writes before the call's result ([`CallNotes`] in the
//! request's extensions).

use rmcp::model::{Extensions, ServerNotification};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use tokio::sync::mpsc;

/// The channel a stateless HTTP call's notifications go into, set in its
/// request's extensions by the transport that answers it.
#[derive(Debug, Clone)]
pub(crate) struct CallNotes(pub(crate) mpsc::Sender<ServerNotification>);

/// Sends a call's notifications where its transport writes them.
#[derive(Debug, Clone)]
pub(crate) enum Notifier {
    /// The call's own notification channel.
    Channel(mpsc::Sender<ServerNotification>),
    /// The peer of the service loop that runs the call.
    Peer(Peer<RoleServer>),
}

impl Notifier {
    /// The notifier of the call with `context`.
    pub(crate) fn of(context: &RequestContext<RoleServer>) -> Self {
        match notes_of(&context.extensions) {
            Some(notes) => Notifier::Channel(notes.0.clone()),
            None => Notifier::Peer(context.peer.clone()),
        }
    }

    /// Sends `notification`; an error when the client can no longer be
    /// told (it went away), which callers only log: the result still goes
    /// back.
    pub(crate) async fn send(&self, notification: ServerNotification) -> Result<(), Gone> {
        match self {
            Notifier::Channel(notes) => notes.send(notification).await.map_err(|_| Gone),
            Notifier::Peer(peer) => peer.send_notification(notification).await.map_err(|_| Gone),
        }
    }
}

/// A notification that could not be sent: its client went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the client of this call went away")]
pub(crate) struct Gone;

/// The [`CallNotes`] of a request, set directly or on its HTTP parts.
fn notes_of(extensions: &Extensions) -> Option<&CallNotes> {
    extensions.get::<CallNotes>().or_else(|| {
        extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<CallNotes>())
    })
}
