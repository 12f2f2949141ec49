//! How deep a pool refills: when runs find it dry (its sandboxes are taken faster than
//! they are made: one call every 0.3 s while a make takes more than 0.6 s on a loaded
//! machine, or under gVisor), it keeps one more plain sandbox (waiting or being made) per
//! dry run, up to twice its size, and makes as many more plain ones at once (within the
//! pool's refill workers: a make under gVisor takes about a second, so two at a time
//! cannot keep up with a call every 0.3 s), so that the next run finds one; after
//! [`SHALLOWER_AFTER`] runs served without a miss it gives one back. Only plain
//! ones: they are cheap to keep (some 10 MiB each, against 70 for a preloaded one) and
//! cover every call.

use super::{Pool, State, Waiting};

/// Runs served from a pool without a miss, after which it keeps one plain sandbox less
/// beyond its plan.
pub(super) const SHALLOWER_AFTER: usize = 20;

impl<L: Waiting> Pool<L> {
    /// A run of this pool's shape took a sandbox (`served`) or found none that fits.
    pub(super) fn after_take(&self, st: &mut State<L>, served: bool) {
        if st.runs.is_some() {
            // A one-shot run's pool makes exactly what its runs need (see `runs`).
            return;
        }
        let before = st.deeper;
        if served {
            st.served_since_dry += 1;
            if st.served_since_dry >= SHALLOWER_AFTER && st.deeper > 0 {
                st.deeper -= 1;
                st.served_since_dry = 0;
            }
        } else {
            st.served_since_dry = 0;
            st.deeper = (st.deeper + 1).min(self.size);
        }
        if st.deeper != before {
            tracing::debug!(pool = %self.label, deeper = st.deeper, "warm pool depth");
            self.replan(st);
        }
    }

    /// The plan with the extra plain sandboxes (its first kind is plain).
    pub(super) fn deepen_plan(st: &mut State<L>) {
        if let Some((kind, target)) = st.plan.first_mut() {
            if kind.is_empty() {
                *target += st.deeper;
            }
        }
    }
}
