//! The proxy as the sandboxes reach it (stage 2): installed once by `serve --egress FILE`
//! (or `run --egress FILE`), it gives each run of a tenant a [`crate::job::Egress`], whose
//! run scope serves the connections the backend hands it from the sandbox: over the
//! sandbox's own Unix socket (`crate::backend::egress_socket`) or relayed by its runner
//! (`crate::backend::relay`), the same way whichever.

use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use futures::FutureExt;

use super::proxy::{Proxy, RunScope};
use crate::job::{Egress, EgressChannel, EgressHost, EgressRun, EgressStream};

static INSTALLED: OnceLock<Arc<Proxy>> = OnceLock::new();

/// Connections a run may hold open through its relay at once: twice its
/// `connections_in_flight`, and never fewer than this (idle keep-alive connections of a
/// client library count too).
pub const MIN_STREAMS: usize = 64;

/// Make `proxy` the one the sandboxes of this process reach. A second call is ignored.
pub fn install(proxy: Arc<Proxy>) {
    let _ = INSTALLED.set(proxy);
}

/// What the runs of `tenant` reach: `None` without a policy (no network, as always).
/// With one, every tenant gets the proxy: a tenant no rule names gets its refusals.
pub fn for_tenant(tenant: &str) -> Option<Egress> {
    let proxy = INSTALLED.get()?.clone();
    Some(with_proxy(proxy, tenant))
}

/// `tenant`'s side of `proxy` (tests build their own proxy).
pub fn with_proxy(proxy: Arc<Proxy>, tenant: &str) -> Egress {
    Egress(Arc::new(Tenant {
        proxy,
        tenant: tenant.to_string(),
    }))
}

struct Tenant {
    proxy: Arc<Proxy>,
    tenant: String,
}

impl EgressHost for Tenant {
    fn start(&self, run: &str) -> Arc<dyn EgressRun> {
        Arc::new(Run {
            proxy: self.proxy.clone(),
            scope: self.proxy.run_scope(&self.tenant, run),
        })
    }

    fn ca_pem(&self) -> String {
        self.proxy.ca_pem()
    }
}

/// One run's scope; dropped (the run or cell ended), it ends every connection of the run.
struct Run {
    proxy: Arc<Proxy>,
    scope: Arc<RunScope>,
}

impl EgressRun for Run {
    fn serve(&self, io: Box<dyn EgressStream>, channel: EgressChannel) -> BoxFuture<'static, ()> {
        super::metrics::egress().stream(&self.scope.tenant, channel.label());
        self.proxy.clone().serve(io, self.scope.clone()).boxed()
    }

    fn max_streams(&self) -> usize {
        let in_flight = self.proxy.policy().limits.connections_in_flight as usize;
        in_flight.saturating_mul(2).max(MIN_STREAMS)
    }

    fn spent(&self) -> (u64, u64) {
        self.scope.spent()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.scope.close();
    }
}
