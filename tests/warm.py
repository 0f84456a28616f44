"""Python processes forked from one warm interpreter, for the tests that start many (issue #45).

A test that runs `python -c CODE`, `python -m MODULE` or `python /abs/script.py` pays for a
fresh interpreter importing torch and transformers first: 4-7 CPU-seconds here, more than the
work of most such tests. `popen`/`run` start the same command as a real process forked from a
server that has made those imports once (one server per pytest worker, started on first use):

- the child is a real process with its own pid: it is signalled, killed, leaves partial files
  and exits with a status as a freshly started one does (`returncode` -9 after SIGKILL);
- it runs the command as the interpreter would: `sys.argv`, the working directory, the
  environment, stdin/stdout/stderr (pipes, files or this process's own), a new session on
  request, `__main__`; at its end the non-daemon threads are joined and the atexit functions
  run, then the process exits with the command's status;
- what differs from a fresh interpreter is what the server imported before the fork (torch,
  transformers, distil) and its hash seed (PYTHONHASHSEED: one per server, not one per child). The server is started with the child's import-time
  environment (PYTHONPATH, HF_*, TORCH*, MALLOC_*, ...: `IMPORT_ENV`), one server per such
  environment, so an import reads what it would have read in the child; anything but
  `python -c`/`-m`/a script runs as a fresh interpreter, and tests that are about a fresh
  interpreter (what `import distil` loads) keep using `subprocess`.

`launch_ranks` starts the ranks of a multi-process run this way with the environment torchrun
gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), and, as
torchrun does, stops the other ranks when one fails. The tests that are about the launchers
themselves keep starting torchrun or accelerate.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL

# imported once by the server, before any fork
PRELOAD = (
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "distil.cli",
    "distil.train.loop",
)
# what the preloaded modules read from the environment when they are imported: a child whose
# environment differs from the server's in one of these starts as a fresh interpreter (the
# others, such as RANK or OMP_NUM_THREADS, are read when they are used)
IMPORT_ENV = ("HOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "XDG_CACHE_HOME")
IMPORT_ENV_PREFIXES = (
    "PYTHON", "HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "TORCH", "PYTORCH", "CUDA",
    "OMP_WAIT", "OMP_PROC", "OMP_PLACES", "GOMP_", "KMP_", "MKL_", "MALLOC_", "NUMBA_",
)  # fmt: skip
# the environment when the tests were collected (a test's monkeypatched variables are not the
# server's)
BASE_ENV = dict(os.environ)

SERVER = r"""
import importlib, json, os, signal, socket, sys, traceback
try:  # Linux: this server dies with the pytest worker that started it, however that ends
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[3]):
    sys.exit(0)
for name in sys.argv[2].split(","):
    try:
        importlib.import_module(name)
    except ImportError:  # another PYTHONPATH: what a child needs, it imports itself
        pass
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the monitors are reaped by the kernel
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(16)
print("ready", flush=True)


