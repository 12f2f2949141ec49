//! Every environment variable the program reads, declared once, with what it means.
//!
//! The model is uv's `EnvVars`: one documented constant per variable, named as the variable
//! itself, so `grep MCP_EXECUTOR_TIMEOUT` finds its declaration, its flag and its docs row.
//! [`ALL`] lists them for tests: each must have a row in the reference table of
//! `docs/mcp.md` ("Environment variables and flags"), and only `config`, the binary's
//! `args.rs` and `main.rs` may read the process environment (see the tests of
//! [`crate::config`]).
//!
//! Most have a flag of the same meaning (clap reads the variable behind the flag; the flag
//! wins); `.env` in the working directory fills in what is unset (`serve` only). Some are
//! read by a library on our behalf (`DOCKER_HOST` by the Docker client, `RUST_LOG` by the
//! log filter); they are declared here too, so that the table is the whole truth.

/// One environment variable: its name and its documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    pub name: &'static str,
    /// The doc comment of its constant (several lines, each with the leading space
    /// rustdoc keeps).
    pub doc: &'static str,
}

impl Var {
    /// The first line of its documentation.
    pub fn summary(&self) -> &'static str {
        self.doc.trim().lines().next().unwrap_or("").trim()
    }
}

/// Declares each variable as a `pub const NAME: &str = "NAME"` carrying its doc comment,
/// and [`ALL`], the table of them.
macro_rules! env_vars {
    ($( $(#[doc = $doc:literal])+ $name:ident; )+) => {
        $(
            $(#[doc = $doc])+
            pub const $name: &str = stringify!($name);
        )+
        /// Every variable above, in declaration order.
        pub const ALL: &[Var] = &[
            $( Var { name: $name, doc: concat!($($doc, "\n"),+) }, )+
        ];
    };
}

env_vars! {
    // ---- limits of a run (`run` and `serve`) ----
    /// Default wall-clock limit of a run, in seconds (`--timeout`, default 30).
    MCP_EXECUTOR_TIMEOUT;
    /// Memory limit of a run, swap included: `512m`, `1g` or bytes (`--memory`, default 512m).
    MCP_EXECUTOR_MEMORY;
    /// CPU quota of a run, in cores (`--cpus`, default 1).
    MCP_EXECUTOR_CPUS;
    /// Processes and threads of a run (`run --pids`, default 128).
    MCP_EXECUTOR_PIDS;
    /// Bytes kept of stdout and of stderr each (`run --output-limit`, default 1m).
    MCP_EXECUTOR_OUTPUT_LIMIT;
    /// Size of the `/workspace` tmpfs of a run (`run --workspace-size`, default 64m).
    MCP_EXECUTOR_WORKSPACE_SIZE;

    // ---- the sandbox backend ----
    /// Which sandbox backend runs the code (`--backend`; `docker`, or `kubernetes`: a pod
    /// per run on a cluster).
    MCP_EXECUTOR_BACKEND;
    /// The sandbox image (`--image`; default: the tag that matches this binary).
    MCP_EXECUTOR_IMAGE;
    /// OCI runtime of sandboxes (`--runtime`; Docker's default, `runc`, when unset or empty;
    /// `runsc`: the gVisor isolation tier; on `kubernetes`, the pods' `runtimeClassName`).
    MCP_EXECUTOR_RUNTIME;
    /// The Docker daemon (`unix://…`, `tcp://…`); read by the Docker client itself; the
    /// local socket when unset.
    DOCKER_HOST;
    /// Sandboxes `serve` keeps started and waiting for a run (`--pool-size`, default 2; 0:
    /// no warm pool).
    MCP_EXECUTOR_POOL_SIZE;
    /// The kubeconfig file of the Kubernetes backend (`--kubeconfig`; unset: in-cluster
    /// config, else `KUBECONFIG`, else `~/.kube/config`).
    MCP_EXECUTOR_KUBECONFIG;
    /// The kubeconfig the Kubernetes client reads when no `--kubeconfig` is given; read by
    /// the client itself.
    KUBECONFIG;
    /// The namespace of sandbox pods (`--kube-namespace`; default: the kubeconfig
    /// context's, or the server pod's service account's).
    MCP_EXECUTOR_KUBE_NAMESPACE;
    /// A PersistentVolumeClaim holding the server's data directory, for environments and
    /// installs on the Kubernetes backend (`--kube-env-volume`; unset: the image's Python
    /// only, installs refused).
    MCP_EXECUTOR_KUBE_ENV_VOLUME;
    /// The server's own pod name, from the downward API (`metadata.name`): sandbox pods get
    /// an ownerReference to it.
    MCP_EXECUTOR_POD_NAME;
    /// The server's own pod uid, from the downward API (`metadata.uid`).
    MCP_EXECUTOR_POD_UID;
    /// The server's own pod namespace, from the downward API (`metadata.namespace`);
    /// ownerReferences are set only when it is the sandboxes' namespace.
    MCP_EXECUTOR_POD_NAMESPACE;
    /// Modules a waiting pool sandbox imports before its run, comma-separated, each only
    /// where the environment has it (`--preload`, default `numpy,pandas,matplotlib.pyplot`;
    /// `none`: nothing). See "Preloading".
    MCP_EXECUTOR_PRELOAD;
    /// `0`/`false`: learn nothing from the modules runs import (`--preload-learn`, default
    /// true).
    MCP_EXECUTOR_PRELOAD_LEARN;
    /// Learned modules added to a pool's preload list, at most (`--preload-learn-max`,
    /// default 4).
    MCP_EXECUTOR_PRELOAD_LEARN_MAX;
    /// Percent of a sandbox's memory limit its preloaded interpreter may hold; past it the
    /// rest of the list is dropped for that pool (`--preload-memory`, default 50).
    MCP_EXECUTOR_PRELOAD_MEMORY;

    // ---- where things live ----
    /// Where managed environments, workspaces and (by default) stored code live
    /// (`--data-dir`).
    MCP_EXECUTOR_DATA_DIR;
    /// Base of the default data directory when `MCP_EXECUTOR_DATA_DIR` is unset
    /// (`$XDG_DATA_HOME/mcp-code-executor`).
    XDG_DATA_HOME;
    /// The user's home: the default data directory's last resort
    /// (`~/.local/share/mcp-code-executor`); conda environments named by `CONDA_ENV_NAME`
    /// are looked for under it, and an environment may not be it.
    HOME;
    /// Where stored code lives (`--code-storage-dir`; default `code/` under the data
    /// directory). The name of the tool this server replaces.
    CODE_STORAGE_DIR;
    /// Where the workspaces live (`--workspace-dir`; default `workspaces/` under the data
    /// directory).
    MCP_EXECUTOR_WORKSPACE_DIR;
    /// `1`/`true`: one workspace per tenant, shared by its MCP sessions and kept
    /// (`--shared-workspace`; default: one per MCP session, deleted when it ends).
    MCP_EXECUTOR_SHARED_WORKSPACE;

    // ---- the HTTP server ----
    /// HTTP port (`--port`, default 4000; 0 picks a free one).
    PORT;
    /// Address the HTTP server binds to (`--host`, default 127.0.0.1).
    MCP_EXECUTOR_HOST;
    /// Comma-separated `Host` header values the HTTP transports accept, a guard against DNS
    /// rebinding (`--allowed-hosts`; `*`: any).
    MCP_EXECUTOR_ALLOWED_HOSTS;
    /// Comma-separated browser `Origin` values accepted besides loopback pages and the
    /// allowed hosts (`--allowed-origins`; `*`: any).
    MCP_EXECUTOR_ALLOWED_ORIGINS;
    /// `0`/`false`: no `/metrics` route (`--metrics`, default true).
    MCP_EXECUTOR_METRICS;
    /// The server's public URL, an origin such as `https://mcp.example.com`
    /// (`--public-url`): the OAuth resource identifiers and metadata are made from it, never
    /// from the `Host` header.
    MCP_EXECUTOR_PUBLIC_URL;
    /// Comma-separated OAuth issuers whose JWT access tokens are accepted
    /// (`--oauth-issuer`, with `--public-url` and a tenants file with `[[oauth_rules]]`).
    MCP_EXECUTOR_OAUTH_ISSUERS;
    /// The scope an OAuth access token must carry (`--oauth-scope`, default `mcp`).
    MCP_EXECUTOR_OAUTH_SCOPE;
    /// Comma-separated internal addresses of every replica (`--peers`): `http://HOST:PORT`,
    /// or `dns+http://NAME:PORT` for every address NAME resolves to; unset: one replica.
    MCP_EXECUTOR_PEERS;
    /// The secret replicas show each other on forwarded requests (`--cluster-secret`;
    /// needed with `--peers`); a client request that carries a wrong one is refused.
    MCP_EXECUTOR_CLUSTER_SECRET;
    /// Seconds runs in progress get to finish after SIGTERM, readiness already 503
    /// (`--drain-grace`, default 12 with `--peers`, else 0); then they end with an error saying so.
    MCP_EXECUTOR_DRAIN_GRACE;
    /// Seconds between sweeps of what dead servers left on the backend (`--sweep-every`,
    /// default 600).
    MCP_EXECUTOR_SWEEP_EVERY;
    /// HTTP connections serving MCP at once (`--max-connections`, default 512); beyond them
    /// a reserve of `MCP_EXECUTOR_HEALTH_CONNECTIONS` answers only health and metrics.
    MCP_EXECUTOR_MAX_CONNECTIONS;
    /// Connections beyond `--max-connections` that answer only `/healthz`, `/readyz` and
    /// `/metrics` (`--health-connections`, default 16); beyond them new connections are closed.
    MCP_EXECUTOR_HEALTH_CONNECTIONS;
    /// Open MCP responses (requests in flight and SSE streams) in all (`--max-streams`,
    /// default 256); further requests get 429.
    MCP_EXECUTOR_MAX_STREAMS;
    /// Open MCP responses of one tenant (`--max-streams-per-tenant`, default 64).
    MCP_EXECUTOR_MAX_STREAMS_PER_TENANT;
    /// Seconds a client has to send a request's headers; also how long an idle keep-alive
    /// connection stays open (`--header-timeout`, default 10).
    MCP_EXECUTOR_HEADER_TIMEOUT;
    /// Seconds a client has to send a request's body, else 408 (`--body-timeout`, default 30).
    MCP_EXECUTOR_BODY_TIMEOUT;
    /// Result bytes waiting for clients to read them, in all (`--max-buffered`, default 256m);
    /// past it clients that do not read are disconnected.
    MCP_EXECUTOR_MAX_BUFFERED;
    /// Result bytes waiting for one tenant's clients (`--max-buffered-per-tenant`, default 128m).
    MCP_EXECUTOR_MAX_BUFFERED_PER_TENANT;
    /// Result bytes waiting for one protocol session (`--max-buffered-per-session`, default 16m).
    MCP_EXECUTOR_MAX_BUFFERED_PER_SESSION;
    /// Seconds a client with results waiting may read nothing before it is disconnected
    /// (`--stall-timeout`, default 30).
    MCP_EXECUTOR_STALL_TIMEOUT;
    /// Streamable HTTP protocol sessions open at once, in all (`--max-protocol-sessions`,
    /// default 1000).
    MCP_EXECUTOR_MAX_PROTOCOL_SESSIONS;
    /// Streamable HTTP protocol sessions open at once per tenant
    /// (`--max-protocol-sessions-per-tenant`, default 200).
    MCP_EXECUTOR_MAX_PROTOCOL_SESSIONS_PER_TENANT;
    /// Seconds without a request after which a Streamable HTTP protocol session is closed
    /// (`--protocol-session-idle`, default 300).
    MCP_EXECUTOR_PROTOCOL_SESSION_IDLE;

    // ---- admission and tenants ----
    /// Highest timeout a call may ask for, in seconds (`--max-timeout`, default 300).
    MCP_EXECUTOR_MAX_TIMEOUT;
    /// How long a finished MCP task's result stays readable at least, and the least TTL a
    /// task gets (`--task-ttl`, seconds, default 900).
    MCP_EXECUTOR_TASK_TTL;
    /// Bytes of results the kept MCP tasks of a tenant may hold, a working task counting as
    /// a full result (`--task-results-limit`, default `64m`).
    MCP_EXECUTOR_TASK_RESULTS_LIMIT;
    /// Run slots over all tenants; further calls wait (`--max-concurrent`, default 4).
    MCP_EXECUTOR_MAX_CONCURRENT;
    /// Calls of one tenant that may wait for a run slot; past it calls are refused
    /// (`--max-queue`, default 256).
    MCP_EXECUTOR_MAX_QUEUE;
    /// The tenants file (TOML): tokens and limits per tenant (`--tenants`; unset: one local
    /// tenant, no authentication).
    MCP_EXECUTOR_TENANTS;
    /// Without a tenants file, the tenant id: the label on this server's containers
    /// (`--tenant`, default `local`).
    MCP_EXECUTOR_TENANT;
    /// Code mode's tools file (TOML, see docs/code-mode.md): the MCP servers whose tools the
    /// sandboxed code may call through `import tools` (`--tools`; unset: none).
    MCP_EXECUTOR_TOOLS;
    /// The egress policy file (TOML, see docs/egress.md): hosts and ports sandboxed code
    /// may reach through this server, default deny (`--egress`; unset: no network).
    MCP_EXECUTOR_EGRESS;

    // ---- execute_python sessions ----
    /// Seconds without a call after which a session is removed (`--session-idle`, default
    /// 600).
    MCP_EXECUTOR_SESSION_IDLE;
    /// Seconds after which a session is removed however busy (`--session-max-lifetime`,
    /// default 3600).
    MCP_EXECUTOR_SESSION_MAX_LIFETIME;
    /// Sessions alive at once, per tenant (`--max-sessions`, default 16).
    MCP_EXECUTOR_MAX_SESSIONS;
    /// Memory all of a tenant's sandboxes may hold at once: its runs, probes, installs and
    /// open execute_python sessions, paused between cells or not (`--memory-budget`,
    /// default 8 x `--memory`; `0`: unlimited); a tenant's `memory_budget` may lower it.
    MCP_EXECUTOR_MEMORY_BUDGET;

    // ---- storage ----
    /// Bytes of stored code and workspace files each tenant may keep, together
    /// (`--storage-limit`, default `1g`; `0`: unlimited); a tenant's `storage_limit` may
    /// lower it.
    MCP_EXECUTOR_STORAGE_LIMIT;
    /// Bytes of stored code and workspace files of every tenant together
    /// (`--storage-limit-total`, default `10g`; `0`: unlimited).
    MCP_EXECUTOR_STORAGE_LIMIT_TOTAL;
    /// Stored code files not modified for this long are removed, at start-up and then
    /// hourly on writes (`--code-max-age`, seconds, default 2592000: 30 days).
    MCP_EXECUTOR_CODE_MAX_AGE;

    // ---- the Python environment (names of the tools this server replaces) ----
    /// `conda`, `venv` or `venv-uv` (`--env-type`); unset: the managed default environment.
    ENV_TYPE;
    /// The conda environment (name or prefix) when `ENV_TYPE=conda`; alone, it means conda.
    CONDA_ENV_NAME;
    /// The venv when `ENV_TYPE=venv`.
    VENV_PATH;
    /// The uv venv when `ENV_TYPE=venv-uv`.
    UV_VENV_PATH;
    /// The `conda` program that lists environments by name (conda's shell hook sets it);
    /// else `conda` is looked for on `PATH`.
    CONDA_EXE;
    /// Searched for `conda` when `CONDA_EXE` is unset.
    PATH;
    /// Single tenant: directories (`:`-separated, absolute) under which configure_environment
    /// may pick an environment, besides the data directory and the configured environment
    /// (its prefix and its base interpreter's); every other path is refused with one text.
    /// Default: none beyond those.
    MCP_EXECUTOR_ENV_ROOTS;

    // ---- installs ----
    /// CA bundle (PEM) the fetch phase of installs trusts (`--ca-bundle`; default the
    /// host's system bundle when present).
    MCP_EXECUTOR_CA_BUNDLE;
    /// Package index the fetch phase of installs uses (default PyPI).
    PIP_INDEX_URL;
    /// Extra package indexes the fetch phase of installs uses.
    PIP_EXTRA_INDEX_URL;

    // ---- the host ----
    /// Where `image build --offline` bootstraps the base image's root filesystem (the
    /// standard library's temporary directory; `/tmp` when unset).
    TMPDIR;

    // ---- traces (OpenTelemetry's standard variables; docs/hosting.md "Traces") ----
    /// The OTLP/HTTP collector's base URL (`--otlp-endpoint`; `/v1/traces` is appended);
    /// unset: no traces.
    OTEL_EXPORTER_OTLP_ENDPOINT;
    /// The OTLP/HTTP traces URL itself; wins over `OTEL_EXPORTER_OTLP_ENDPOINT`.
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
    /// Headers sent with every export, `key1=value1,key2=value2` (values percent-encoded).
    OTEL_EXPORTER_OTLP_HEADERS;
    /// Bound on one export request, in milliseconds (default 10000); a batch not taken in
    /// time is dropped and counted.
    OTEL_EXPORTER_OTLP_TIMEOUT;
    /// The `service.name` of the spans (default `mcp-code-executor`).
    OTEL_SERVICE_NAME;
    /// Spans waiting to be exported, at most (default 2048); past it new spans are dropped
    /// and counted (`mcp_executor_trace_spans_dropped_total`).
    OTEL_BSP_MAX_QUEUE_SIZE;
    /// How long the exporter gathers a batch after its first span, in milliseconds
    /// (default 5000).
    OTEL_BSP_SCHEDULE_DELAY;

    // ---- logs ----
    /// Log filter (`tracing` syntax, default `mcp_code_executor=warn`); logs go to stderr.
    RUST_LOG;
}

/// Variables that `docker-compose.yml` reads and the server does not: documented in the
/// same table, and never a typo.
pub const COMPOSE_ONLY: &[&str] = &[
    "MCP_EXECUTOR_SERVER_IMAGE",
    "MCP_EXECUTOR_PORT",
    "MCP_EXECUTOR_TENANTS_FILE",
];

/// The `MCP_EXECUTOR_*` names among `names` that nothing reads: most likely typos
/// (`MCP_EXECUTOR_MEMROY`), which would otherwise be ignored without a word.
pub fn unknown<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    names
        .into_iter()
        .filter(|n| n.starts_with("MCP_EXECUTOR_"))
        .filter(|n| !ALL.iter().any(|v| v.name == *n) && !COMPOSE_ONLY.contains(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_is_declared_once_with_a_doc() {
        for (i, v) in ALL.iter().enumerate() {
            assert!(!v.summary().is_empty(), "{} has no documentation", v.name);
            assert!(
                !ALL[..i].iter().any(|w| w.name == v.name),
                "{} is declared twice",
                v.name
            );
            assert!(!COMPOSE_ONLY.contains(&v.name), "{}", v.name);
        }
        assert_eq!(MCP_EXECUTOR_TIMEOUT, "MCP_EXECUTOR_TIMEOUT");
        assert!(ALL.iter().any(|v| v.name == "PIP_INDEX_URL"));
    }

    #[test]
    fn typos_are_found() {
        let set = [
            "MCP_EXECUTOR_MEMROY",
            "MCP_EXECUTOR_MEMORY",
            "MCP_EXECUTOR_PORT",
            "HOME",
        ];
        assert_eq!(unknown(set), ["MCP_EXECUTOR_MEMROY"]);
    }
}
