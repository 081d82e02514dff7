"""Child processes of the repo's Python scripts and tests (tools/fixtures, tools/peer, bench,
clients/python/tests): stopping a server and waiting for its HTTP endpoint.

Scripts import it with ``sys.path.insert(0, <repo>/tools)``; standard library only.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request


def stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Stops ``proc``: SIGTERM, then SIGKILL if it has not exited after ``timeout`` seconds;
    returns once it is reaped."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_http_ok(url: str, proc: subprocess.Popen, seconds: float, what: str | None = None,
                 poll: float = 0.2, request_timeout: float = 5) -> None:
    """Polls ``GET url`` every ``poll`` seconds until it answers 200.

    Raises ``RuntimeError`` (naming ``what``, else ``url``) when ``proc`` exits first or no 200
    came within ``seconds``.
    """
    what = what or url
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=request_timeout) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before {url} answered")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not answering at {url} after {seconds} s")
        time.sleep(poll)
