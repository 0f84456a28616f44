"""The HTTP side of `teacher.url`: one JSON request to an OpenAI-compatible server, retried.

Connection errors, timeouts and the statuses a busy or restarting server answers with (408,
429, 5xx) are retried with exponential backoff (0.5 s, 1 s, 2 s, ... capped at 8 s), within a
bounded number of tries and a bounded total time, so a dead server ends the run with a clear
`RemoteTeacherError` instead of a hang. Any other 4xx is an error at once: asking again would
get the same answer. httpx (the `remote` extra) is imported on first use.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from distil.errors import DistilError, require

log = logging.getLogger("distil.teacher.remote")

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class RemoteTeacherError(DistilError):
    """The teacher server cannot be reached, refuses us, or answers something unusable."""


@dataclass(frozen=True)
class RetryPolicy:
    tries: int = 6  # attempts per request, the first included
    first_wait_s: float = 0.5  # wait after the first failure; doubled after each
    max_wait_s: float = 8.0
    total_s: float = 120.0  # no new attempt starts later than this after the first
    timeout_s: float = 300.0  # one request: a batch of sequences through a large teacher


def excerpt(text: str, limit: int = 300) -> str:
    """The start of a response body on one line, for an error message."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + " ..."


class RemoteClient:
    """A thread-safe JSON client for `base_url` (ending in /v1) with retries."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        policy: RetryPolicy | None = None,
        connections: int = 8,
        transport=None,
    ):
        httpx = require("httpx", "remote", "teacher.url")
        self.url = base_url.rstrip("/")
        self.policy = policy or RetryPolicy()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._httpx = httpx
        self._http = httpx.Client(
            headers=headers,
            timeout=self.policy.timeout_s,
            limits=httpx.Limits(max_connections=connections),
            transport=transport,  # tests: httpx.MockTransport
        )

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, body: dict | None = None, *, hint: str = "") -> Any:
        """The decoded JSON answer to `method path`; retried as the module says.

        `hint` is added to the message of a 4xx answer (what to check for this request)."""
        p = self.policy
        start = time.monotonic()
        last = ""
        for attempt in range(1, p.tries + 1):
            try:
                r = self._http.request(method, self.url + path, json=body)
            except self._httpx.TransportError as exc:  # connect, read, write, timeouts
                last = f"{type(exc).__name__}: {exc}"
            else:
                if r.status_code < 400:
                    return self._json(method, path, r)
                if r.status_code not in RETRY_STATUS:
                    raise self._refused(method, path, r, hint)
                last = f"HTTP {r.status_code}: {excerpt(r.text)}"
            wait = min(p.first_wait_s * 2 ** (attempt - 1), p.max_wait_s)
            if attempt == p.tries or time.monotonic() - start + wait > p.total_s:
                break
            log.warning(
                "teacher server %s%s: %s; retry %d of %d in %.1f s",
                self.url,
                path,
                last,
                attempt,
                p.tries - 1,
                wait,
            )
            time.sleep(wait)
        raise RemoteTeacherError(
            f"the teacher server at {self.url} did not answer {method} {path} after {attempt} "
            f"tries over {time.monotonic() - start:.1f} s (last: {last}). Check that the server "
            f"is running and reachable from this machine (curl {self.url}/models), that "
            "teacher.url is its address ending in /v1, and the server's log (out of memory, a "
            "crash, a restart)"
        )

    def _json(self, method: str, path: str, r) -> Any:
        try:
            return r.json()
        except ValueError:
            raise RemoteTeacherError(
                f"the teacher server at {self.url} answered {method} {path} with HTTP "
                f"{r.status_code} but not JSON: {excerpt(r.text)!r}. Check that teacher.url "
                "points to an OpenAI-compatible server (its address ending in /v1)"
            ) from None

    def _refused(self, method: str, path: str, r, hint: str) -> RemoteTeacherError:
        what = (
            f"the teacher server at {self.url} refused {method} {path}: HTTP {r.status_code}: "
            f"{excerpt(r.text)}."
        )
        if r.status_code in (401, 403):
            return RemoteTeacherError(
                f"{what} Fix: set teacher.api_key_env to the name of an environment variable "
                "holding the server's API key (vllm serve --api-key, distil serve-teacher "
                "--api-key-env) and export it in this shell"
            )
        if r.status_code == 404:  # a wrong address or model name, whatever the request
            hint = (
                "Check teacher.url (the server's address ending in /v1) and teacher.path (the "
                "served model name)."
            )
        return RemoteTeacherError(f"{what} {hint}".strip())
