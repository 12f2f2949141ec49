//! Each container's own directory on the host (see [`crate::backend::sandbox_dir`]): made
//! before the container is created, and the sweep of those whose container is gone.

use std::collections::{HashMap, HashSet};

use bollard::query_parameters::ListContainersOptionsBuilder;

use super::{is_gvisor, DockerDriver, LABEL_MANAGED};
use crate::backend::sandbox_dir::{self, SandboxDir};

impl DockerDriver {
    /// The directory of the container about to be created as `name`, where the config
    /// asks for them and the runtime is not gVisor (whose runsc refuses to connect to a
    /// host socket unless run with `--host-uds=open`; its sandboxes relay instead). `None`,
    /// with a warning, when it cannot be made: the sandbox then relays too.
    pub(super) fn sandbox_dir(&self, name: &str) -> Option<SandboxDir> {
        let root = self.config.sandbox_dirs.as_deref()?;
        if is_gvisor(self.config.runtime.as_deref()) {
            return None;
        }
        SandboxDir::create(root, name)
            .map_err(|e| {
                tracing::warn!(dir = %root.display(), error = %e, "cannot make a sandbox's directory; its egress goes over the runner's relay");
            })
            .ok()
    }

    /// Remove the directories whose container does not exist (a process that is gone
    /// left them), unless young (their container may be being created).
    pub(super) async fn sweep_dirs(&self) {
        let Some(root) = self.config.sandbox_dirs.as_deref() else {
            return;
        };
        let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_MANAGED}=true")])]);
        let list = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await;
        let Ok(list) = list else {
            return;
        };
        let live: HashSet<String> = list
            .into_iter()
            .flat_map(|c| c.names.unwrap_or_default())
            .map(|n| n.trim_start_matches('/').to_string())
            .collect();
        sandbox_dir::sweep(root, &live, sandbox_dir::LEFTOVER_AFTER);
    }
}
