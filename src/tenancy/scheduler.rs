//! The run queue: a fixed number of run slots shared by all tenants, each tenant capped at
//! its own concurrency, waiting calls served round-robin between tenants (FIFO within one),
//! and a bounded queue per tenant. A tenant that floods the server fills its own queue and
//! is refused past it; the others' calls still get every other free slot.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Why a call got no place in the queue.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueueError {
    #[error("the queue of tenant `{tenant}` is full ({waiting} calls already wait to run; {running} of its runs are going). Retry when one of them ends")]
    Full {
        tenant: String,
        waiting: usize,
        running: usize,
    },
    #[error("the server is shutting down")]
    Closed,
}

/// Fair scheduling of run slots between tenants.
#[derive(Debug)]
pub struct Scheduler {
    capacity: usize,
    /// The most slots long runs (tasks, which may run 30 minutes) hold at once, over all
    /// tenants: half the slots (at least one), so that the others stay for normal calls
    /// (issue 24, item 5).
    long_cap: usize,
    max_queue: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    /// Slots held by long runs.
    long_running: usize,
    closed: bool,
    tenants: HashMap<String, Queue>,
    /// Tenants with waiting calls, in the order they are served.
    turn: VecDeque<String>,
}

#[derive(Debug)]
struct Queue {
    running: usize,
    cap: usize,
    /// Calls that hold a [`Place`] and no slot yet, wherever they wait (for memory, an
    /// environment, or in `waiting`): what `max_queue` bounds.
    pending: usize,
    waiting: VecDeque<Waiter>,
}

/// A call waiting for a slot: whether it is a long run, and how to wake it.
#[derive(Debug)]
struct Waiter {
    tx: oneshot::Sender<()>,
    long: bool,
}

impl Queue {
    /// The first waiter that may have a slot now (a long run only while long runs hold
    /// fewer than their share), after dropping those that gave up.
    fn next_eligible(&mut self, long_free: bool) -> Option<usize> {
        self.waiting.retain(|w| !w.tx.is_closed());
        self.waiting.iter().position(|w| !w.long || long_free)
    }
}

/// A place in a tenant's queue, taken before a call holds anything (memory, an
/// environment, its files): [`Place::acquire`] turns it into a run slot; dropping it gives
/// the place back.
#[derive(Debug)]
pub struct Place {
    scheduler: Arc<Scheduler>,
    tenant: String,
    cap: usize,
    held: bool,
    long: bool,
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.held {
            self.scheduler.unreserve(&self.tenant);
        }
    }
}

impl Place {
    /// Wait for a run slot (the place is already counted against the queue bound).
    pub async fn acquire(mut self) -> Result<Permit, QueueError> {
        let scheduler = self.scheduler.clone();
        let r = scheduler
            .wait_for_slot(&self.tenant, self.cap, self.long)
            .await;
        // Granted or not, this call no longer waits.
        self.held = false;
        scheduler.unreserve(&self.tenant);
        r
    }

    /// This call is a long run (a task): it waits for one of the slots long runs may hold.
    pub fn long(mut self, long: bool) -> Place {
        self.long = long;
        self
    }
}

/// A run slot; dropping it frees the slot for the next waiting call.
#[derive(Debug)]
pub struct Permit {
    scheduler: Arc<Scheduler>,
    tenant: String,
    long: bool,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.scheduler.release(&self.tenant, self.long);
    }
}

/// Counts for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Depth {
    pub running: usize,
    pub waiting: usize,
}

