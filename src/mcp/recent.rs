//! A small map that keeps the most recently used entries: per-caller state
//! of the HTTP server, keyed by a digest of the caller's key.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// At most `capacity` entries; inserting past it drops the least recently
/// used (looked up or inserted) one. Every operation is O(log n): the
/// entries are also ordered by their last use.
pub(crate) struct Recent<K, V> {
    entries: HashMap<K, (V, u64)>,
    /// The key of each entry by its last use.
    by_use: BTreeMap<u64, K>,
    clock: u64,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> Recent<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Recent {
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
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
        if let Some(key) = self.by_use.remove(used) {
            self.by_use.insert(now, key);
        }
        *used = now;
        Some(value)
    }

    /// Stores `value` for `key`, first dropping the least recently used
    /// entry when full.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        let now = self.tick();
        match self.entries.get(&key) {
            Some((_, used)) => {
                self.by_use.remove(used);
            }
            None if self.entries.len() >= self.capacity => {
                if let Some((_, oldest)) = self.by_use.pop_first() {
                    self.entries.remove(&oldest);
                }
            }
            None => {}
        }
        self.by_use.insert(now, key.clone());
        self.entries.insert(key, (value, now));
    }

    /// Takes the entry for `key` out.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let (value, used) = self.entries.remove(key)?;
        self.by_use.remove(&used);
        Some(value)
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

    #[test]
    fn the_order_of_use_stays_whole_through_replacements_and_removals() {
        let mut recent = Recent::new(3);
        for round in 0..100u32 {
            recent.insert(round % 5, round);
            if round % 7 == 0 {
                recent.remove(&(round % 3));
            }
            let _ = recent.get(&(round % 4));
            assert!(recent.len() <= 3);
            assert_eq!(recent.entries.len(), recent.by_use.len(), "round {round}");
        }
        recent.insert(10, 0);
        recent.insert(11, 0);
        recent.insert(12, 0);
        assert_eq!(recent.len(), 3, "the newest three are kept");
        assert!(recent.get(&10).is_some() && recent.get(&11).is_some());
    }
}
