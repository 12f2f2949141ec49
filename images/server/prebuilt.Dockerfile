# The mcp-code-executor server from a binary built beforehand (`mcp-code-executor image
# server` sends its own executable as `mcp-code-executor`). BASE_IMAGE is
# debian:bookworm-slim where a registry answers, else the base bootstrapped offline.
# The binary links against the glibc of the machine that built it: the RUN below fails
# at build time when the base's glibc is older.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
COPY mcp-code-executor /usr/local/bin/mcp-code-executor
RUN ["/usr/local/bin/mcp-code-executor", "--version"]
ENTRYPOINT ["/usr/local/bin/mcp-code-executor"]
CMD ["serve", "--host", "0.0.0.0"]