impl Scheduler {
    /// `capacity` runs at once over all tenants; at most `max_queue` waiting calls per tenant.
    pub fn new(capacity: usize, max_queue: usize) -> Arc<Self> {
        let capacity = capacity.max(1);
        Arc::new(Scheduler {
            capacity,
            long_cap: (capacity / 2).max(1),
            max_queue,
            state: Mutex::default(),
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait for a run slot for `tenant`, which may hold at most `cap` at once. Refused at once
    /// when the tenant's queue is full. Dropping the future gives up its place (or the slot,
    /// if it had just been granted).
    pub async fn acquire(self: &Arc<Self>, tenant: &str, cap: usize) -> Result<Permit, QueueError> {
        self.reserve(tenant, cap)?.acquire().await
    }

    /// A place in `tenant`'s queue, or the refusal when `max_queue` calls of the tenant
    /// already wait (for a slot, memory or an environment): taken first, before the call
    /// holds anything.
    pub fn reserve(self: &Arc<Self>, tenant: &str, cap: usize) -> Result<Place, QueueError> {
        let mut s = self.lock();
        if s.closed {
            return Err(QueueError::Closed);
        }
        let q = s.tenants.entry(tenant.to_string()).or_insert(Queue {
            running: 0,
            cap,
            pending: 0,
            waiting: VecDeque::new(),
        });
        if q.pending >= self.max_queue {
            return Err(QueueError::Full {
                tenant: tenant.to_string(),
                waiting: q.pending,
                running: q.running,
            });
        }
        q.pending += 1;
        Ok(Place {
            scheduler: self.clone(),
            tenant: tenant.to_string(),
            cap,
            held: true,
            long: false,
        })
    }

    fn unreserve(&self, tenant: &str) {
        let mut s = self.lock();
        if let Some(q) = s.tenants.get_mut(tenant) {
            q.pending = q.pending.saturating_sub(1);
        }
    }

    /// The slot itself, for a call that holds a place.
    async fn wait_for_slot(
        self: &Arc<Self>,
        tenant: &str,
        cap: usize,
        long: bool,
    ) -> Result<Permit, QueueError> {
        let rx = {
            let mut s = self.lock();
            if s.closed {
                return Err(QueueError::Closed);
            }
            let free = s.running < self.capacity;
            let long_free = s.long_running < self.long_cap;
            let q = s.tenants.entry(tenant.to_string()).or_insert(Queue {
                running: 0,
                cap,
                pending: 0,
                waiting: VecDeque::new(),
            });
            q.cap = cap.max(1);
            // At once when a slot is free, this call may take it, and no call of the
            // tenant that may take it waits before this one.
            let may = !long || long_free;
            if free && may && q.running < q.cap && q.next_eligible(long_free).is_none() {
                q.running += 1;
                s.running += 1;
                s.long_running += usize::from(long);
                return Ok(self.permit(tenant, long));
            }
            let (tx, rx) = oneshot::channel();
            q.waiting.push_back(Waiter { tx, long });
            if !s.turn.iter().any(|t| t == tenant) {
                s.turn.push_back(tenant.to_string());
            }
            rx
        };
        let mut waiting = Waiting {
            rx: Some(rx),
            scheduler: self.clone(),
            tenant: tenant.to_string(),
            long,
        };
        let rx = waiting.rx.as_mut().expect("set above");
        match rx.await {
            Ok(()) => {
                waiting.rx = None;
                Ok(self.permit(tenant, long))
            }
            Err(_) => Err(QueueError::Closed),
        }
    }

    fn permit(self: &Arc<Self>, tenant: &str, long: bool) -> Permit {
        Permit {
            scheduler: self.clone(),
            tenant: tenant.to_string(),
            long,
        }
    }

    fn release(&self, tenant: &str, long: bool) {
        let mut s = self.lock();
        s.running = s.running.saturating_sub(1);
        if long {
            s.long_running = s.long_running.saturating_sub(1);
        }
        if let Some(q) = s.tenants.get_mut(tenant) {
            q.running = q.running.saturating_sub(1);
        }
        Self::dispatch(&mut s, self.capacity, self.long_cap);
    }

    /// Hand free slots to waiting calls, one tenant after another (a tenant whose waiting
    /// calls are all long runs is passed over while long runs hold their share).
    fn dispatch(s: &mut State, capacity: usize, long_cap: usize) {
        let mut passes = s.turn.len();
        while s.running < capacity && passes > 0 {
            let Some(tenant) = s.turn.pop_front() else {
                break;
            };
            let long_free = s.long_running < long_cap;
            let Some(q) = s.tenants.get_mut(&tenant) else {
                passes = s.turn.len();
                continue;
            };
            q.waiting.retain(|w| !w.tx.is_closed());
            if q.waiting.is_empty() {
                passes = s.turn.len();
                continue;
            }
            let next = q.next_eligible(long_free);
            let (true, Some(i)) = (q.running < q.cap, next) else {
                s.turn.push_back(tenant);
                passes -= 1;
                continue;
            };
            let w = q.waiting.remove(i).expect("an index of the queue");
            if w.tx.send(()).is_ok() {
                q.running += 1;
                s.running += 1;
                s.long_running += usize::from(w.long);
            }
            if !q.waiting.is_empty() {
                s.turn.push_back(tenant);
            }
            passes = s.turn.len();
        }
    }

    /// Runs going and calls waiting (for a slot, memory or an environment), over all
    /// tenants.
    pub fn depth(&self) -> Depth {
        let s = self.lock();
        Depth {
            running: s.running,
            waiting: s.tenants.values().map(|q| q.pending).sum(),
        }
    }

    /// Refuse new calls and wake the waiting ones with [`QueueError::Closed`].
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        for q in s.tenants.values_mut() {
            q.waiting.clear();
        }
        s.turn.clear();
    }
}

/// A place in the queue. Dropped before it is served: the place is given up. Dropped after
/// the slot was granted but before the caller saw it: the slot is given back.
struct Waiting {
    rx: Option<oneshot::Receiver<()>>,
    scheduler: Arc<Scheduler>,
    tenant: String,
    long: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.scheduler.release(&self.tenant, self.long);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn settle() {
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn grants_at_once_within_capacity_and_caps() {
        let s = Scheduler::new(2, 4);
        let a1 = s.acquire("a", 1).await.unwrap();
        // `a` is at its own cap: its next call waits although a slot is free.
        let a2 = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("a", 1).await.map(|_| ()) }
        });
        settle().await;
        assert!(!a2.is_finished());
        let b1 = s.acquire("b", 2).await.unwrap();
        assert_eq!(
            s.depth(),
            Depth {
                running: 2,
                waiting: 1
            }
        );
        drop(a1);
        a2.await.unwrap().unwrap();
        drop(b1);
        assert_eq!(s.depth(), Depth::default());
    }

