//! `tenant token` and `healthcheck`: the two commands that need no sandbox.

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
