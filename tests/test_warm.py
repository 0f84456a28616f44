"""tests/warm.py: a forked child behaves as the fresh interpreter it stands in for, against
`subprocess` running the same command."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import warm

PROBE = (
    "import json, os, sys\n"
    "print(json.dumps({'argv': sys.argv, 'cwd': os.getcwd(), 'x': os.environ.get('DISTIL_X'),"
    " 'main': __name__, 'pid': os.getpid()}))\n"
    "print('to stderr', file=sys.stderr)\n"
    "raise SystemExit(int(sys.argv[1]))\n"
)


def test_a_forked_child_sees_what_a_fresh_interpreter_sees(tmp_path):
    cmd = [sys.executable, "-c", PROBE, "3", "b"]
    env = {**os.environ, "DISTIL_X": "y"}
    fresh = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env)
    forked = warm.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert warm.warm_eligible(cmd)
    assert (
        (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr) == (3, "to stderr\n")
    )
    a, b = (json.loads(r.stdout) for r in (fresh, forked))
    assert a.pop("pid") != b.pop("pid") != os.getpid()
    assert a == b == {"argv": ["-c", "3", "b"], "cwd": str(tmp_path), "x": "y", "main": "__main__"}


def test_a_module_runs_as_python_dash_m():
    cmd = [sys.executable, "-m", "distil", "--version"]
    fresh, forked = (
        subprocess.run(cmd, capture_output=True, text=True),
        warm.run(cmd, capture_output=True, text=True),
    )
    assert (
        (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout) == (0, fresh.stdout)
    )
    assert fresh.stdout.strip()


def test_exit_statuses_signals_threads_and_atexit(tmp_path):
    code = (
        "import atexit, threading, time, sys\n"
        "atexit.register(lambda: open(sys.argv[1], 'a').write('atexit\\n'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), open(sys.argv[1], 'a')"
        ".write('thread\\n'))).start()\n"
        "raise ValueError('boom')\n"
    )
    done = warm.run([sys.executable, "-c", code, tmp_path / "log"], capture_output=True, text=True)
    assert done.returncode == 1 and "ValueError: boom" in done.stderr
    assert (tmp_path / "log").read_text() == "thread\natexit\n"  # joined, then atexit
    sleeper = warm.popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sleeper.stdout.readline() == "up\n" and sleeper.poll() is None
    sleeper.send_signal(signal.SIGTERM)
    assert sleeper.wait(30) == -signal.SIGTERM
    sleeper.stdout.close()
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5)


def test_a_child_imports_with_its_own_import_time_environment(tmp_path):
    """A child whose PYTHONPATH or HF_* settings differ from the collection's is forked from a
    server started with them: what it imports reads what a fresh interpreter would read."""
    (tmp_path / "probe_mod.py").write_text("X = 'from the path'\n")
    code = (
        "import probe_mod, huggingface_hub.constants as c\nprint(probe_mod.X, c.HF_HUB_OFFLINE)\n"
    )
    cmd = [sys.executable, "-c", code]
    for offline in ("1", "0"):
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": offline}
        fresh = subprocess.run(cmd, capture_output=True, text=True, env=env)
        forked = warm.run(cmd, capture_output=True, text=True, env=env)
        assert forked.stdout == fresh.stdout == f"from the path {offline == '1'}\n"
    assert warm.warm_eligible([sys.executable, "-m", "distil"])
    assert not warm.warm_eligible([sys.executable, "-S", "-c", "pass"])
    assert not warm.warm_eligible(["/bin/echo", "-c", "x"])
    assert isinstance(warm.popen(["/bin/true"]), subprocess.Popen)


def test_ranks_get_torchruns_environment_and_a_failure_stops_the_others(tmp_path):
    show = (
        "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT'])"
    )
    done = warm.launch_ranks([sys.executable, "-c", show], 2, 29599)
    assert (done.returncode, done.stdout) == (0, "0 2 29599\n1 2 29599\n")
    fail = "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(2)\ntime.sleep(60)"
    start = time.monotonic()
    done = warm.launch_ranks([sys.executable, "-c", fail], 2, 29599)
    assert done.returncode == 2 and time.monotonic() - start < 30  # rank 0 was stopped
    group = (
        "import os, signal, time\n"
        "if os.environ['RANK'] == '1': time.sleep(0.5); os.killpg(os.getpgid(0), signal.SIGKILL)\n"
        "time.sleep(60)"
    )
    done = warm.launch_ranks([sys.executable, "-c", group], 2, 29599)
    assert done.returncode == -signal.SIGKILL  # every rank went down with the group


def test_a_script_runs_with_its_directory_on_the_path(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    (tmp_path / "main.py").write_text(
        "import sys, helper\nprint(helper.VALUE, sys.argv[1:], __name__)\n"
    )
    cmd = [sys.executable, str(tmp_path / "main.py"), "x"]
    fresh = subprocess.run(cmd, capture_output=True, text=True)
    forked = warm.run(cmd, capture_output=True, text=True)
    assert warm.warm_eligible(cmd)
    assert forked.stdout == fresh.stdout == "7 ['x'] __main__\n"
    assert not warm.warm_eligible([sys.executable, "main.py"])  # relative: a fresh interpreter


def test_the_server_dies_with_the_process_that_started_it(tmp_path):
    code = (
        "import sys, os; sys.path.insert(0, sys.argv[1]); import warm\n"
        "warm.run([sys.executable, '-c', 'pass'])\n"
        "print(next(iter(warm._servers.values())).proc.pid, flush=True)\n"
        "os._exit(0)\n"  # no atexit: as a killed pytest worker
    )
    tests_dir = os.path.dirname(os.path.abspath(warm.__file__))
    done = subprocess.run([sys.executable, "-c", code, tests_dir], capture_output=True, text=True)
    pid = int(done.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return  # dead, not yet reaped
        except FileNotFoundError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError("the warm server outlived the process that started it")
