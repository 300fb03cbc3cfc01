//! Which inputs a head reads, and the sparse part of one sample's input.
//!
//! A head's input is `[h_N(t), (h_last(t)), (e(t+1)), blocks…]`: the dense part (MoE layer N's
//! FFN input at token t, followed with `deep` by the last MoE layer's FFN input at t and with
//! `token` by the input embedding of token t+1, the token step t produced) and one multi-hot
//! block of `experts` entries per enabled routing feature, in this order: `next` (layer N+1's
//! top-k at t), `prev` (layer N+1's top-k at t−1, all zero at a sequence start), `own` (layer
//! N's top-k at t). Edge0's choice is `next,prev`. Everything is known once token t is done
//! (`token`: once the next token is sampled).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::PrerouterError;

/// The multi-hot blocks a head reads besides the hidden state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    /// Layer N+1's top-k at token t.
    pub next: bool,
    /// Layer N+1's top-k at token t−1.
    pub prev: bool,
    /// Layer N's own top-k at token t.
    pub own: bool,
    /// The last MoE layer's FFN input at token t (closest to the next token's identity).
    #[serde(default)]
    pub deep: bool,
    /// The input embedding of token t+1 (known once step t's token is chosen; the heads then
    /// run after that, not with the step itself).
    #[serde(default)]
    pub token: bool,
}

/// The routing a sample's multi-hot blocks are made from.
#[derive(Clone, Copy, Debug)]
pub struct RoutingContext<'a> {
    /// Layer N+1's ids at token t.
    pub next: &'a [u16],
    /// Layer N+1's ids at token t−1 (`None` at a sequence start).
    pub prev: Option<&'a [u16]>,
    /// Layer N's ids at token t.
    pub own: &'a [u16],
}

impl Features {
    /// Edge0's inputs: the hidden state plus layer N+1's routing at t and t−1.
    pub const EDGE0: Features = Features { next: true, prev: true, own: false, deep: false, token: false };

    /// Multi-hot blocks enabled.
    pub fn blocks(self) -> usize {
        usize::from(self.next) + usize::from(self.prev) + usize::from(self.own)
    }

    /// Width of the dense part of the input for a model of hidden size `hidden`.
    pub fn dense_dim(self, hidden: usize) -> usize {
        hidden * (1 + usize::from(self.deep) + usize::from(self.token))
    }

    /// Width of the sparse (multi-hot) part of the input.
    pub fn sparse_dim(self, experts: usize) -> usize {
        self.blocks() * experts
    }

    /// The indices, within the sparse part, of the ones of a sample's multi-hot blocks.
    pub fn active(self, experts: usize, ctx: &RoutingContext<'_>) -> Vec<usize> {
        let mut out = Vec::new();
        let mut base = 0;
        let enabled = [(self.next, Some(ctx.next)), (self.prev, ctx.prev), (self.own, Some(ctx.own))];
        for (on, ids) in enabled {
            if on {
                out.extend(ids.unwrap_or(&[]).iter().map(|&e| base + usize::from(e)));
                base += experts;
            }
        }
        out
    }
}

impl fmt::Display for Features {
    /// Comma-separated names (`none` for the hidden state only), as parsed by `from_str`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> =
            [(self.next, "next"), (self.prev, "prev"), (self.own, "own"), (self.deep, "deep"), (self.token, "token")]
                .into_iter()
                .filter_map(|(on, name)| on.then_some(name))
                .collect();
        f.write_str(if names.is_empty() { "none" } else { "" })?;
        f.write_str(&names.join(","))
    }
}

impl FromStr for Features {
    type Err = PrerouterError;

    /// Parses `next,prev,own,deep,token` (any subset, any order) or `none`.
    fn from_str(s: &str) -> Result<Features, PrerouterError> {
        let mut f = Features { next: false, prev: false, own: false, deep: false, token: false };
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty() && *n != "none") {
            match name {
                "next" => f.next = true,
                "prev" => f.prev = true,
                "own" => f.own = true,
                "deep" => f.deep = true,
                "token" => f.token = true,
                _ => {
                    return Err(PrerouterError::InvalidArgument(format!(
                        "unknown feature {name:?}; expected next, prev, own, deep, token or none"
                    )))
                }
            }
        }
        Ok(f)
    }
}
