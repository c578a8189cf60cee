//! [`Checkpoint`]: where a streamed turn stands, small enough to persist,
//! so that another process continues it exactly; and [`TextDigest`], its
//! proof of the text delivered up to it.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The event id that stands for "the whole turn was delivered": what
/// [`QueryTurn::last_event_id`](crate::QueryTurn::last_event_id) reports
/// once the rest of the answer came from the final Query (after a gap the
/// events could not fill). Continuing after it delivers no more text, only
/// the final Query.
pub const END_OF_TURN: u64 = u64::MAX;

/// The bytes at the beginning of the delivered text a checkpoint keeps the
/// digest of, and a resumed replay is compared with (see `Checkpoint::head`).
pub(crate) const HEAD_BYTES: usize = 64;

/// The Mersenne prime 2^61 - 1: the digest's arithmetic is modulo it.
const PRIME: u64 = (1 << 61) - 1;
/// The two polynomial bases of the text's hash (fixed: a checkpoint is
/// read by other builds of this crate).
const TEXT_BASES: [u64; 2] = [0x0d4f_0b8e_93a2_c761, 0x0b3c_5e27_d1f9_4a85];
/// The bases that turn a query id into the digest's key.
const KEY_BASES: [u64; 2] = [0x05a9_e3c1_7f24_8d3b, 0x1234_9fe1_c0a7_5b69];

/// `x` modulo [`PRIME`], for `x < 2^64`.
fn reduce(x: u64) -> u64 {
    let y = (x & PRIME) + (x >> 61);
    if y >= PRIME { y - PRIME } else { y }
}

/// `a * b` modulo [`PRIME`], for `a, b < PRIME`.
fn mul_mod(a: u64, b: u64) -> u64 {
    let x = u128::from(a) * u128::from(b);
    // x < 2^122: its low 61 bits plus the rest (< 2^61) fit in a u64.
    let low = (x as u64) & PRIME;
    let high = (x >> 61) as u64;
    reduce(low + high)
}

/// `x` modulo [`PRIME`], for `x < 2^125`.
fn reduce_wide(x: u128) -> u64 {
    // Its low 61 bits plus the rest (< 2^64) fit in a u128 below 2^65;
    // once more, and the sum fits in a u64.
    let folded = u128::from((x as u64) & PRIME) + (x >> 61);
    reduce(((folded as u64) & PRIME) + (folded >> 61) as u64)
}

/// The bytes Horner's rule takes per step in [`horner`].
const BLOCK: usize = 8;

/// Horner's rule over `bytes` (each as `byte + 1`, so that zero bytes
/// count), per lane: `lane = lane * base + byte + 1`. Taken [`BLOCK`] bytes
/// at a time (`lane * base^8 + sum of (byte_k + 1) * base^(7-k)`, the same
/// value), so that the products of a block do not wait on each other.
fn horner(mut lanes: [u64; 2], bases: [u64; 2], bytes: &[u8]) -> [u64; 2] {
    let mut powers = [[1u64; BLOCK + 1]; 2];
    for (power, base) in powers.iter_mut().zip(bases) {
        for k in 1..=BLOCK {
            power[k] = mul_mod(power[k - 1], base);
        }
    }
    let mut blocks = bytes.chunks_exact(BLOCK);
    for block in &mut blocks {
        for (lane, power) in lanes.iter_mut().zip(&powers) {
            // < 2^122 + 8 * 2^70: well below 2^125.
            let mut x = u128::from(*lane) * u128::from(power[BLOCK]);
            for (k, &b) in block.iter().enumerate() {
                x += u128::from(u64::from(b) + 1) * u128::from(power[BLOCK - 1 - k]);
            }
            *lane = reduce_wide(x);
        }
    }
    for &b in blocks.remainder() {
        for (lane, base) in lanes.iter_mut().zip(bases) {
            *lane = reduce(mul_mod(*lane, base) + u64::from(b) + 1);
        }
    }
    lanes
}

/// The unkeyed running hash of a text: a polynomial hash, which a turn
/// extends delta by delta and which a resumed turn continues from a
/// checkpoint's digest alone (the text before it is not needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RollingText([u64; 2]);

impl RollingText {
    /// Extends the hash by `bytes`.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.0 = horner(self.0, TEXT_BASES, bytes);
    }

    /// The hash of `bytes`.
    pub(crate) fn of(bytes: &[u8]) -> Self {
        let mut r = RollingText::default();
        r.push(bytes);
        r
    }
}

/// The key a turn's id gives its digests.
fn key_of(query_id: &str) -> [u64; 2] {
    horner([1, 1], KEY_BASES, query_id.as_bytes())
}

/// A constant-size digest of the answer text delivered up to a
/// [`Checkpoint`], keyed by the turn's id: the same text of another turn
/// has another digest. Its text form is 32 lowercase hex digits.
///
/// It is a polynomial hash (two lanes modulo 2^61 - 1), so that a turn
/// resumed in another process extends it without the text before the
/// checkpoint. It detects a stored answer that does not begin with the
/// delivered text (another turn's answer, a changed one, a spliced one);
/// it is not a signature against a server that forges collisions.
///
/// ```
/// use nexus_knowql::query::TextDigest;
/// let a = TextDigest::of("q_1", "Travel is approved");
/// assert_eq!(a, TextDigest::of("q_1", "Travel is approved"));
/// assert_ne!(a, TextDigest::of("q_1", "Travel is refused"));
/// assert_ne!(a, TextDigest::of("q_2", "Travel is approved"));
/// assert_eq!(a.to_string().parse::<TextDigest>().unwrap(), a);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TextDigest([u64; 2]);

