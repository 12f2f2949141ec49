//! Making a sandbox: create (with the [`spec`](super::spec)), attach, start. Attach comes
//! before start, or output is lost (1 run in 10 lost it when attached after), and the guard
//! exists before the create call, so a container is removed on every path out of here.

use bollard::errors::Error as BollardError;
use bollard::query_parameters::{AttachContainerOptionsBuilder, CreateContainerOptionsBuilder};

use super::{classify, spec, DockerDriver};
use crate::backend::engine::Live;
use crate::backend::BackendError;
use crate::job::{Limits, RunEnv, Source};

impl DockerDriver {
    /// Create, attach and start a container of the given shape for `tenant`, its
    /// interpreter importing `preload` before the runner says
    /// ready (pool containers; see [`crate::backend::preload`]). The list goes in the
    /// container's environment, which the runner takes out of its own before the code's
    /// interpreter starts.
    pub(super) async fn launch_with(
        &self,
        limits: &Limits,
        env: &RunEnv,
        tenant: &str,
        id: &str,
        preload: &[String],
    ) -> Result<Live, BackendError> {
        let mut body = spec::create_body(&self.config, &self.owner, limits, env, tenant, id)?;
        if !preload.is_empty() {
            let vars = body.env.get_or_insert_with(Vec::new);
            vars.push(format!("MCPX_PRELOAD={}", preload.join(",")));
            vars.push(format!(
                "MCPX_PRELOAD_MEMORY={}",
                self.config.preload.memory_percent
            ));
        }
        self.check_volumes(env).await?;
        let name = format!("mcpx-{id}");
        let mut guard = self.guards.guard(&name);
        let dir = self.sandbox_dir(&name);
        if let Some(d) = &dir {
            let host = body.host_config.get_or_insert_with(Default::default);
            host.mounts
                .get_or_insert_with(Vec::new)
                .push(spec::sandbox_dir_mount(d.path()));
        }
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
        Ok(super::live::live(guard, attached.input, attached.output).with_dir(dir))
    }

    /// Docker creates a missing named volume, empty, when a container mounts it: an
    /// environment volume with a typo would give a sandbox without its environment and an
    /// error about a missing interpreter. Refuse it by name instead.
    async fn check_volumes(&self, env: &RunEnv) -> Result<(), BackendError> {
        for s in &env.sources {
            if let Source::Volume { name, .. } = s {
                match self.docker.inspect_volume(name).await {
                    Ok(_) => {}
                    Err(BollardError::DockerResponseServerError {
                        status_code: 404, ..
                    }) => {
                        return Err(BackendError::Rejected(format!(
                            "the volume `{name}` does not exist: create it and put the                              environment into it first"
                        )))
                    }
                    Err(e) => return Err(classify("inspecting a volume", e)),
                }
            }
        }
        Ok(())
    }
}
