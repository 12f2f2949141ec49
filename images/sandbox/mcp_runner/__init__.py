"""The sandbox runner: PID 1 of every execution container.

Protocol (all integers big-endian; the server's side is `src/backend/protocol.rs`):

  stdin   u32 header length, JSON header, then exactly `tar_len` bytes of a tar archive
          that holds regular files only (the server builds it). A session (header
          `mode: "session"`) then sends messages, each `u32 length, JSON`, one at a time,
          the next only after the last one's report:
            {"kind": "cell", "code": ..., "output_limit": ...}
                run the code REPL-style in the session's interpreter (no `kind`: a cell);
            {"kind": "files", "tar_len": N} and N bytes of tar
                put those files into the workspace (written by the runner, the
                interpreter is not involved), answered by an `X` report: exit code 0,
                or 1 with the reason on `E`.
  stdout  frames: 1 byte kind, u32 payload length, payload.
            b"R"  ready: the runner is up and waiting for its job (empty payload)
            b"S"  started: the runner has read its whole job (empty payload); a sandbox
                  that dies before this never ran it, one that dies after may have
            b"O"  a chunk of the user's stdout
            b"E"  a chunk of the user's stderr
            b"A"  an artifact (a figure): u16 name length, name, bytes; before `X`
            b"W"  a file the code created or changed under the workspace (when the header
                  asks for `return_files`): u16 path length, path, bytes; before `X`
            b"X"  the final report, JSON: exit_code, signal, timed_out, cpu_ms,
                  peak_memory_bytes, oom_kills, stdout_bytes, stderr_bytes,
                  artifacts_dropped, files_dropped, notes (what was left out and why), and
                  `ended` for a session's cell
            b"F"  the runner could not run the job, JSON: {"error": "..."}
            b"T"  code mode's requests, b"N" egress's streams (see `toolrelay`, `netrelay`)

The user's code runs as a child process whose stdout/stderr are pipes read here, so
nothing it writes can forge a frame (a session's status channel, fd 4 of the
interpreter, is believed only for a line naming the nonce sent with the running cell): the runner is not dumpable (its /proc entries are
root-owned, unreachable for the same uid) and, as PID 1 of its pid namespace, it
cannot be signalled by its children. Past `output_limit` bytes a stream is drained
and counted but not forwarded, so a flood costs the user's CPU quota and nothing else.

The server enforces the run's deadline (it kills the container). The runner keeps a
backstop of its own, so that a container never outlives a server that died (kill -9, OOM,
a recreated compose service): the header's `deadline_s` (the timeout plus a grace), past
which every process of the sandbox is killed and the run reported as timed out; and
`MCPX_WAIT_LIMIT` (environment, seconds), past which a runner still waiting for its job
exits. A session's stdin closes when the server's attach connection goes away.

To keep interpreter start-up off the request path, the child Python is started before
the job arrives, with a tiny stub that waits on fd 3 for the path of the file to run (and
its bytes, which the runner has from the archive) and then runs it as `__main__` (as
`python -u FILE` would). A pool container is therefore a runner and a fully started
interpreter, both waiting. Whatever can be done before the job is done before `R` (the
workspace's snapshot, the run's nonce): under gVisor every system call on the run's path
costs some 60 us.

The modules, one concern each:

  main       start-up, the job header, the choice between a run and a session
  frames     the framed stdout and exact reads from stdin
  limits     the caps the runner enforces, in one place
  cgroup     what the kernel says the sandbox used (CPU, memory, OOM kills)
  workspace  unpacking archives safely, noticing and returning changed files
  figures    returning the figures the code saved, the matplotlib font cache
  stubs      the code the child interpreter runs (a file, or a session's cells)
  child      starting and discarding that interpreter
  output     the code's output under its cap, reaping, figures and files returned, the
             report's fields: shared by a run and a session's cells
  watch      the fds a select loop waits on (`select.poll`)
  run        a one-shot run: its select loop, the backstop deadline
  session    a session: cells and files, one message after another, until stdin closes
  preload    a waiting interpreter's preloaded modules, and the import scan of a run's code
  toolrelay  code mode: the code's tool requests out as `T` frames, the answers back in
  netrelay   egress: the code's connections to 127.0.0.1:3128 out as `N` streams, with
             per-stream windows, the proxy's bytes back in as `net` messages

Written for the image's Python 3 and the standard library only, started with -I -S
through `../runner.py`; the stubs run in the user's interpreter and are kept to Python
3.6+. The interpreter for the code is argv[1] (default /usr/bin/python3).
"""
