//! The keyed GCRA fast path's table: each key beside its TAT word in one flat array
//! (open addressing, linear probing), so that a lookup reads the key and its state
//! from the same cache line — one memory access where a control-byte table (hashbrown,
//! governor's DashMap) needs two — and a slot costs the key plus 8 bytes, nothing
//! more (16 bytes for a u64 key).
//!
//! An empty slot is marked by [`EMPTY`] in its word (a TAT never comes near it). The
//! table grows by half when it is 80 % full, so the fill stays between 53 % and
//! 80 %. A slot's home is `mix(hash) * capacity >> 64` (any capacity, not only powers
//! of two; `mix` is a Fibonacci multiply), and removals re-place the rest of the
//! cluster so no tombstones are left.
//!
//! Words are read and compare-and-swapped by readers that hold no lock (see
//! `reader_gate.rs`). A key is put in an empty slot while they probe ([`FlatTatTable::insert_shared`]:
//! the key is written before its word is published, and a reader reads a key only
//! after seeing its slot's word); anything that moves entries (removal, growth,
//! sweeps) takes `&mut self`, which the caller gets by shutting readers out.
//!
//! [`TatTable`] picks the flat table for plain keys and hashbrown for keys that own
//! memory (whose comparison would chase a pointer per probed slot).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The word of an empty slot.
pub(crate) const EMPTY: u64 = u64::MAX;

struct Slot<K> {
    word: AtomicU64,
    key: UnsafeCell<MaybeUninit<K>>,
}

