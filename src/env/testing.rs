//! Test support: a recording fake [`Sandbox`] that answers the environment jobs (probe,
//! check, creation, both install phases) as the real scripts would.

use std::path::Path;
use std::sync::Mutex;

use async_trait::async_trait;
use tokio::sync::oneshot;

use crate::backend::{Backend, BackendError, BackendInfo, Events};
use crate::job::{JobSpec, Outcome};
pub use crate::scratch::tempdir;

/// Holds the next fetch phase: `started` fires when it begins, it ends when `release` does.
pub struct Gate {
    pub started: oneshot::Sender<()>,
    pub release: oneshot::Receiver<()>,
}

/// Records every job and answers it with success.
#[derive(Default)]
pub struct Recorder {
    jobs: Mutex<Vec<JobSpec>>,
    /// The fetch phase's answer instead of success.
    pub fetch_answer: Mutex<Option<String>>,
    pub fetch_gate: Mutex<Option<Gate>>,
}

impl Recorder {
    pub fn jobs(&self) -> Vec<JobSpec> {
        self.jobs.lock().unwrap().clone()
    }
}

fn file<'a>(job: &'a JobSpec, name: &str) -> Option<&'a [u8]> {
    job.files
        .iter()
        .find(|f| f.path == name)
        .map(|f| f.contents.as_slice())
}

#[async_trait]
impl crate::backend::Wrap for Recorder {
    fn inner(&self) -> &dyn Backend {
        &crate::backend::Inert
    }

    async fn run(&self, job: JobSpec, _: Events) -> Result<Outcome, BackendError> {
        self.jobs.lock().unwrap().push(job.clone());
        let names: Vec<String> = file(&job, "names.json")
            .map(|b| serde_json::from_slice(b).unwrap())
            .unwrap_or_default();
        let check: Vec<serde_json::Value> = names
            .iter()
            .map(|n| {
                let v = if n == "six" { "1.17.0" } else { "2.31.0" };
                serde_json::json!({"name": n, "installed": true, "version": v})
            })
            .collect();
        let stdout = if let Some(cfg) = file(&job, "fetch.json") {
            let cfg: serde_json::Value = serde_json::from_slice(cfg).unwrap();
            if cfg["own_pip"] == true {
                let tools = Path::new(cfg["tools"].as_str().unwrap());
                std::fs::write(tools.join("pip-99.0-py3-none-any.whl"), "").unwrap();
            }
            let gate = self.fetch_gate.lock().unwrap().take();
            if let Some(g) = gate {
                let _ = g.started.send(());
                let _ = g.release.await;
            }
            let answer = self.fetch_answer.lock().unwrap().clone();
            answer.unwrap_or_else(|| r#"{"ok": true, "missing": []}"#.into())
        } else if file(&job, "install.json").is_some() {
            serde_json::json!({
                "summary": "Successfully installed idna-3.20 requests-2.31.0 six-1.17.0 urllib3-2.2.1",
                "installed": check,
            })
            .to_string()
        } else if file(&job, "names.json").is_some() {
            serde_json::to_string(&check).unwrap()
        } else if let Some(python) = &job.env.python {
            let prefix = Path::new(python).parent().and_then(Path::parent).unwrap();
            serde_json::json!({"prefix": prefix, "version": "3.11.2", "executable": python})
                .to_string()
        } else {
            String::new()
        };
        Ok(Outcome {
            exit_code: Some(0),
            stdout: format!("{stdout}\n").into_bytes(),
            ..Outcome::default()
        })
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        unreachable!()
    }

    async fn drain(&self) {}
}
