//! `tenant token`, `healthcheck` and `usage`: the commands that need no sandbox.

use super::{fail, Exit};
use crate::cli::run::exit;
use crate::tenancy::{self, token};

/// `tenant token ID`: a new random token on stderr (shown once, stored nowhere) and the
/// `[[tenants]]` entry holding its SHA-256 on stdout.
pub fn tenant_token(id: &str) -> Exit {
    if !tenancy::valid_id(id) {
        return fail(format!("`{id}` is not a valid tenant id (1 to 63 of a-z, 0-9, `_`, `-`, starting and ending with a letter or digit)"), exit::USAGE);
    }
    let t = token::generate();
    eprintln!("# Give this token to the tenant (it is not stored anywhere):\n#   {t}");
    println!(
        "[[tenants]]\nid = \"{id}\"\ntoken_sha256 = \"{}\"",
        token::to_hex(&token::hash(&t))
    );
    0
}

/// `healthcheck URL`: 0 when the server answers 2xx there (the compose healthcheck).
pub async fn healthcheck(url: &str) -> Exit {
    match crate::ops::health::check(url).await {
        Ok(status) => {
            println!("{url}: {status}");
            0
        }
        Err(e) => {
            eprintln!("unhealthy: {url}: {e}");
            1
        }
    }
}

/// `usage`: the usage records under `data_dir`, summed by day, tenant and principal, as
/// JSON on stdout.
pub fn usage(
    data_dir: &std::path::Path,
    tenant: Option<&str>,
    from: Option<&str>,
    to: Option<&str>,
) -> Exit {
    let dir = crate::app::usage::dir_of(data_dir);
    let filter = crate::app::usage::Filter {
        tenant,
        principal: None,
        from,
        to,
    };
    match crate::app::usage::read(&dir, filter) {
        Ok(report) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).unwrap_or_default()
            );
            0
        }
        Err(e) => fail(format!("usage records at {}: {e}", dir.display()), 1),
    }
}
