//! Making a sandbox: create (with the [`spec`](super::spec)), attach, start. Attach comes
//! before start, or output is lost (1 run in 10 lost it when attached after), and the guard
//! exists before the create call, so a container is removed on every path out of here.

use bollard::errors::Error as BollardError;
use bollard::query_parameters::{AttachContainerOptionsBuilder, CreateContainerOptionsBuilder};

use super::guard::ContainerGuard;
use super::live::Live;
use super::{classify, spec, Inner};
use crate::backend::BackendError;
use crate::job::{Limits, RunEnv};

impl Inner {
    /// Create, attach and start a container of the given shape for `tenant`.
    pub(super) async fn launch(
        &self,
        limits: &Limits,
        env: &RunEnv,
        tenant: &str,
        id: &str,
    ) -> Result<Live, BackendError> {
        let body = spec::create_body(&self.config, &self.owner, limits, env, tenant, id);
        let name = format!("mcpx-{id}");
        let mut guard = ContainerGuard::new(&self.docker, &name, &self.cleanup);
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                body,
            )
            .await
            .map_err(|e| {
                if let BollardError::DockerResponseServerError { .. } = e {
                    guard.disarm();
                }
                match e {
                    BollardError::DockerResponseServerError {
                        status_code: 404, ..
                    } => BackendError::ImageMissing {
                        image: self.config.image.clone(),
                    },
                    e => classify("creating the container", e),
                }
            })?;
        guard.confirm(&created.id);
        let attached = self
            .docker
            .attach_container(
                &created.id,
                Some(
                    AttachContainerOptionsBuilder::default()
                        .stdin(true)
                        .stdout(true)
                        .stderr(true)
                        .stream(true)
                        .build(),
                ),
            )
            .await
            .map_err(|e| classify("attaching to the container", e))?;
        self.docker
            .start_container(&created.id, None)
            .await
            .map_err(|e| classify("starting the container", e))?;
        Ok(Live::new(guard, attached.input, attached.output))
    }
}
