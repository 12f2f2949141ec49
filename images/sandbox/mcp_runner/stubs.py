"""The code the user's interpreter runs, passed to it with `-c` (see `child`). It runs in
that interpreter, not in the runner's: standard library only, Python 3.6+, and nothing
defined here may stay visible to the user's code (each stub clears `__main__` before the
user's code runs)."""

FIGURES_CODE = r"""
def _mcp_figures():
    # Figures shown with plt.show() are saved by the sandbox backend (mcp_backend.py);
    # those still open when the code ends are saved by the function returned here
    # (called before interpreter shutdown: matplotlib's own atexit closes them all).
    import os, sys
    sys.path.append('/opt/mcp-code-executor/pylib')
    os.environ['MPLBACKEND'] = 'module://mcp_backend'
    def save_open():
        if 'matplotlib.pyplot' in sys.modules:
            try:
                import mcp_backend
                mcp_backend.save_all()
            except Exception as e:
                sys.stderr.write('[figure capture failed: %r]\n' % (e,))
    return save_open
"""

# Runs in the child interpreter: wait on fd 3 for what it is for. `S` (see
# `Child.serve`): it becomes a session's interpreter (`_mcp_repl`, below), with what it
# preloaded still loaded. `R` (see `Child.go`): the entry file's path (and its bytes)
# follow; it runs the file in the real `__main__` module, as `python FILE` does (so
# pickling functions defined there works), with tracebacks that start at the user's file.
# A waiting sandbox so serves a one-shot run or a session alike: a session no longer
# starts a second interpreter and imports the preload list again on its first cell.
RUN_CODE = r"""
def _mcp_read(n):
    import os
    b = b''
    while len(b) < n:
        c = os.read(3, n - len(b))
        if not c:
            os._exit(0)
        b += c
    return b


def _mcp_env(text):
    # `NAME=VALUE` lines to set, `-NAME` to unset.
    import os
    for line in text.splitlines():
        if line.startswith('-'):
            os.environ.pop(line[1:], None)
        elif '=' in line:
            k, v = line.split('=', 1)
            os.environ[k] = v


def _mcp_run(save_open_figures):
    # `resource` (an extension module: files opened and mapped) is loaded while the
    # sandbox waits, not for the done line: 2-4 ms of the report's path under gVisor; so
    # is what a session's interpreter needs (`ast`, `json`, `linecache`, `struct`).
    import os, sys, builtins, resource
    import ast, json, linecache, struct
    if os.read(3, 1) == b'S':
        # `S`, the variables to set (a 4-byte length, then ENV), then the cells.
        n = struct.unpack('>I', _mcp_read(4))[0]
        _mcp_env(_mcp_read(n).decode())
        return _mcp_repl(save_open_figures)
    # `PATH\0NONCE\0ENV`, then `\0` and the file's bytes when the runner had them; ENV
    # is `NAME=VALUE` lines to set (`-NAME`: unset), egress's proxy variables.
    chunks = []
    while True:
        c = os.read(3, 65536)
        if not c:
            break
        chunks.append(c)
    os.close(3)
    if not chunks:
        os._exit(0)
    parts = b''.join(chunks).split(b'\0', 3)
    chunks = None
    path, nonce = os.path.abspath(parts[0].decode()), parts[1].decode()
    _mcp_env(parts[2].decode() if len(parts) > 2 else '')
    source = parts[3] if len(parts) > 3 else None
    parts = None
    sys.argv = [path]
    sys.path[0] = os.path.dirname(path)
    if source is None:
        # Plain reads, sized by the file: a file object adds system calls (slow under gVisor).
        fd = os.open(path, os.O_RDONLY)
        try:
            chunks = [os.read(fd, os.fstat(fd).st_size + 1)]
            while chunks[-1]:
                chunks.append(os.read(fd, 65536))
        finally:
            os.close(fd)
        source = b''.join(chunks)
        chunks = None
    loader = sys.modules['_frozen_importlib_external'].SourceFileLoader('__main__', path)
    g = sys.modules['__main__'].__dict__
    g.clear()
    g.update(__name__='__main__', __doc__=None, __package__=None, __spec__=None,
             __loader__=loader, __file__=path, __cached__=None, __builtins__=builtins)
    status = 0
    code = None
    try:
        # Compiled inside the try: a syntax error is reported as `python FILE` does, with
        # no frame of this stub above it.
        code = compile(source, path, 'exec', dont_inherit=True)
        source = None
        exec(code, g)
    except SystemExit as e:
        save_open_figures()
        status = e.code
    except BaseException as e:
        # The traceback starts at the user's file; none of this stub's frames (`<string>`,
        # `_mcp_run`) is shown, also when no frame of the file is in it (a syntax error).
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        e.__traceback__ = tb
        sys.excepthook(type(e), e, tb)
        save_open_figures()
        status = 1
    else:
        save_open_figures()
    # Leave as `python FILE` does, without its slow part: threads joined, atexit handlers
    # run, the code's own objects freed (files it left open are flushed and closed, its
    # __del__ methods run; objects held only in reference cycles are not collected), the
    # standard streams flushed; then out, skipping the teardown of every loaded module and
    # the final collections (some 100 ms with pandas and matplotlib loaded, for nothing).
    if status is None:
        status = 0
    elif not isinstance(status, int):
        try:
            sys.stderr.write(str(status) + '\n')
        except Exception:
            pass
        status = 1
    e = tb = code = None
    try:
        sys.modules['threading']._shutdown()
    except Exception:
        pass
    try:
        import atexit
        atexit._run_exitfuncs()
    except Exception:
        pass
    g.clear()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        status = 120
    status &= 0xFF
    # Done: say so on the status channel (naming the run's nonce and this process, with
    # what it used) and close the output pipes, so that the runner can report now instead of after
    # the exit, which unmaps every page of the process first (some 6 ms with pandas loaded,
    # 10 under gVisor). A line the code forged could only end its own run early.
    try:
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_ms = int((me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime) * 1000)
        rss = max(me.ru_maxrss, kids.ru_maxrss)
        line = 'D %s %d %d %d %d\n' % (nonce, os.getpid(), status, cpu_ms, rss)
        os.write(4, line.encode())
        os.close(1)
        os.close(2)
    except Exception:
        pass
    os._exit(status)
"""