impl<K> Slot<K> {
    fn empty() -> Self {
        Slot {
            word: AtomicU64::new(EMPTY),
            key: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Acquire: a reader that sees the word of a slot being filled also sees its key.
    fn is_empty(&self) -> bool {
        self.word.load(Ordering::Acquire) == EMPTY
    }

    /// The key of a slot this thread has seen occupied.
    fn key(&self) -> &K {
        // SAFETY: a key is written before its word leaves EMPTY (Release, see `fill`
        // and `insert_shared`) and changes only under `&mut` (`take`), so a slot seen
        // occupied holds an initialised key that nobody writes while it is borrowed.
        unsafe { (*self.key.get()).assume_init_ref() }
    }

    /// The key of an occupied slot, mutably.
    fn key_mut(&mut self) -> &mut MaybeUninit<K> {
        self.key.get_mut()
    }
}

/// A map from keys to one `AtomicU64` each (see the module doc).
pub(crate) struct FlatTatTable<K> {
    slots: Box<[Slot<K>]>,
    len: AtomicUsize,
}

// SAFETY: shared access reads keys (K: Sync) and, in `insert_shared`, moves a key in
// from the calling thread (K: Send); everything else shared is atomic.
unsafe impl<K: Send + Sync> Sync for FlatTatTable<K> {}

impl<K> Default for FlatTatTable<K> {
    fn default() -> Self {
        FlatTatTable {
            slots: Box::new([]),
            len: AtomicUsize::new(0),
        }
    }
}

impl<K> Drop for FlatTatTable<K> {
    fn drop(&mut self) {
        if std::mem::needs_drop::<K>() {
            for slot in self.slots.iter_mut().filter(|s| !s.is_empty()) {
                // SAFETY: occupied, so initialised; dropped once, with the table.
                unsafe { slot.key_mut().assume_init_drop() };
            }
        }
    }
}

impl<K> FlatTatTable<K> {
    /// Keys held.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether one more key fits without growing (at most 80 % full).
    pub fn has_room(&self) -> bool {
        (self.len() + 1) * 5 <= self.slots.len() * 4
    }

    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        // Fibonacci hashing first: fast hashes of nearby integers (sequential ids)
        // differ little in their top bits, which alone pick the home here; the
        // multiply carries every bit into them.
        let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((u128::from(mixed) * self.slots.len() as u128) >> 64) as usize
    }

    #[inline(always)]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// The word of the key `eq` picks out among those hashing to `hash`.
    #[inline]
    pub fn find(&self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<&AtomicU64> {
        self.position(hash, eq).map(|i| &self.slots[i].word)
    }

    /// The slot of the key `eq` picks out: probed from its home to the first empty slot.
    #[inline(always)]
    fn position(&self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(hash);
        loop {
            let slot = &self.slots[i];
            if slot.is_empty() {
                return None;
            }
            if eq(slot.key()) {
                return Some(i);
            }
            i = self.next(i);
        }
    }

    /// Inserts a key known to be absent, growing the table first when it is 80 %
    /// full; `hasher` hashes the keys that move.
    pub fn insert_unique(&mut self, hash: u64, key: K, word: u64, hasher: impl Fn(&K) -> u64) {
        debug_assert_ne!(word, EMPTY);
        if !self.has_room() {
            self.grow(hasher);
        }
        self.put(hash, key, word);
    }

    /// Grows the table by half (at least 16 slots); `hasher` hashes the keys that move.
    pub fn grow(&mut self, hasher: impl Fn(&K) -> u64) {
        let grown = (self.slots.len() + self.slots.len() / 2).max(16);
        self.rebuild(grown, &hasher);
    }

    /// Inserts a key known to be absent while readers may probe, or gives it back
    /// when the table would have to grow (the caller then shuts readers out and uses
    /// [`FlatTatTable::insert_unique`]).
    ///
    /// # Safety
    /// No other thread inserts, removes or moves entries meanwhile (callers hold the
    /// shard's write lock); readers may run.
    pub unsafe fn insert_shared(&self, hash: u64, key: K, word: u64) -> Result<(), K> {
        debug_assert_ne!(word, EMPTY);
        if !self.has_room() {
            return Err(key);
        }
        let i = self.vacancy(hash);
        let slot = &self.slots[i];
        // SAFETY: the slot is empty, so no reader reads its key (they stop at an
        // empty word), and the caller guarantees no other writer.
        unsafe { (*slot.key.get()).write(key) };
        slot.word.store(word, Ordering::Release);
        self.len.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The first empty slot from the home of `hash` (the table has room).
    fn vacancy(&self, hash: u64) -> usize {
        let mut i = self.home(hash);
        while !self.slots[i].is_empty() {
            i = self.next(i);
        }
        i
    }

    /// Places an entry at the first empty slot from its home (the table has room).
    fn put(&mut self, hash: u64, key: K, word: u64) {
        let i = self.vacancy(hash);
        self.fill(i, key, word);
    }

    /// Occupies the empty slot `i`.
    fn fill(&mut self, i: usize, key: K, word: u64) {
        let slot = &mut self.slots[i];
        slot.key_mut().write(key);
        *slot.word.get_mut() = word;
        *self.len.get_mut() += 1;
    }

    /// Empties slot `i` (occupied), returning its entry.
    fn take(&mut self, i: usize) -> (K, u64) {
        let slot = &mut self.slots[i];
        let word = std::mem::replace(slot.word.get_mut(), EMPTY);
        // SAFETY: the slot was occupied (initialised key); its word now says empty,
        // so the key is read out exactly once.
        let key = unsafe { slot.key_mut().assume_init_read() };
        *self.len.get_mut() -= 1;
        (key, word)
    }

    /// Moves every entry into a table of `capacity` slots.
    fn rebuild(&mut self, capacity: usize, hasher: &impl Fn(&K) -> u64) {
        let old = std::mem::replace(
            &mut self.slots,
            (0..capacity).map(|_| Slot::empty()).collect(),
        );
        *self.len.get_mut() = 0;
        for mut slot in Vec::from(old) {
            let word = *slot.word.get_mut();
            if word != EMPTY {
                // SAFETY: occupied; the old slot is forgotten after this move.
                let key = unsafe { slot.key_mut().assume_init_read() };
                self.put(hasher(&key), key, word);
            }
        }
    }

    /// Removes the key `eq` picks out, if present.
    pub fn remove(
        &mut self,
        hash: u64,
        eq: impl Fn(&K) -> bool,
        hasher: impl Fn(&K) -> u64,
    ) -> Option<u64> {
        let i = self.position(hash, eq)?;
        let (_, word) = self.take(i);
        self.close_gap(i, &hasher);
        Some(word)
    }

    /// After slot `gap` was emptied, moves back the entries of the cluster after it
    /// that could no longer be found (their probe from home would stop at the gap).
    fn close_gap(&mut self, mut gap: usize, hasher: &impl Fn(&K) -> u64) {
        let mut i = self.next(gap);
        while !self.slots[i].is_empty() {
            let home = self.home(hasher(self.slots[i].key()));
            // Cyclic distances from home: the entry may move to the gap iff the gap
            // lies on its probe path (between its home and its slot).
            let n = self.slots.len();
            let dist = |from: usize, to: usize| (to + n - from) % n;
            if dist(home, gap) < dist(home, i) {
                let (key, word) = self.take(i);
                self.fill(gap, key, word);
                gap = i;
            }
            i = self.next(i);
        }
    }

    /// Keeps the entries `keep` says yes to. When some go, the survivors are placed
    /// again from their homes, as into a fresh table of the same size.
    pub fn retain(&mut self, mut keep: impl FnMut(&AtomicU64) -> bool, hasher: impl Fn(&K) -> u64) {
        let before = self.len();
        for i in 0..self.slots.len() {
            if !self.slots[i].is_empty() && !keep(&self.slots[i].word) {
                drop(self.take(i));
            }
        }
        if self.len() == before {
            return;
        }
        for (key, word) in self.take_all() {
            self.put(hasher(&key), key, word);
        }
    }

    /// Takes every entry out, leaving the slots empty.
    fn take_all(&mut self) -> Vec<(K, u64)> {
        let mut out = Vec::with_capacity(self.len());
        for i in 0..self.slots.len() {
            if !self.slots[i].is_empty() {
                out.push(self.take(i));
            }
        }
        out
    }

    /// The words of the first `n` entries in slot order (a sample: slots follow the
    /// hash, so the first are a fair draw).
    pub fn sample(&self, n: usize) -> impl Iterator<Item = &AtomicU64> {
        self.slots
            .iter()
            .filter(|s| !s.is_empty())
            .take(n)
            .map(|s| &s.word)
    }

    /// Takes every entry out.
    pub fn drain(&mut self) -> Vec<(K, u64)> {
        let out = self.take_all();
        self.slots = Box::new([]);
        out
    }
}

/// The fast path's table for a key type: the flat [`FlatTatTable`] for plain keys
/// (at most 32 bytes, owning no memory: integers, IP addresses, small tuples), whose
/// comparison is a register compare; hashbrown for keys that own memory (`String`),
/// whose tag bytes spare a pointer chase per probed slot.
pub(crate) enum TatTable<K> {
    Flat(FlatTatTable<K>),
    Tagged(hashbrown::HashTable<(K, AtomicU64)>),
}

impl<K> Default for TatTable<K> {
    fn default() -> Self {
        if Self::FLAT {
            TatTable::Flat(FlatTatTable::default())
        } else {
            TatTable::Tagged(hashbrown::HashTable::new())
        }
    }
}

impl<K> TatTable<K> {
    /// Whether keys of type `K` get the flat table (readable without a lock).
    pub const FLAT: bool = std::mem::size_of::<K>() <= 32 && !std::mem::needs_drop::<K>();

    pub fn len(&self) -> usize {
        match self {
            TatTable::Flat(t) => t.len(),
            TatTable::Tagged(t) => t.len(),
        }
    }

    /// Whether one more key would make the table grow.
    pub fn at_capacity(&self) -> bool {
        match self {
            TatTable::Flat(t) => !t.has_room(),
            TatTable::Tagged(t) => t.len() == t.capacity(),
        }
    }

    /// Grows the table by about half; `hasher` hashes the keys that move.
    pub fn grow(&mut self, hasher: impl Fn(&K) -> u64) {
        match self {
            TatTable::Flat(t) => t.grow(hasher),
            TatTable::Tagged(t) => t.reserve(t.len() / 2 + 1, |(k, _)| hasher(k)),
        }
    }

    #[inline]
    pub fn find(&self, hash: u64, eq: impl Fn(&K) -> bool) -> Option<&AtomicU64> {
        match self {
            TatTable::Flat(t) => t.find(hash, eq),
            TatTable::Tagged(t) => t.find(hash, |(k, _)| eq(k)).map(|(_, w)| w),
        }
    }

    pub fn insert_unique(&mut self, hash: u64, key: K, word: u64, hasher: impl Fn(&K) -> u64) {
        match self {
            TatTable::Flat(t) => t.insert_unique(hash, key, word, hasher),
            TatTable::Tagged(t) => {
                t.insert_unique(hash, (key, AtomicU64::new(word)), |(k, _)| hasher(k));
            }
        }
    }

    /// [`FlatTatTable::insert_shared`] for the flat table; the hashbrown table always
    /// gives the key back (it moves entries on insert).
    ///
    /// # Safety
    /// As [`FlatTatTable::insert_shared`].
    pub unsafe fn insert_shared(&self, hash: u64, key: K, word: u64) -> Result<(), K> {
        match self {
            // SAFETY: forwarded from the caller.
            TatTable::Flat(t) => unsafe { t.insert_shared(hash, key, word) },
            TatTable::Tagged(_) => Err(key),
        }
    }

    pub fn remove(&mut self, hash: u64, eq: impl Fn(&K) -> bool, hasher: impl Fn(&K) -> u64) {
        match self {
            TatTable::Flat(t) => {
                t.remove(hash, eq, hasher);
            }
            TatTable::Tagged(t) => {
                if let Ok(e) = t.find_entry(hash, |(k, _)| eq(k)) {
                    e.remove();
                }
            }
        }
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&AtomicU64) -> bool, hasher: impl Fn(&K) -> u64) {
        match self {
            TatTable::Flat(t) => t.retain(keep, hasher),
            TatTable::Tagged(t) => t.retain(|(_, w)| keep(w)),
        }
    }

    /// The words of the first `n` entries (slots follow the hash: a fair sample).
    pub fn sample(&self, n: usize) -> Box<dyn Iterator<Item = &AtomicU64> + '_> {
        match self {
            TatTable::Flat(t) => Box::new(t.sample(n)),
            TatTable::Tagged(t) => Box::new(t.iter().take(n).map(|(_, w)| w)),
        }
    }

    pub fn drain(&mut self) -> Vec<(K, u64)> {
        match self {
            TatTable::Flat(t) => t.drain(),
            TatTable::Tagged(t) => t.drain().map(|(k, w)| (k, w.into_inner())).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A deliberately poor hash (few distinct homes) so clusters, wrap-around and
    /// gap closing are exercised.
    fn hash(k: &u64) -> u64 {
        (k % 7).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k % 3)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64),
        Retain(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..64, 0u64..1000).prop_map(|(k, w)| Op::Insert(k, w)),
            2 => (0u64..64).prop_map(Op::Remove),
            1 => (1u64..5).prop_map(Op::Retain),
        ]
    }

