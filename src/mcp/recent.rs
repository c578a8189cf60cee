//! A small map that keeps the most recently used entries: per-caller state
//! of the HTTP server, keyed by a digest of the caller's key.

use std::collections::HashMap;
use std::hash::Hash;

/// At most `capacity` entries; inserting past it drops the least recently
/// used (looked up or inserted) one.
pub(crate) struct Recent<K, V> {
    entries: HashMap<K, (V, u64)>,
    clock: u64,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> Recent<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Recent {
            entries: HashMap::new(),
            clock: 0,
            capacity: capacity.max(1),
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock = self.clock.wrapping_add(1);
        self.clock
    }

    /// The entry for `key`, marked as just used.
    pub(crate) fn get(&mut self, key: &K) -> Option<&V> {
        let now = self.tick();
        let (value, used) = self.entries.get_mut(key)?;
        *used = now;
        Some(value)
    }

    /// Stores `value` for `key`, first dropping the least recently used
    /// entry when full.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        let now = self.tick();
        if !self.entries.contains_key(&key)
            && self.entries.len() >= self.capacity
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            self.entries.remove(&oldest);
        }
        self.entries.insert(key, (value, now));
    }

    /// Takes the entry for `key` out.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        self.entries.remove(key).map(|(value, _)| value)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Recent;

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut recent = Recent::new(2);
        recent.insert("a", 1);
        recent.insert("b", 2);
        assert_eq!(recent.get(&"a"), Some(&1));
        recent.insert("c", 3);
        assert_eq!(recent.len(), 2);
        assert_eq!(recent.get(&"b"), None, "b was used least recently");
        assert_eq!(recent.get(&"a"), Some(&1));
        assert_eq!(recent.get(&"c"), Some(&3));
        // Replacing an entry drops nothing else.
        recent.insert("c", 4);
        assert_eq!((recent.len(), recent.get(&"a")), (2, Some(&1)));
    }
}
