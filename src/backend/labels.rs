//! What marks a sandbox as ours, the same on every backend: its labels, and the id of the
//! process that made it (`host/pid/start-time`), by which a sweep tells a dead owner from a
//! live one.

/// Label on everything this project creates: the sweep and tests find sandboxes by it.
pub const LABEL_MANAGED: &str = "io.mcp-code-executor.managed";
/// Label with the job id (for a pool sandbox: its own id until a job is dispatched).
pub const LABEL_JOB: &str = "io.mcp-code-executor.job";
/// Label with the tenant id (`pool` for a waiting pool sandbox).
pub const LABEL_TENANT: &str = "io.mcp-code-executor.tenant";
/// Label naming the process that made the sandbox (`host/pid/start-time`; on Kubernetes a
/// hash of it), so that the sweep removes only what a dead process left behind.
pub const LABEL_OWNER: &str = "io.mcp-code-executor.owner";

/// This host's name, as owner ids carry it.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `host/pid/start-time` of process `pid` of this host (the start time tells a reused
/// pid apart); `None` when there is no such process.
pub fn owner_id(pid: u32) -> Option<String> {
    Some(format!(
        "{}/{}/{}",
        hostname(),
        pid,
        process_start_time(pid)?
    ))
}

/// The owner id of this process (`unknown` where `/proc` does not say).
pub(crate) fn own_id() -> String {
    owner_id(std::process::id()).unwrap_or_else(|| "unknown".into())
}

/// The start time of process `pid`; `None` when it is gone, also when it has ended and its
/// parent has not reaped it yet (a zombie, state `Z`, or `X`): a server killed by its
/// supervisor stays one a while, and its sandboxes are a dead owner's.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields 3 (state) and 22, counted after the parenthesised command name (which may
    // hold spaces).
    let mut after = stat[stat.rfind(')')? + 2..].split(' ');
    if matches!(after.next(), Some("Z" | "X")) {
        return None;
    }
    after.nth(18)?.parse().ok()
}

/// Is the process named by `owner` (an owner id) gone? Only an owner on `host` can be
/// judged; anything else (another host, garbage) is taken as alive.
pub(crate) fn owner_is_dead(owner: &str, host: &str) -> bool {
    let mut parts = owner.splitn(3, '/');
    let (Some(h), Some(pid), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if h != host {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    owner_id(pid).as_deref() != Some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_of_this_process_is_alive_and_a_made_up_one_is_dead() {
        let host = hostname();
        let me = owner_id(std::process::id()).unwrap();
        assert!(!owner_is_dead(&me, &host));
        let pid = std::process::id();
        assert!(owner_is_dead(&format!("{host}/{pid}/1"), &host));
        assert!(!owner_is_dead(&format!("elsewhere/{pid}/1"), &host));
        assert!(!owner_is_dead("garbage", &host));
    }

    #[test]
    fn a_killed_child_not_yet_reaped_is_a_dead_owner() {
        let host = hostname();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let owner = owner_id(child.id()).expect("a live child has an owner id");
        assert!(!owner_is_dead(&owner, &host));
        child.kill().unwrap();
        // Not reaped: /proc still shows it, as a zombie, once the kill has landed.
        let stat = format!("/proc/{}/stat", child.id());
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(&stat)
            .unwrap_or_default()
            .contains(") Z ")
        {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(5),
                "never a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            owner_is_dead(&owner, &host),
            "a zombie's sandboxes are a dead owner's"
        );
        child.wait().unwrap();
        assert!(owner_is_dead(&owner, &host));
    }
}
