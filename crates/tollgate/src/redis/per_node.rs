//! [`PerNode`]: state kept by Redis node index (see `topology.rs`), made on a node's
//! first use.

use std::sync::Arc;

use arc_swap::ArcSwap;

/// Something kept per node (a limiter's health, a batching queue), by node index, made
/// on a node's first use.
pub(crate) struct PerNode<T> {
    list: ArcSwap<Vec<Arc<T>>>,
    grow: std::sync::Mutex<()>,
}

impl<T> Default for PerNode<T> {
    fn default() -> Self {
        PerNode {
            list: ArcSwap::from_pointee(Vec::new()),
            grow: std::sync::Mutex::new(()),
        }
    }
}

impl<T> PerNode<T> {
    /// Node `i`'s, made with `make` (for it and any node below it that has none yet).
    pub fn get(&self, i: usize, make: impl Fn() -> T) -> Arc<T> {
        if let Some(t) = self.list.load().get(i) {
            return t.clone();
        }
        let _grow = self.grow.lock().unwrap_or_else(|e| e.into_inner());
        let mut list = Vec::clone(&self.list.load());
        while list.len() <= i {
            list.push(Arc::new(make()));
        }
        let t = list[i].clone();
        self.list.store(Arc::new(list));
        t
    }

    /// Every node's made so far, by index.
    pub fn all(&self) -> Arc<Vec<Arc<T>>> {
        self.list.load_full()
    }
}