    #[tokio::test]
    async fn serves_tenants_in_turn_not_in_arrival_order() {
        let s = Scheduler::new(1, 100);
        let first = s.acquire("noisy", 8).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // Ten calls of the noisy tenant queue up, then one of the quiet tenant.
        for i in 0..11 {
            let tenant = if i < 10 { "noisy" } else { "quiet" };
            let (s, order) = (s.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let p = s.acquire(tenant, 8).await.unwrap();
                order.lock().unwrap().push(tenant);
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(p);
            }));
            settle().await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let quiet_at = order.iter().position(|t| *t == "quiet").unwrap();
        assert!(
            quiet_at <= 1,
            "the quiet tenant waited behind the noisy one's queue: {order:?}"
        );
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_says_why() {
        let s = Scheduler::new(1, 2);
        let _held = s.acquire("a", 1).await.unwrap();
        let w1 = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("a", 1).await.map(|_| ()) }
        });
        let w2 = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("a", 1).await.map(|_| ()) }
        });
        settle().await;
        let err = s.acquire("a", 1).await.unwrap_err();
        assert_eq!(
            err,
            QueueError::Full {
                tenant: "a".into(),
                waiting: 2,
                running: 1
            }
        );
        assert!(err.to_string().contains("Retry"));
        // Another tenant still gets a place.
        let b = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("b", 1).await.map(|_| ()) }
        });
        settle().await;
        assert_eq!(s.depth().waiting, 3);
        s.close();
        for t in [w1, w2, b] {
            assert_eq!(t.await.unwrap(), Err(QueueError::Closed));
        }
    }

    /// Issue 24, item 3: a place is counted from `reserve`, before the call waits for
    /// anything else (memory, an environment); dropping it gives the place back.
    #[tokio::test]
    async fn places_count_before_the_slot_queue() {
        let s = Scheduler::new(1, 2);
        let p1 = s.reserve("a", 1).unwrap();
        let _p2 = s.reserve("a", 1).unwrap();
        assert_eq!(s.depth().waiting, 2);
        let full = s.reserve("a", 1).unwrap_err();
        assert!(
            matches!(full, QueueError::Full { waiting: 2, .. }),
            "{full}"
        );
        assert!(
            s.reserve("b", 1).is_ok(),
            "another tenant has its own queue"
        );
        drop(p1);
        let p3 = s.reserve("a", 1).unwrap();
        // A place turned into a slot leaves the queue.
        let slot = p3.acquire().await.unwrap();
        assert_eq!(
            s.depth(),
            Depth {
                running: 1,
                waiting: 1
            }
        );
        drop(slot);
    }

    /// Issue 24, item 5: long runs (tasks) of one tenant hold at most half the slots; a
    /// normal call of another tenant (or of the same) takes one of the others at once.
    #[tokio::test]
    async fn long_runs_hold_at_most_half_the_slots() {
        let s = Scheduler::new(4, 100);
        let mut held = Vec::new();
        let mut waiting = Vec::new();
        for _ in 0..8 {
            let s = s.clone();
            waiting.push(tokio::spawn(async move {
                s.reserve("a", 8).unwrap().long(true).acquire().await
            }));
        }
        settle().await;
        assert_eq!(s.depth().running, 2, "long runs over their share");
        held.push(s.reserve("b", 8).unwrap().acquire().await.unwrap());
        held.push(s.acquire("a", 8).await.unwrap());
        assert_eq!(s.depth().running, 4);
        // The long runs go on in their two slots as they end.
        drop(held);
        settle().await;
        assert_eq!(s.depth().running, 2);
        for w in &waiting[..2] {
            assert!(w.is_finished());
        }
        s.close();
    }

    #[tokio::test]
    async fn a_cancelled_waiter_loses_its_place_not_a_slot() {
        let s = Scheduler::new(1, 4);
        let held = s.acquire("a", 1).await.unwrap();
        let gone = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("b", 1).await.map(|_| ()) }
        });
        settle().await;
        gone.abort();
        let _ = gone.await;
        assert_eq!(s.depth().waiting, 0);
        drop(held);
        // The slot is free again, not leaked to the cancelled call.
        let again = tokio::time::timeout(Duration::from_secs(1), s.acquire("c", 1))
            .await
            .expect("slot leaked")
            .unwrap();
        assert_eq!(s.depth().running, 1);
        drop(again);
        assert_eq!(s.depth().running, 0);
    }
}