    proptest! {
        /// The table agrees with a HashMap after any sequence of inserts, removals
        /// and retains, and every key is found from its home.
        #[test]
        fn behaves_as_a_map(ops in proptest::collection::vec(op(), 1..300)) {
            let mut table: FlatTatTable<u64> = FlatTatTable::default();
            let mut model: HashMap<u64, u64> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, w) => {
                        if let Some(word) = table.find(hash(&k), |x| *x == k) {
                            word.store(w, Ordering::Relaxed);
                        } else {
                            table.insert_unique(hash(&k), k, w, hash);
                        }
                        model.insert(k, w);
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(table.remove(hash(&k), |x| *x == k, hash), model.remove(&k));
                    }
                    Op::Retain(m) => {
                        table.retain(|w| w.load(Ordering::Relaxed) % m != 0, hash);
                        model.retain(|_, w| *w % m != 0);
                    }
                }
                prop_assert_eq!(table.len(), model.len());
                for k in 0..64u64 {
                    let found = table.find(hash(&k), |x| *x == k).map(|w| w.load(Ordering::Relaxed));
                    prop_assert_eq!(found, model.get(&k).copied());
                }
            }
            let mut drained = table.drain();
            drained.sort();
            let mut expected: Vec<_> = model.into_iter().collect();
            expected.sort();
            prop_assert_eq!(drained, expected);
        }
    }

    #[test]
    fn plain_keys_get_the_flat_table_and_owning_keys_hashbrown() {
        assert!(matches!(TatTable::<u64>::default(), TatTable::Flat(_)));
        assert!(matches!(
            TatTable::<std::net::IpAddr>::default(),
            TatTable::Flat(_)
        ));
        assert!(matches!(
            TatTable::<(u64, u32)>::default(),
            TatTable::Flat(_)
        ));
        assert!(matches!(TatTable::<String>::default(), TatTable::Tagged(_)));
        assert!(matches!(
            TatTable::<[u64; 5]>::default(),
            TatTable::Tagged(_)
        ));
    }

    #[test]
    fn keys_with_destructors_are_dropped_once() {
        let rc = std::rc::Rc::new(());
        let mut table: FlatTatTable<(u64, std::rc::Rc<()>)> = FlatTatTable::default();
        let h = |k: &(u64, std::rc::Rc<()>)| hash(&k.0);
        for k in 0..100 {
            table.insert_unique(hash(&k), (k, rc.clone()), k, h);
        }
        for k in 0..50 {
            table.remove(hash(&k), |x| x.0 == k, h);
        }
        table.retain(|w| w.load(Ordering::Relaxed) % 2 == 0, h);
        assert_eq!(std::rc::Rc::strong_count(&rc), 1 + 25);
        drop(table);
        assert_eq!(std::rc::Rc::strong_count(&rc), 1);
    }
}