impl TextDigest {
    /// The digest of `text` delivered by turn `query_id`.
    pub fn of(query_id: &str, text: &str) -> Self {
        TextDigest::seal(query_id, RollingText::of(text.as_bytes()))
    }

    /// Keys a running hash with the turn's id.
    pub(crate) fn seal(query_id: &str, text: RollingText) -> Self {
        let key = key_of(query_id);
        TextDigest([reduce(text.0[0] + key[0]), reduce(text.0[1] + key[1])])
    }

    /// The running hash this digest seals for turn `query_id` (what a
    /// resumed turn extends).
    pub(crate) fn open(self, query_id: &str) -> RollingText {
        let key = key_of(query_id);
        RollingText([
            reduce(self.0[0] + PRIME - key[0]),
            reduce(self.0[1] + PRIME - key[1]),
        ])
    }
}

impl fmt::Display for TextDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.0[0], self.0[1])
    }
}

impl FromStr for TextDigest {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || Error::InvalidRequest("not a text digest (32 hex digits)".to_owned());
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let lane = |part: &str| {
            u64::from_str_radix(part, 16)
                .ok()
                .filter(|&v| v < PRIME)
                .ok_or_else(bad)
        };
        Ok(TextDigest([lane(&s[..16])?, lane(&s[16..])?]))
    }
}

impl serde::Serialize for TextDigest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TextDigest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A resume point of a streamed turn: the turn, the last event delivered,
/// how many bytes of answer text were delivered up to it, and their
/// [`TextDigest`].
///
/// Persist it as you go ([`QueryTurn::checkpoint`](crate::QueryTurn::checkpoint));
/// another process continues with
/// [`QueryHandle::resume_from`](crate::QueryHandle::resume_from), which
/// checks that the turn's final answer begins with exactly the text the
/// checkpoint proves, and the rest against what follows. Its text form
/// (`Display` / `FromStr`, also serde) is one line,
/// `query_id:event_id:text_len:digest:head` (`head` may be absent).
///
/// ```
/// use nexus_knowql::query::Checkpoint;
/// let cp = Checkpoint::after_text("q_123", 42, "Travel is approved");
/// assert_eq!((cp.query_id.as_str(), cp.event_id, cp.text_len), ("q_123", 42, 18));
/// assert_eq!(cp.to_string().parse::<Checkpoint>().unwrap(), cp);
/// assert!(cp.proves_prefix_of("Travel is approved by your manager."));
/// assert!(!cp.proves_prefix_of("Travel is refused by your manager."));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint {
    /// The turn.
    pub query_id: String,
    /// The last event delivered (0: none; [`END_OF_TURN`]: all of the answer).
    pub event_id: u64,
    /// The bytes of answer text delivered up to `event_id`.
    pub text_len: u64,
    /// The digest of those bytes.
    pub digest: TextDigest,
    /// The digest of their first 64 bytes (all of them when fewer): what lets a resumed turn recognise a replay that starts the
    /// answer again (renumbered events, deltas without ids) and drop the
    /// text already delivered. `None` in a checkpoint written without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<TextDigest>,
}

impl Checkpoint {
    /// The checkpoint of turn `query_id` after event `event_id`, once
    /// `delivered` (all the answer text up to it) was delivered.
    pub fn after_text(query_id: impl Into<String>, event_id: u64, delivered: &str) -> Self {
        let query_id = query_id.into();
        let digest = TextDigest::of(&query_id, delivered);
        let head_len = delivered.len().min(HEAD_BYTES);
        let head = RollingText::of(&delivered.as_bytes()[..head_len]);
        Checkpoint {
            head: Some(TextDigest::seal(&query_id, head)),
            query_id,
            event_id,
            text_len: u64::try_from(delivered.len()).unwrap_or(u64::MAX),
            digest,
        }
    }

    /// The running hash of the text's first `HEAD_BYTES` bytes, when known.
    pub(crate) fn head_rolling(&self) -> Option<RollingText> {
        self.head.map(|head| head.open(&self.query_id))
    }

    /// The checkpoint before anything of turn `query_id` was delivered.
    pub fn at_start(query_id: impl Into<String>) -> Self {
        Checkpoint::after_text(query_id, 0, "")
    }

    /// Whether `text` begins with exactly the text this checkpoint proves
    /// (its first `text_len` bytes have the checkpoint's digest): check a
    /// stored answer, or what a sink holds, with it.
    pub fn proves_prefix_of(&self, text: impl AsRef<[u8]>) -> bool {
        let text = text.as_ref();
        usize::try_from(self.text_len)
            .ok()
            .and_then(|n| text.get(..n))
            .is_some_and(|head| {
                TextDigest::seal(&self.query_id, RollingText::of(head)) == self.digest
            })
    }

