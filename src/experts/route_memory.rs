//! What one sequence's tokens were routed to, position by position.
//!
//! A prompt-lookup draft copies a passage of the sequence, so the verify step that checks it
//! runs tokens that already ran in much the same context: the experts recorded at the
//! passage's positions are the ones that step is expected to route to, known before it runs,
//! so their reads can start before it ([`super::cache_model::CacheModel::prefetch_expected`]).
//! Pure bookkeeping: the engine records each step's routing and asks for a span's experts.

use super::policy::ExpertId;

/// Most bytes one sequence's memory keeps: the latest positions that fit are kept.
pub const ROUTE_MEMORY_BYTES: usize = 16 << 20;

/// Every MoE layer's top-k expert ids at each of a sequence's latest positions (a ring).
#[derive(Clone, Debug)]
pub struct RouteMemory {
    /// The model layer of each MoE layer, in order.
    layers: Vec<usize>,
    top_k: usize,
    /// Positions the ring holds.
    capacity: usize,
    /// `capacity` positions × layers × top-k ids, position `p` at `p % capacity` (grown as
    /// positions come).
    ids: Vec<u16>,
    /// Positions `known_from..len` were recorded (those still in the ring are known); a gap
    /// (positions never recorded) forgets the positions before it.
    known_from: usize,
    len: usize,
}

impl RouteMemory {
    /// A memory for a model whose MoE layers are `layers` (model layer indices, in order), each
    /// routing a token to `top_k` of `experts` experts, over sequences of up to `context`
    /// positions; `None` when expert ids do not fit 16 bits or there is nothing to record.
    pub fn new(layers: &[usize], top_k: usize, experts: usize, context: usize) -> Option<RouteMemory> {
        let width = layers.len() * top_k;
        if width == 0 || experts > usize::from(u16::MAX) + 1 {
            return None;
        }
        let capacity = (ROUTE_MEMORY_BYTES / (2 * width)).min(context).max(1);
        Some(RouteMemory { layers: layers.to_vec(), top_k, capacity, ids: Vec::new(), known_from: 0, len: 0 })
    }

    fn width(&self) -> usize {
        self.layers.len() * self.top_k
    }

