//! Backends that change part of what another does: [`Wrap`], whose every method forwards to
//! the inner backend unless the wrapper says otherwise, so a wrapper cannot forget one
//! ([`Backend`] itself has no defaults: a hand-written wrapper that misses a method does
//! not compile). [`Inert`] is the inner backend of a test double that only answers some
//! calls.

use std::time::Duration;

use async_trait::async_trait;

use super::{Backend, BackendError, BackendInfo, BackendStats, Events, LifecycleFigures, Session};
use crate::job::{JobSpec, Outcome, RunEnv};

/// A backend over another ([`Wrap::inner`]): implement the methods that change; the others
/// forward unchanged. Every `Wrap` is a [`Backend`].
#[async_trait]
pub trait Wrap: Send + Sync {
    /// The backend everything not overridden goes to.
    fn inner(&self) -> &dyn Backend;

    async fn run(&self, job: JobSpec, events: Events) -> Result<Outcome, BackendError> {
        self.inner().run(job, events).await
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        self.inner().info().await
    }

    async fn drain(&self) {
        self.inner().drain().await
    }

    async fn open_session(&self, job: JobSpec) -> Result<Box<dyn Session>, BackendError> {
        self.inner().open_session(job).await
    }

    async fn prewarm(&self, tenant: &str, env: &RunEnv) {
        self.inner().prewarm(tenant, env).await
    }

    fn stats(&self) -> BackendStats {
        self.inner().stats()
    }

    async fn sweep(&self) -> Result<usize, BackendError> {
        self.inner().sweep().await
    }

    fn sweep_periodically(&self, every: Duration) {
        self.inner().sweep_periodically(every)
    }

    async fn shutdown(&self) {
        self.inner().shutdown().await
    }

    async fn lifecycle_ceiling(
        &self,
        total: usize,
        concurrency: usize,
    ) -> Option<Result<LifecycleFigures, BackendError>> {
        self.inner().lifecycle_ceiling(total, concurrency).await
    }
}

#[async_trait]
impl<W: Wrap> Backend for W {
    async fn run(&self, job: JobSpec, events: Events) -> Result<Outcome, BackendError> {
        Wrap::run(self, job, events).await
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        Wrap::info(self).await
    }

    async fn drain(&self) {
        Wrap::drain(self).await
    }

    async fn open_session(&self, job: JobSpec) -> Result<Box<dyn Session>, BackendError> {
        Wrap::open_session(self, job).await
    }

    async fn prewarm(&self, tenant: &str, env: &RunEnv) {
        Wrap::prewarm(self, tenant, env).await
    }

    fn stats(&self) -> BackendStats {
        Wrap::stats(self)
    }

    async fn sweep(&self) -> Result<usize, BackendError> {
        Wrap::sweep(self).await
    }

    fn sweep_periodically(&self, every: Duration) {
        Wrap::sweep_periodically(self, every)
    }

    async fn shutdown(&self) {
        Wrap::shutdown(self).await
    }

    async fn lifecycle_ceiling(
        &self,
        total: usize,
        concurrency: usize,
    ) -> Option<Result<LifecycleFigures, BackendError>> {
        Wrap::lifecycle_ceiling(self, total, concurrency).await
    }
}

/// A backend with no sandboxes: runs and sessions are refused, there is nothing to pool,
/// sweep or shut down. The inner backend of test doubles that answer only what they
/// override (as a [`Wrap`]).
pub struct Inert;

#[async_trait]
impl Backend for Inert {
    async fn run(&self, _job: JobSpec, _events: Events) -> Result<Outcome, BackendError> {
        Err(BackendError::Rejected("this backend runs nothing".into()))
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        Ok(BackendInfo {
            kind: "inert",
            version: "inert".into(),
            image: "none".into(),
            image_present: false,
            details: Vec::new(),
        })
    }

    async fn drain(&self) {}

    async fn open_session(&self, _job: JobSpec) -> Result<Box<dyn Session>, BackendError> {
        Err(BackendError::Rejected(
            "this backend has no stateful sessions".into(),
        ))
    }

    async fn prewarm(&self, _tenant: &str, _env: &RunEnv) {}

    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }

    async fn sweep(&self) -> Result<usize, BackendError> {
        Ok(0)
    }

    fn sweep_periodically(&self, _every: Duration) {}

    async fn shutdown(&self) {}

    async fn lifecycle_ceiling(
        &self,
        _total: usize,
        _concurrency: usize,
    ) -> Option<Result<LifecycleFigures, BackendError>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::FakeBackend;
    use std::sync::Arc;

    /// Counts its runs; everything else goes to the fake.
    struct Counting(Arc<FakeBackend>, std::sync::atomic::AtomicUsize);

    #[async_trait]
    impl Wrap for Counting {
        fn inner(&self) -> &dyn Backend {
            &*self.0
        }
        async fn run(&self, job: JobSpec, events: Events) -> Result<Outcome, BackendError> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Backend::run(&*self.0, job, events).await
        }
    }

    /// A wrapper that overrides only `run` still opens sessions, reports stats and shuts
    /// down through its inner backend.
    #[tokio::test]
    async fn a_wrapper_forwards_what_it_does_not_override() {
        let fake = FakeBackend::new();
        let w: Arc<dyn Backend> = Arc::new(Counting(fake.clone(), Default::default()));
        let job = JobSpec::python("print(1)", crate::job::Limits::default());
        assert!(w.run(job.clone(), None).await.is_ok());
        let mut s = w.open_session(job).await.expect("the fake's session");
        assert!(s.exec("1", Duration::from_secs(1), None).await.is_ok());
        assert_eq!(w.stats().live_containers, 1);
        assert_eq!(w.info().await.unwrap().kind, "fake");
        drop(s);
        w.shutdown().await;
        assert!(fake.was_shut_down());
        assert_eq!(fake.jobs().len(), 2);
    }
}