def run_child(spec, fds, received, new_session):
    if new_session:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(received) - {0, 1, 2}:  # every rank's copies: only its own 0/1/2 stay
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(spec["cwd"])
    os.environ.clear()
    os.environ.update(spec["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False, buffering=1 if unbuffered else -1)
    sys.stderr = sys.__stderr__ = open(
        2, "w", closefd=False, buffering=1, errors="backslashreplace"
    )
    if "OMP_NUM_THREADS" in os.environ:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    code, interrupted = 0, False
    try:
        import builtins, types

        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        if spec["mode"] == "-c":  # sys.path[0] stays "", as for `python -c`
            sys.argv = ["-c", *spec["args"]]
            exec(compile(spec["target"], "<string>", "exec"), main.__dict__)
        elif spec["mode"] == "-m":
            import runpy

            sys.argv = [spec["target"], *spec["args"]]
            sys.path[0] = os.getcwd()
            runpy.run_module(spec["target"], run_name="__main__", alter_sys=True)
        else:  # a script: its directory is sys.path[0], as the interpreter puts it
            path = os.path.abspath(spec["target"])
            sys.argv = [spec["target"], *spec["args"]]
            sys.path[0] = os.path.dirname(path)
            main.__file__ = spec["target"]
            with open(path, "rb") as f:
                exec(compile(f.read(), spec["target"], "exec"), main.__dict__)
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        import atexit, threading

        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if interrupted:  # as the interpreter ends on an unhandled KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def monitor(conn, req, fds):
    # the parent of the request's children: reports their pids, then each one's exit status
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if req["group"]:  # one new session for all the children (a group kill reaches them all)
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    pids = []
    for i, spec in enumerate(req["children"]):
        pid = os.fork()
        if pid == 0:
            conn.close()
            new_session = req["new_session"] and not req["group"]
            run_child(spec, fds[3 * i : 3 * i + 3], fds, new_session)
        pids.append(pid)
    for fd in fds:
        os.close(fd)
    conn.sendall((" ".join(map(str, pids)) + "\n").encode())
    for _ in pids:
        pid, status = os.wait()
        conn.sendall(f"{pid} {os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def read_request(conn):
    head, fds, _, _ = socket.recv_fds(conn, 16, 3 * 64)  # the body's length, and the fds
    try:
        body = b""
        while len(body) < int(head):
            chunk = conn.recv(1 << 20)
            if not chunk:
                raise ValueError("the client went away")
            body += chunk
        return json.loads(body.decode()), fds
    except Exception:
        for fd in fds:
            os.close(fd)
        raise


while True:
    conn, _ = listener.accept()
    try:
        req, fds = read_request(conn)
    except Exception:  # a client interrupted mid-request: drop it, serve the next
        conn.close()
        continue
    if os.fork() == 0:
        listener.close()
        monitor(conn, req, fds)
    conn.close()
    for fd in fds:
        os.close(fd)
"""


class _Server:
    """A warm interpreter started with `env` (the import-time part of a child's environment
    over the collection's), one per such environment and pytest worker, on first use."""

    def __init__(self, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="distil-warm-")
        self.path = os.path.join(self.dir, "socket")
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, self.path, ",".join(PRELOAD), str(os.getpid())],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.env,
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)
        if not ready or self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the warm server did not start (exit {self.proc.wait()})")
        atexit.register(self.close)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        Path(self.path).unlink(missing_ok=True)
        if os.path.isdir(self.dir):
            os.rmdir(self.dir)

    def start(self, children: list[dict], fds: list[int], new_session: bool, group: bool):
        """Fork `children` (one dict each: mode, target, args, cwd, env; three fds each):
        the connection their statuses come back on, and their pids."""
        body = json.dumps(
            {"children": children, "new_session": new_session, "group": group}
        ).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        socket.send_fds(conn, [f"{len(body):016d}".encode()], fds)
        conn.sendall(body)
        conn.shutdown(socket.SHUT_WR)
        reader = _Lines(conn)
        line = reader.line(120)
        if not line:
            raise RuntimeError(f"the warm server at {self.path} started no process")
        return reader, [int(x) for x in line.split()]


_servers: dict[tuple, _Server] = {}
MAX_SERVERS = 3  # per pytest worker; the least recently used one is closed


def _import_env(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if _read_at_import(k)))


def _get_server(env: dict[str, str]) -> _Server:
    """The warm interpreter for a child with environment `env`: started with the collection's
    environment and `env`'s import-time variables."""
    key = _import_env(env)
    server = _servers.pop(key, None)
    if server is None or server.proc.poll() is not None:
        base = {k: v for k, v in BASE_ENV.items() if not _read_at_import(k)}
        server = _Server({**base, **dict(key)})
    _servers[key] = server  # last: the most recently used
    while len(_servers) > MAX_SERVERS:
        _servers.pop(next(iter(_servers))).close()
    return server


class _Lines:
    """Lines from the monitor's connection; None on a timeout, "" when it closed."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer, self.closed = conn, b"", False

    def line(self, timeout: float | None) -> str | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            if self.closed:
                return ""
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.conn], [], [], left)
            if not ready:
                return None
            chunk = self.conn.recv(4096)
            if not chunk:
                self.close()
                continue
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.conn.close()


def _warm_target(cmd: list[str]) -> tuple[str, str, list[str]] | None:
    """('-c', code, args), ('-m', module, args) or ('path', script, args) when `cmd` is this
    interpreter running code, a module or a script with no interpreter options; else None."""
    if len(cmd) < 2 or os.path.realpath(cmd[0]) != os.path.realpath(sys.executable):
        return None
    if cmd[1] in ("-c", "-m"):
        return cmd[1], cmd[2], list(cmd[3:])
    if cmd[1].endswith(".py") and os.path.isabs(cmd[1]) and os.path.isfile(cmd[1]):
        return "path", cmd[1], list(cmd[2:])
    return None


def _read_at_import(key: str) -> bool:
    return key in IMPORT_ENV or key.startswith(IMPORT_ENV_PREFIXES)


def warm_eligible(cmd) -> bool:
    """Whether `cmd` runs forked from a warm interpreter (else as a fresh one)."""
    if os.environ.get("DISTIL_TEST_WARM", "1") == "0":
        return False
    return _warm_target([str(c) for c in cmd]) is not None


def _spec(cmd: list[str], env, cwd) -> dict:
    mode, target, args = _warm_target(cmd)
    return {
        "mode": mode,
        "target": target,
        "args": args,
        "cwd": str(cwd) if cwd is not None else os.getcwd(),
        "env": dict(os.environ if env is None else env),
    }


def _fd_for(spec, default_fd: int, opened: list[int]) -> int:
    if spec is None:
        return default_fd
    if spec == DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd
    return spec if isinstance(spec, int) else spec.fileno()


class WarmProcess:
    """A forked child, with the part of `subprocess.Popen`'s interface the tests use."""

    def __init__(
        self,
        cmd,
        *,
        stdin=None,
        stdout=None,
        stderr=None,
        env=None,
        cwd=None,
        text=False,
        start_new_session=False,
    ) -> None:
        self.args = [str(c) for c in cmd]
        self.returncode: int | None = None
        self._text = text
        self.stdin = self.stdout = self.stderr = None
        ours: list[int] = []  # fds the child gets and this process closes once they are sent
        if stdin == PIPE:
            r, w = os.pipe()
            ours.append(r)
            self.stdin = open(w, "w" if text else "wb")  # noqa: SIM115 (closed by communicate)
            fds = [r]
        else:
            fds = [_fd_for(stdin, 0, ours)]
        for spec, default, name in ((stdout, 1, "stdout"), (stderr, 2, "stderr")):
            if spec == PIPE:
                r, w = os.pipe()
                ours.append(w)
                setattr(self, name, open(r, "r" if text else "rb"))  # noqa: SIM115 (as Popen)
                fds.append(w)
            elif spec == STDOUT:
                fds.append(fds[1])
            else:
                fds.append(_fd_for(spec, default, ours))
        spec = _spec(self.args, env, cwd)
        try:
            self._lines, (self.pid,) = _get_server(spec["env"]).start(
                [spec], fds, new_session=start_new_session, group=False
            )
        finally:
            for fd in ours:
                os.close(fd)

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            line = self._lines.line(timeout)
            if line is None:
                return None
            # "" : the monitor was killed with the child's process group (a group SIGKILL)
            self.returncode = int(line.split()[1]) if line else -signal.SIGKILL
            self._lines.close()
        return self.returncode

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        if self._status(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None and not self.stdin.closed:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        pipes = [s for s in (self.stdout, self.stderr) if s is not None and not s.closed]
        chunks = {id(s): [] for s in (self.stdout, self.stderr) if s is not None}
        while pipes:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            ready, _, _ = select.select(pipes, [], [], left)
            for stream in ready:
                data = os.read(stream.fileno(), 1 << 16)
                if data:
                    chunks[id(stream)].append(data)
                else:
                    pipes.remove(stream)
                    stream.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        results = []
        for stream in (self.stdout, self.stderr):
            if stream is None:
                results.append(None)
                continue
            data = b"".join(chunks[id(stream)])
            results.append(data.decode(errors="replace") if self._text else data)
        return tuple(results)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile, as Popen
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def popen(cmd, **kwargs):
    """`subprocess.Popen(cmd, **kwargs)`, forked from the warm server where `cmd` allows it."""
    if warm_eligible(cmd):
        return WarmProcess(cmd, **kwargs)
    return subprocess.Popen([str(c) for c in cmd], **kwargs)


def run(cmd, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """`subprocess.run`, forked from the warm server where `cmd` allows it."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = PIPE
    if input is not None:
        kwargs["stdin"] = PIPE
    proc = popen(cmd, **kwargs)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()  # not its pipes: a descendant may hold them (as subprocess.run)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def torchrun_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    """What torchrun sets for a worker of a one-node run."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "ROLE_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": "none",
    }


def launch_ranks(cmd, nproc: int, port: int, *, env=None, timeout: float = 600, cwd=None):
    """Run `cmd` (`[python, -m, module, ...]` or `[python, -c, code, ...]`) as `nproc` ranks
    forked from the warm server with torchrun's worker environment (`torchrun_env`), in one new
    session (a kill of the process group takes them all down), output captured: the ranks'
    stdout and stderr are joined in rank order. When a rank fails the others are stopped
    (SIGTERM, then SIGKILL after 30 s), as torchrun does. The returncode is that of the rank
    that failed first (-9 for ranks killed with their group), or 0."""
    cmd = [str(c) for c in cmd]
    base = dict(os.environ if env is None else env)
    base.setdefault("OMP_NUM_THREADS", "1")
    if not warm_eligible(cmd):
        raise ValueError(f"not a warm command (python -c/-m/script): {cmd[:3]}")
    files = [(tempfile.TemporaryFile(), tempfile.TemporaryFile()) for _ in range(nproc)]  # noqa: SIM115
    stdin = os.open(os.devnull, os.O_RDONLY)
    try:
        specs = [_spec(cmd, {**base, **torchrun_env(r, nproc, port)}, cwd) for r in range(nproc)]
        fds = [fd for out, err in files for fd in (stdin, out.fileno(), err.fileno())]
        lines, pids = _get_server(specs[0]["env"]).start(specs, fds, new_session=True, group=True)
    finally:
        os.close(stdin)
    codes: dict[int, int] = {}
    failed = 0
    deadline = time.monotonic() + timeout
    stop_at: float | None = None
    while len(codes) < nproc:
        line = lines.line(0.1)
        if line == "":  # the monitor died with the group: every rank left was killed with it
            failed = failed or -signal.SIGKILL
            break
        if line is not None:
            pid, code = map(int, line.split())
            codes[pid] = code
            if code != 0 and stop_at is None:
                failed, stop_at = code, time.monotonic()
                _signal_all(pids, codes, signal.SIGTERM)
        if stop_at is not None and time.monotonic() - stop_at > 30:
            _signal_all(pids, codes, signal.SIGKILL)
        if time.monotonic() > deadline:
            _signal_all(pids, codes, signal.SIGKILL)
            raise subprocess.TimeoutExpired(cmd, timeout)
    texts = []
    for out, err in files:
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
            f.close()
    lines.close()
    return subprocess.CompletedProcess(cmd, failed, "".join(texts[0::2]), "".join(texts[1::2]))


def _signal_all(pids: list[int], done: dict[int, int], sig: int) -> None:
    for pid in pids:
        if pid not in done:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