    /// Records the routing of positions `pos..pos + rows`, which were rows `first..first + rows`
    /// of a step: `routed(layer)` is that step's top-k ids of model layer `layer`, every row's
    /// (`top_k` a row). A layer whose ids do not cover the rows (not routed in that step) makes
    /// the positions unknown. Positions from `pos + rows` on are forgotten.
    pub fn record<'a>(&mut self, pos: usize, (first, rows): (usize, usize), routed: impl Fn(usize) -> &'a [u32]) {
        let (k, width) = (self.top_k, self.width());
        let complete = self.layers.iter().all(|&l| routed(l).len() >= (first + rows) * k);
        if !complete || rows == 0 {
            self.truncate(pos);
            return;
        }
        match pos > self.len {
            // Positions between were never recorded.
            true => self.known_from = pos,
            false => self.truncate(pos),
        }
        let wanted = (pos + rows).min(self.capacity) * width;
        if self.ids.len() < wanted {
            self.ids.resize(wanted, 0);
        }
        for (m, &layer) in self.layers.iter().enumerate() {
            let ids = &routed(layer)[first * k..(first + rows) * k];
            for (r, row) in ids.chunks(k).enumerate() {
                let at = ((pos + r) % self.capacity) * width + m * k;
                for (slot, &e) in self.ids[at..at + k].iter_mut().zip(row) {
                    *slot = e as u16;
                }
            }
        }
        self.len = pos + rows;
    }

    /// Forgets positions from `len` on (a sequence cut back). Where the ring has wrapped, the
    /// forgotten positions wrote over the slots of positions before `len` that it no longer
    /// held: those stay unknown.
    pub fn truncate(&mut self, len: usize) {
        let overwritten = self.len.saturating_sub(self.capacity);
        self.len = self.len.min(len);
        self.known_from = self.known_from.max(overwritten).min(self.len);
    }

    /// Whether position `p`'s routing is held.
    fn knows(&self, p: usize) -> bool {
        p >= self.known_from && p < self.len && p + self.capacity >= self.len
    }

    /// The distinct experts the known ones of `positions` were routed to, layer by layer in
    /// model order and, within a layer, those routed most often first.
    pub fn experts_of(&self, positions: impl IntoIterator<Item = usize>) -> Vec<ExpertId> {
        let (k, width) = (self.top_k, self.width());
        let known: Vec<usize> = positions.into_iter().filter(|&p| self.knows(p)).collect();
        let mut out = Vec::new();
        let mut counts: Vec<(u16, u32)> = Vec::new();
        for (m, &layer) in self.layers.iter().enumerate() {
            counts.clear();
            for &p in &known {
                let at = (p % self.capacity) * width + m * k;
                for &e in &self.ids[at..at + k] {
                    match counts.iter_mut().find(|(x, _)| *x == e) {
                        Some((_, n)) => *n += 1,
                        None => counts.push((e, 1)),
                    }
                }
            }
            // Stable: ties keep the order they were first routed in.
            counts.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
            out.extend(counts.iter().map(|&(e, _)| ExpertId::new(layer, usize::from(e))));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[(usize, usize)]) -> Vec<ExpertId> {
        v.iter().map(|&(l, e)| ExpertId::new(l, e)).collect()
    }

    /// A step of three rows over MoE layers 1 and 3, top-2: rows' ids by layer.
    fn step(layer: usize) -> &'static [u32] {
        match layer {
            1 => &[0, 1, 2, 1, 1, 3],
            3 => &[4, 5, 4, 6, 7, 4],
            _ => &[],
        }
    }

    #[test]
    fn a_span_gives_its_layers_experts_most_routed_first() {
        let mut m = RouteMemory::new(&[1, 3], 2, 8, 100).unwrap();
        m.record(10, (0, 3), step);
        // Layer 1: 1 three times, then 0, 2, 3 once (in the order first routed); layer 3: 4
        // three times, then 5, 6, 7.
        assert_eq!(m.experts_of(10..13), ids(&[(1, 1), (1, 0), (1, 2), (1, 3), (3, 4), (3, 5), (3, 6), (3, 7)]));
        // Only the rows asked for; positions never recorded are skipped.
        assert_eq!(m.experts_of(11..12), ids(&[(1, 2), (1, 1), (3, 4), (3, 6)]));
        assert_eq!(m.experts_of(0..11), ids(&[(1, 0), (1, 1), (3, 4), (3, 5)]));
        assert!(m.experts_of(13..20).is_empty());
        // Rows of a batched step: the second and third rows at positions 13 and 14.
        m.record(13, (1, 2), step);
        assert_eq!(m.experts_of(13..15), m.experts_of(11..13));
    }

    #[test]
    fn cut_back_and_unrecorded_positions_are_unknown() {
        let mut m = RouteMemory::new(&[1, 3], 2, 8, 100).unwrap();
        m.record(0, (0, 3), step);
        m.truncate(1);
        assert!(m.experts_of(1..3).is_empty());
        let first = m.experts_of(0..1);
        assert_eq!(first.len(), 4);
        // A gap: positions 1..5 were never recorded; the memory restarts at 5.
        m.record(5, (0, 1), step);
        assert!(m.experts_of(0..5).is_empty());
        assert_eq!(m.experts_of(5..6), first);
        // Rows of a layer that did not route are not recorded.
        m.record(6, (0, 1), |_| &[]);
        assert!(m.experts_of(6..7).is_empty());
        assert_eq!(m.experts_of(5..6).len(), 4);
    }

    #[test]
    fn the_ring_keeps_the_latest_positions() {
        let mut m = RouteMemory::new(&[1, 3], 2, 8, 4).unwrap();
        for pos in 0..6 {
            m.record(pos, (pos % 3, 1), step);
        }
        // Positions 2..6 are held; 0 and 1 were written over.
        assert!(m.experts_of(0..2).is_empty());
        assert_eq!(m.experts_of(3..4), ids(&[(1, 0), (1, 1), (3, 4), (3, 5)]));
        assert_eq!(m.experts_of(5..6), ids(&[(1, 1), (1, 3), (3, 7), (3, 4)]));
        // Cut back after wrapping: positions 2..4 are held (4 and 5 wrote over 0 and 1), and
        // recording again at 4 keeps them.
        let held = m.experts_of(2..4);
        m.truncate(4);
        assert!(m.experts_of(0..2).is_empty());
        assert_eq!(m.experts_of(2..4), held);
        m.record(4, (0, 1), step);
        assert_eq!(m.experts_of(2..4), held);
        // Recording at an earlier position forgets what followed it: after 0..7 (the ring holding
        // 3..7), a rewrite at 3 holds 3 alone; 2's slot was written over by 6.
        for pos in 0..7 {
            m.record(pos, (pos % 3, 1), step);
        }
        m.record(3, (2, 1), step);
        assert!(m.experts_of(0..3).is_empty());
        assert_eq!(m.experts_of(3..4), ids(&[(1, 1), (1, 3), (3, 7), (3, 4)]));
        assert!(m.experts_of(4..7).is_empty());
        assert!(RouteMemory::new(&[1], 2, 70_000, 4).is_none());
        assert!(RouteMemory::new(&[], 2, 8, 4).is_none());
    }
}