# A session's interpreter (after `S`, or from the start): cells arrive on fd 3 (u32 length, source), run REPL-style in
# one persistent `__main__` (the value of a final expression is displayed), and each ends
# with a status line on fd 4.
REPL_CODE = r"""
def _mcp_repl(save_open_figures):
    import os, sys, ast, builtins, json, linecache, struct
    g = sys.modules['__main__'].__dict__
    warm_up = g['_mcp_warm']  # cleared with `__main__` next
    g.clear()
    g.update(__name__='__main__', __doc__=None, __package__=None, __spec__=None,
             __loader__=None, __builtins__=builtins)
    sys.argv = ['']
    sys.path[0] = os.getcwd()
    def read_exact(n):
        b = b''
        while len(b) < n:
            c = os.read(3, n - len(b))
            if not c:
                os._exit(0)
            b += c
        return b
    n = 0
    warming = None  # (stop, cell ended, thread) of the last warm-up
    while True:
        # `W` (see `_mcp_warm`): what to import while the session waits.
        first = read_exact(1)
        if first == b'W':
            (size,) = struct.unpack('>I', read_exact(4))
            last = warming[2] if warming is not None and warming[2].is_alive() else None
            warming = warm_up(json.loads(read_exact(size).decode()), last)
            continue
        if warming is not None:
            warming[0]()  # a cell: the warm-up stops after the module it is in
        # Each cell comes with a fresh nonce that its status line must name: the runner
        # ignores any other line on fd 4 (one the code wrote itself, say).
        nonce = (first + read_exact(31)).decode('ascii', 'replace')
        (size,) = struct.unpack('>I', read_exact(4))
        src = read_exact(size).decode('utf-8', 'replace')
        n += 1
        name = '<cell %d>' % n
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        ok = True
        try:
            tree = ast.parse(src, name, 'exec')
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, name, 'exec'), g)
            if last is not None:
                sys.displayhook(eval(compile(last, name, 'eval'), g))
        except SystemExit:
            save_open_figures()
            raise
        except BaseException as e:
            ok = False
            tb = e.__traceback__
            while tb is not None and not tb.tb_frame.f_code.co_filename.startswith('<cell'):
                tb = tb.tb_next
            e.__traceback__ = tb
            if sys.excepthook is sys.__excepthook__:
                import traceback  # the Python one reads cell sources from linecache
                traceback.print_exception(type(e), e, tb)
            else:
                sys.excepthook(type(e), e, tb)
        save_open_figures()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        if warming is not None:
            warming[1]()
        os.write(4, ('\n' + json.dumps({'ok': ok, 'cell': nonce}) + '\n').encode())
"""

