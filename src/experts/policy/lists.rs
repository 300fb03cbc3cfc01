//! Ordered lists of experts (the queues of S3-FIFO, the LRU lists of ARC): each expert is in
//! at most one list, at a position stamped when it was put there.

use std::collections::{BTreeMap, HashMap};

use super::ExpertId;

/// `N` lists of experts, each oldest first; `L` names a list (its index via `Into<usize>`).
#[derive(Clone)]
pub(crate) struct Lists<L, const N: usize> {
    next: u64,
    at: HashMap<ExpertId, (L, u64)>,
    order: [BTreeMap<u64, ExpertId>; N],
}

impl<L: Copy + Into<usize>, const N: usize> Default for Lists<L, N> {
    fn default() -> Self {
        Lists { next: 0, at: HashMap::new(), order: std::array::from_fn(|_| BTreeMap::new()) }
    }
}

impl<L: Copy + Into<usize>, const N: usize> Lists<L, N> {
    /// Puts `id` at the newest end of `list`, taking it out of the list it was in.
    pub fn push(&mut self, id: ExpertId, list: L) {
        self.remove(id);
        self.next += 1;
        self.order[list.into()].insert(self.next, id);
        self.at.insert(id, (list, self.next));
    }

    /// Takes `id` out of its list; returns that list.
    pub fn remove(&mut self, id: ExpertId) -> Option<L> {
        let (list, stamp) = self.at.remove(&id)?;
        self.order[list.into()].remove(&stamp);
        Some(list)
    }

    /// The list `id` is in.
    pub fn which(&self, id: ExpertId) -> Option<L> {
        self.at.get(&id).map(|&(list, _)| list)
    }

    /// Number of experts in `list`.
    pub fn len(&self, list: L) -> usize {
        self.order[list.into()].len()
    }

    /// The experts of `list`, oldest first.
    pub fn oldest_first(&self, list: L) -> impl Iterator<Item = ExpertId> + '_ {
        self.order[list.into()].values().copied()
    }

    /// Takes the oldest expert out of `list`.
    pub fn pop_oldest(&mut self, list: L) -> Option<ExpertId> {
        let id = self.oldest_first(list).next()?;
        self.remove(id);
        Some(id)
    }
}