    /// The running hash of the text before this checkpoint.
    pub(crate) fn rolling(&self) -> RollingText {
        self.digest.open(&self.query_id)
    }
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.query_id, self.event_id, self.text_len, self.digest
        )?;
        match &self.head {
            Some(head) => write!(f, ":{head}"),
            None => Ok(()),
        }
    }
}

/// Whether `id` may stand in a one-line text form: no whitespace or
/// control characters.
pub(crate) fn is_plain_id(id: &str) -> bool {
    !id.is_empty() && !id.chars().any(|c| c.is_whitespace() || c.is_control())
}

impl FromStr for Checkpoint {
    type Err = Error;

    /// Parses the text form; the error never repeats the text (it may come
    /// from a file that is not a checkpoint).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            Error::InvalidRequest("not a checkpoint (query_id:event_id:text_len:digest)".to_owned())
        };
        // `...:digest:head` when the last two parts are both digests (a
        // text length is never 32 digits), else `...:digest`.
        let mut head = None;
        let mut body = s;
        if let Some((rest, last)) = s.rsplit_once(':')
            && let Ok(h) = last.parse::<TextDigest>()
            && rest
                .rsplit_once(':')
                .is_some_and(|(_, d)| d.parse::<TextDigest>().is_ok())
        {
            head = Some(h);
            body = rest;
        }
        let mut parts = body.rsplitn(4, ':');
        let digest = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let text_len = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let event_id = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let query_id = parts.next().filter(|q| is_plain_id(q)).ok_or_else(bad)?;
        Ok(Checkpoint {
            query_id: query_id.to_owned(),
            event_id,
            text_len,
            digest,
            head,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips_and_rejects_garbage() {
        let cp = Checkpoint::after_text("q:odd", END_OF_TURN, "1234567");
        assert_eq!(cp.to_string().parse::<Checkpoint>().unwrap(), cp);
        assert!(!cp.to_string().contains('\n'));
        let d = cp.digest.to_string();
        for bad in [
            String::new(),
            "q".into(),
            "q:1:2".into(),
            format!(":1:2:{d}"),
            format!("q:x:2:{d}"),
            format!("q:1:-2:{d}"),
            format!("q q:1:2:{d}"),
            "q:1:2:zz".into(),
            format!("q:1:2:{}", "f".repeat(32)),
        ] {
            assert!(bad.parse::<Checkpoint>().is_err(), "{bad}");
        }
    }

    /// The hash of the pieces is the hash of the whole, however the text
    /// was split, and a resumed hash goes on from the digest alone.
    #[test]
    fn the_digest_extends_across_pieces_and_processes() {
        let text = "Hello, wörld: travel is approved\0 by managers.";
        for split in 0..=text.len() {
            let mut r = RollingText::default();
            r.push(&text.as_bytes()[..split]);
            let sealed = TextDigest::seal("q_7", r);
            let mut resumed = sealed.open("q_7");
            resumed.push(&text.as_bytes()[split..]);
            assert_eq!(
                TextDigest::seal("q_7", resumed),
                TextDigest::of("q_7", text)
            );
        }
        let cp = Checkpoint::after_text("q_7", 3, "Hello");
        assert!(cp.proves_prefix_of(text));
        assert!(!cp.proves_prefix_of("Hellp, world"));
        assert!(!cp.proves_prefix_of("Hell"));
        let foreign = Checkpoint {
            query_id: "q_8".into(),
            ..cp.clone()
        };
        assert!(!foreign.proves_prefix_of(text));
        assert!(Checkpoint::at_start("q").proves_prefix_of(""));
    }

    /// Horner's rule a byte at a time: the reference for the blocked one.
    fn horner_bytewise(mut lanes: [u64; 2], bases: [u64; 2], bytes: &[u8]) -> [u64; 2] {
        for &b in bytes {
            for (lane, base) in lanes.iter_mut().zip(bases) {
                *lane = ((u128::from(*lane) * u128::from(base) + u128::from(b) + 1)
                    % u128::from(PRIME)) as u64;
            }
        }
        lanes
    }

    #[test]
    fn blocked_horner_is_horner() {
        let bytes: Vec<u8> = (0..100u32).map(|i| (i * 97 % 256) as u8).collect();
        for start in [[0, 0], [PRIME - 1, PRIME - 1], [3, 5]] {
            for n in 0..bytes.len() {
                assert_eq!(
                    horner(start, TEXT_BASES, &bytes[..n]),
                    horner_bytewise(start, TEXT_BASES, &bytes[..n]),
                    "{n}"
                );
            }
            let ff = [0xff; 64];
            assert_eq!(
                horner(start, TEXT_BASES, &ff),
                horner_bytewise(start, TEXT_BASES, &ff)
            );
        }
    }

    #[test]
    fn modular_arithmetic_stays_below_the_prime() {
        let big = PRIME - 1;
        assert_eq!(mul_mod(big, big), 1);
        assert_eq!(reduce(PRIME), 0);
        assert_eq!(reduce(u64::MAX), reduce(PRIME + 7));
    }
}