# A session's idle warm-up (issue 43): `W`, a 4-byte length and JSON `{"modules": [...],
# "budget": bytes, "cpus": quota or null, "seq": n}` on fd 3 between cells. A thread of the
# session's interpreter, SCHED_BATCH where allowed (it never preempts a thread that wakes
# up, a cell's), imports each module not yet imported, skipping one whose estimated size
# (its package's files on disk) would take the sandbox's memory past the budget, and
# stopping past it; it never runs the user's code. Not SCHED_IDLE nor nice 19: the sandbox
# cannot raise a thread's priority again (no CAP_SYS_NICE, RLIMIT_NICE 0), and a cell
# importing the module the warm-up is in waits for the interpreter's module lock that
# thread holds: at SCHED_IDLE beside anything runnable it hardly ran and the cell waited
# (issue 43, measured). A cell that arrives runs at once on the main thread, and the
# warm-up then stops after the module it is in. What kept such a cell waiting, each
# measured (docs/mcp.md "Sessions"), and what the warm-up does about it:
# - the interpreter lock: while it works the warm-up sets the switch interval to 0.5 ms, so
#   that it holds the lock that long at most while in Python code (at the default 5 ms a
#   third of the cells sent during it started 26-52 ms late);
# - the sandbox's CPU quota: a thread importing flat out uses a whole CPU, all of `--cpus 1`;
#   anything else of the sandbox running meanwhile spends the quota before the period ends
#   and the whole sandbox is throttled until it does (beside a busy thread: 12 of 23
#   periods, stalls of 30-50 ms; the runner's short wake-ups were not seen throttled, but
#   a cell's thread may run long). The warm-up paces itself to PACE of the
#   quota (at each module it looks for, it sleeps off what it ran over, letting go of the
#   import lock), leaving the rest for a cell; a cell wakes it, and it paces no more (the
#   cell may wait for the lock of the module it is in);
# - the cyclic garbage collector: a full collection amid pandas' import holds the lock for
#   20-25 ms. The warm-up turns automatic collection off while it imports and collects the
#   young generations itself at each module it finds (as the automatic one would, without
#   the full collection); done, it makes the full collection while the session still
#   waits; stopped by a cell, collection is back on before the cell runs (the cell's thread
#   turns it back on) and the warm-up never touches it again. Off only if it was on.
# One warm-up at a time: a new one first waits for the last one's module. Done (not
# stopped), it writes `{"warm": [...], "skipped": [...], "seq": n}` on fd 4 (no nonce:
# never a cell's). `_mcp_warm` returns a function that stops it (the cell's thread calls
# it as a cell comes), one that says the cell ended, and its thread. A warm-up a cell
# stopped ends with that cell: it holds nothing then (no module, no CPU), and it is seen.
WARM_CODE = r"""
def _mcp_warm(msg, last):
    import os, sys, json, threading, time, gc, _imp
    PACE = 0.7
    # `off`: automatic collection is off because the warm-up turned it off (and on again
    # by whichever of the two threads comes first).
    state = {'stop': False, 'gc': gc.isenabled(), 'off': False}
    lock = threading.Lock()
    stopped = threading.Event()  # wakes the warm-up from its pacing at once
    def collection_back():
        if state['off']:
            state['off'] = False
            gc.enable()
    def stop():
        with lock:
            state['stop'] = True
            collection_back()
        stopped.set()
    def used():
        for path, keys in (('/sys/fs/cgroup/memory/memory.stat', ('total_rss', 'total_mapped_file')),
                           ('/sys/fs/cgroup/memory.stat', ('anon', 'file_mapped'))):
            try:
                with open(path) as f:
                    vals = dict(l.split()[:2] for l in f if l.strip())
                return sum(int(vals[k]) for k in keys)
            except (OSError, KeyError, ValueError):
                pass
        return None
    def size_of(name):
        import importlib.util
        try:
            spec = importlib.util.find_spec(name.split('.')[0])
        except Exception:
            return None
        if spec is None:
            return None
        total = 0
        for d in (spec.submodule_search_locations or []):
            for root, _dirs, files in os.walk(d):
                if state['stop']:
                    return None  # a cell came (a walk of pandas takes 20 ms)
                for f in files:
                    try:
                        total += os.lstat(os.path.join(root, f)).st_size
                    except OSError:
                        pass
        if not total and spec.origin:
            try:
                total = os.stat(spec.origin).st_size
            except OSError:
                pass
        return total
    cpus = msg.get('cpus')
    duty = min(1.0, PACE * cpus) if isinstance(cpus, (int, float)) and cpus > 0 else 1.0
    class Pace:
        # First on sys.meta_path while the warm-up works: called at every module any
        # thread looks for, it acts only in the warm-up's own thread and finds nothing.
        def __init__(self):
            self.ident = threading.get_ident()
            self.wall, self.cpu = time.monotonic(), time.thread_time()
        def find_spec(self, name, path=None, target=None):
            if threading.get_ident() != self.ident or state['stop']:
                return None
            if state['off']:
                young, middle, _ = gc.get_count()
                if young > 700:
                    gc.collect(1 if middle >= 10 else 0)
            ran = time.thread_time() - self.cpu
            if ran >= 0.005:
                owed = ran / duty - (time.monotonic() - self.wall)
                if owed > 0:
                    # Finders are asked under the interpreter's import lock: let go of
                    # it while asleep, or a cell's own imports would wait.
                    try:
                        _imp.release_lock()
                        held = True
                    except RuntimeError:
                        held = False  # not this thread's
                    try:
                        stopped.wait(min(owed, 0.1))
                    finally:
                        if held:
                            _imp.acquire_lock()
                self.wall, self.cpu = time.monotonic(), time.thread_time()
            return None
    def work():
        if last is not None:
            last.join()  # the module a cell stopped it in, finished
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except (AttributeError, OSError):
            pass
        interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)
        pace = Pace()
        with lock:
            if state['stop']:
                return
            if state['gc']:
                state['off'] = True
                gc.disable()
        sys.meta_path.insert(0, pace)
        try:
            line = imports()
        finally:
            try:
                sys.meta_path.remove(pace)
            except ValueError:
                pass
            sys.setswitchinterval(interval)
            with lock:
                finished = not state['stop']
                collection_back()
        if finished and line is not None:
            if state['gc']:
                gc.collect()  # the full collection its imports owe, while the session waits
            try:
                os.write(4, ('\n' + json.dumps(line) + '\n').encode())
            except OSError:
                pass
    def imports():
        budget = int(msg.get('budget') or 0)
        done, skipped = [], []
        for name in msg.get('modules') or []:
            if state['stop']:
                return None
            if not isinstance(name, str):
                continue
            if name in sys.modules:
                done.append(name)  # there already: never asked for again
                continue
            if budget:
                size, u = size_of(name), used()
                if size is None:
                    skipped.append(name)  # not found
                    continue
                if u is None or u + size > budget:
                    skipped.append(name)
                    continue
            if state['stop']:
                return None
            try:
                __import__(name)
                done.append(name)
            except BaseException:
                skipped.append(name)  # it failed: not again
            if budget:
                u = used()
                if u is None or u > budget:
                    break
        if state['stop']:
            return None  # a cell came: the runner no longer waits for this line
        return {'warm': done, 'skipped': skipped, 'seq': msg.get('seq')}
    ended = threading.Event()
    def run():
        work()
        if state['stop']:
            ended.wait()  # a warm-up a cell stopped is seen (its thread) until the cell ends
    t = threading.Thread(target=run, name='mcp-warm-up', daemon=True)
    t.start()
    return stop, ended.set, t
"""

# A waiting interpreter (a one-shot run, or a session once told `S`); a session's
# interpreter from the start (a session whose sandbox could not give it the waiting one).
STUB = FIGURES_CODE + WARM_CODE + REPL_CODE + RUN_CODE + "_mcp_run(_mcp_figures())\n"
REPL_STUB = FIGURES_CODE + WARM_CODE + REPL_CODE + "_mcp_repl(_mcp_figures())\n"
