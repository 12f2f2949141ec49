"""The fds a select loop waits on, each with a tag: `select.poll`, one system call per
wait and none to register or drop an fd. `selectors`' epoll made a call for each fd
registered and dropped (a dozen per run, each a trip through the sentry under gVisor),
and importing `selectors` cost every sandbox some 10 ms there before it was ready."""

import select


class Watch:
    def __init__(self):
        self._poll = select.poll()
        self.tags = {}

    def register(self, fd, tag):
        self._poll.register(fd, select.POLLIN)
        self.tags[fd] = tag

    def want(self, fd, read, write):
        """Wait for `fd` to be readable, writable, both or neither (a hang-up or an
        error is reported whatever is asked)."""
        self._poll.modify(fd, (select.POLLIN if read else 0) | (select.POLLOUT if write else 0))

    def unregister(self, fd):
        self._poll.unregister(fd)
        del self.tags[fd]

    def select(self, timeout=None):
        """`(fd, tag)` of each fd that is ready as asked, at its end or in error, waiting at most
        `timeout` seconds (None: until one is)."""
        ms = None if timeout is None else max(0.0, timeout) * 1000
        return [(fd, self.tags[fd]) for fd, _ in self._poll.poll(ms) if fd in self.tags]
