//! What every backend checks of an environment's [`Source`](crate::job::Source)s before it
//! maps them to its own mounts.

use std::path::Path;

use super::BackendError;

/// A volume source (`what`: the backend's word for it, "volume" or "claim") needs a name
/// and an absolute target.
pub(crate) fn check_volume(what: &str, name: &str, target: &Path) -> Result<(), BackendError> {
    if name.is_empty() || !target.is_absolute() {
        return Err(BackendError::Rejected(format!(
            "{what} `{name}` at `{}`: a volume needs a name and an absolute target",
            target.display()
        )));
    }
    Ok(())
}
