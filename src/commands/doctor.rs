//! `doctor`: is isolation really enforced on this host? One real sandbox per check.

use super::{backend, Exit};
use crate::config::BackendConfig;
use crate::ops::doctor;

/// The checks' table on stdout; 0 when every check passed.
pub async fn doctor(cfg: &BackendConfig) -> Exit {
    let sandbox = match backend::connect(cfg).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("FAIL  {}  {e}", doctor::REACHABLE);
            return 1;
        }
    };
    let report = doctor::diagnose(&*sandbox).await;
    sandbox.drain().await;
    print!("{}", report.table());
    if report.ok() {
        0
    } else {
        1
    }
}
