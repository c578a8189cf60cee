//! One call's attempts: what they share, and what becomes of each
//! attempt's answer or failure (redirects, a renewed login, retries).

use reqwest::{Request, Response, StatusCode};

use super::{
    Auth, Rebuild, RedirectRefused, Transport, bounded, may_have_reached_server,
    normalize_error_body, redirect, redirect_refused_response, redirect_target, retry,
    take_request,
};

/// One call across its attempts: what every attempt shares, and the
/// budgets they spend.
pub(super) struct Attempts<'a> {
    pub(super) origin: reqwest::Url,
    pub(super) operation: &'a str,
    pub(super) sent_version: String,
    pub(super) idempotent: bool,
    pub(super) streams: bool,
    pub(super) started: tokio::time::Instant,
    pub(super) until: Option<tokio::time::Instant>,
    pub(super) backoff: retry::Backoff,
    pub(super) retries: u32,
    pub(super) relogged_in: bool,
    pub(super) redirects: usize,
}

/// What becomes of one attempt's outcome.
pub(super) enum Answered {
    /// Send the request again (any wait is over).
    Again,
    /// The call's answer.
    Done(Response),
}

/// The request for the next attempt, and whether it is the last one: a
/// body that cannot be cloned (a stream) allows one attempt unless the
/// caller can rebuild the request.
pub(super) fn next_attempt(req: &mut Request, rebuild: Option<&Rebuild<'_>>) -> (Request, bool) {
    match (req.try_clone(), rebuild) {
        (Some(r), _) => (r, false),
        (None, Some(make)) => match make() {
            Some(next) => (std::mem::replace(req, next), false),
            None => (take_request(req), true),
        },
        (None, None) => (take_request(req), true),
    }
}

/// A redirect reqwest left to the transport (the body could not be sent
/// twice, or a custom client follows none): refused, followed (`Again`,
/// with `req` sent to its target), or `None` to take the answer as it is.
fn redirect_step(
    call: &mut Attempts<'_>,
    req: &mut Request,
    resp: &Response,
    last_chance: bool,
) -> Option<Answered> {
    let next = redirect_target(resp)?;
    if !redirect::same_origin(&call.origin, &next) {
        return Some(Answered::Done(redirect_refused_response(
            RedirectRefused::refused(&next),
        )));
    }
    let keeps_method = matches!(resp.status().as_u16(), 307 | 308);
    if keeps_method && crate::error::starts_turn(call.operation) {
        // Following would send `POST /query` again.
        return Some(Answered::Done(redirect_refused_response(
            RedirectRefused::starts_turn(&next),
        )));
    }
    if keeps_method && call.redirects >= redirect::MAX_REDIRECTS {
        return Some(Answered::Done(redirect_refused_response(
            RedirectRefused::too_many(&next),
        )));
    }
    if keeps_method && !last_chance {
        call.redirects += 1;
        *req.url_mut() = next;
        return Some(Answered::Again);
    }
    None
}

impl Transport {
    /// An answer to one attempt: refused if it came from elsewhere, a
    /// redirect followed, a login renewed, a retry waited out, or the
    /// call's answer. `sent` is the attempt's token generation and whether
    /// it was the last one the body allows.
    pub(super) async fn on_answer(
        &self,
        call: &mut Attempts<'_>,
        req: &mut Request,
        resp: Response,
        span: &tracing::Span,
        (token_generation, last_chance): (Option<u64>, bool),
    ) -> Answered {
        if !redirect::same_origin(&call.origin, resp.url()) {
            let refused = RedirectRefused::followed(resp.url());
            return Answered::Done(redirect_refused_response(refused));
        }
        let status = resp.status();
        if let Some(answered) = redirect_step(call, req, &resp, last_chance) {
            return answered;
        }
        span.record("http.status_code", status.as_u16());
        self.observe_version(&call.sent_version, resp.headers());
        if status == StatusCode::UNAUTHORIZED
            && !call.relogged_in
            && !last_chance
            && let (Auth::Login(state), Some(generation)) = (&self.inner.auth, token_generation)
        {
            tracing::debug!(parent: span, "token refused; logging in again");
            call.relogged_in = true;
            state.invalidate(generation);
            return Answered::Again;
        }
        let tuning = &*self.tuning;
        // A 429 was not processed: even a POST (a new turn) may go again,
        // when the server's wait fits the policy.
        let unprocessed = status == StatusCode::TOO_MANY_REQUESTS
            && retry::retry_after(resp.headers()).is_none_or(|d| d <= tuning.retry.max_delay);
        let may_retry = if call.idempotent {
            crate::error::is_retryable_status(status.as_u16())
        } else {
            unprocessed
        };
        if may_retry && !last_chance {
            let retry_after = match status.as_u16() {
                429 | 503 => tuning.retry.retry_after(resp.headers()),
                _ => None,
            };
            if let Some(delay) = self.next_delay(
                &mut call.backoff,
                &mut call.retries,
                (call.started, call.until),
                retry_after,
            ) {
                tracing::debug!(parent: span, status = status.as_u16(), delay_ms = delay.as_millis() as u64, "retrying");
                drop(resp);
                tokio::time::sleep(delay).await;
                return Answered::Again;
            }
            tracing::warn!(parent: span, status = status.as_u16(), retries = call.retries, "giving up after retries");
        }
        if status.is_client_error() || status.is_server_error() {
            return Answered::Done(normalize_error_body(resp, tuning.read_timeout).await);
        }
        if call.streams {
            return Answered::Done(resp);
        }
        Answered::Done(bounded(resp, self.inner.max_response_bytes))
    }

    /// A transport error of one attempt: what never reached the server may
    /// go again, even a POST; otherwise the error is the call's.
    pub(super) async fn on_failure(
        &self,
        call: &mut Attempts<'_>,
        err: reqwest::Error,
        span: &tracing::Span,
        last_chance: bool,
    ) -> reqwest::Result<Answered> {
        let safe = !may_have_reached_server(&err)
            || (call.idempotent && (err.is_timeout() || err.is_request()));
        if safe && !last_chance {
            let window = (call.started, call.until);
            if let Some(delay) = self.next_delay(&mut call.backoff, &mut call.retries, window, None)
            {
                tracing::debug!(parent: span, error = %err, delay_ms = delay.as_millis() as u64, "retrying after transport error");
                tokio::time::sleep(delay).await;
                return Ok(Answered::Again);
            }
            tracing::warn!(parent: span, retries = call.retries, "giving up after retries");
        }
        Err(err)
    }
}
