"""Start, talk to and always stop a llama-server, in the spirit of upstream's ServerProcess.

Typed fields become flags; the server listens on a free port of 127.0.0.1 only; start-up waits
for /health; a process that dies or does not come up raises ServerError with the last lines of
its log (captured to a file); the process is stopped on exit, Ctrl-C and test failure alike.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any, TypeVar

import requests

from llama_sparse import timings
from llama_sparse.binaries import binary
from llama_sparse.errors import ArmError


T = TypeVar("T")


class ServerError(ArmError):
    """The server died, never came up, or failed a request; carries its log tail."""


@dataclass
class ServerConfig:
    model: Path
    ctx_size: int = 4096
    parallel: int = 1
    threads: int | None = None
    flash_attn: str | None = "on"          # on | off | auto; None leaves upstream's default
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    batch_size: int | None = None
    ubatch_size: int | None = None
    seed: int = 42
    cache_prompt: bool = True
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    variant: str = "patched"               # which build: patched | upstream
    binary: Path | None = None             # overrides variant
    startup_timeout: float = 300.0

    def args(self) -> list[str]:
        a = ["-m", str(self.model), "-c", str(self.ctx_size), "-np", str(self.parallel),
             "--seed", str(self.seed), "--no-warmup", "--no-webui"]
        if self.threads is not None:
            a += ["-t", str(self.threads), "-tb", str(self.threads)]
        if self.flash_attn is not None:
            a += ["-fa", self.flash_attn]
        if self.cache_type_k:
            a += ["-ctk", self.cache_type_k]
        if self.cache_type_v:
            a += ["-ctv", self.cache_type_v]
        if self.batch_size:
            a += ["-b", str(self.batch_size)]
        if self.ubatch_size:
            a += ["-ub", str(self.ubatch_size)]
        if not self.cache_prompt:
            a += ["--no-cache-prompt"]
        return a + list(self.extra_args)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, config: ServerConfig, log_path: Path):
        self.config = config
        self.log_path = Path(log_path)
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._session = requests.Session()

    # -- life cycle -----------------------------------------------------------------
    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        exe = self.config.binary or binary("llama-server", self.config.variant)
        return [str(exe), *self.config.args(), "--host", "127.0.0.1", "--port", str(self.port)]

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        cmd = self.command
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **self.config.env})
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout
        while time.monotonic() < deadline:
            self._raise_if_dead("while starting")
            try:
                r = self._session.get(f"{self.url}/health", timeout=2)
                if r.status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise ServerError(f"llama-server did not become healthy within {self.config.startup_timeout:.0f} s\n"
                          + self.log_tail())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _raise_if_dead(self, when: str, wait: float = 0.0) -> None:
        """Raise if the process is gone. With `wait`, give a process that just dropped a
        connection that long to be seen exiting (a killed server closes its sockets first)."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=wait) if wait > 0 else None
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is not None:
            raise ServerError(f"llama-server exited with code {self.proc.returncode} {when}\n" + self.log_tail())

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._session.close()

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return f"--- last {min(n, len(lines))} lines of {self.log_path} ---\n" + "\n".join(lines[-n:])

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def read_log(self, offset: int = 0) -> str:
        """The log from byte `offset` on ('' before the server wrote any)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def wait_log_until(self, found: Callable[[str], T | None], offset: int = 0, timeout: float = 10,
                       what: str = "the expected line", required: bool = True) -> T | None:
        """The first value other than None that `found` gives for the log from byte `offset` on,
        read again until it does or `timeout` seconds pass. Every read of a request's log lines
        after its response goes through here: the server writes its log from a thread of its own,
        so a request's last lines (timings, the sparse and SCSA lines) can land after the response.
        At the timeout: ServerError naming `what`, or None when the line is not `required`."""
        deadline = time.monotonic() + timeout
        while True:
            value = found(self.read_log(offset))
            if value is not None:
                return value
            if time.monotonic() > deadline:
                if not required:
                    return None
                raise ServerError(f"{what} did not reach the server log in {timeout:g} s\n" + self.log_tail())
            time.sleep(0.05)

    def wait_log(self, text: str, count: int = 1, timeout: float = 10) -> str:
        """The whole log once it holds `text` at least `count` times."""
        return self.wait_log_until(lambda log: log if log.count(text) >= count else None, timeout=timeout,
                                   what=f"'{text}' ({count} time(s))")

    # -- requests -------------------------------------------------------------------
    def request(self, method: str, path: str, timeout: float = 3600, **kw: Any) -> Any:
        self._raise_if_dead(f"before {method} {path}")
        try:
            r = self._session.request(method, f"{self.url}{path}", timeout=timeout, **kw)
        except requests.RequestException as e:
            self._raise_if_dead(f"during {method} {path}", wait=2.0)
            raise ServerError(f"{method} {path} failed: {e}\n" + self.log_tail()) from e
        if r.status_code >= 400:
            self._raise_if_dead(f"during {method} {path}")
            raise ServerError(f"{method} {path} -> HTTP {r.status_code}: {r.text[:500]}")
        return r.json()

    def metrics(self) -> dict[str, float]:
        """The /metrics scrape of a server started with --metrics: {series: value}, the comment
        lines dropped (a labelled series keeps its labels in its name)."""
        self._raise_if_dead("before GET /metrics")
        try:
            r = self._session.get(f"{self.url}/metrics", timeout=60)
        except requests.RequestException as e:
            raise ServerError(f"GET /metrics failed: {e}\n" + self.log_tail()) from e
        if r.status_code >= 400:
            raise ServerError(f"GET /metrics -> HTTP {r.status_code}: {r.text[:500]} (started without --metrics?)")
        series = (line.rsplit(" ", 1) for line in r.text.splitlines() if line and not line.startswith("#"))
        return {name: float(value) for name, value in series}

    def post_raw(self, path: str, body: dict[str, Any], timeout: float = 3600) -> tuple[int, str]:
        """POST without judging the answer: (HTTP status, body text), for load tests that count
        errors. Thread-safe (a session per call). A refused or dropped connection raises
        ServerError, with the log tail when the process is gone."""
        try:
            with requests.Session() as session:
                r = session.post(f"{self.url}{path}", json=body, timeout=timeout)
        except requests.RequestException as e:
            self._raise_if_dead(f"during POST {path}", wait=2.0)
            raise ServerError(f"POST {path} failed: {e}\n" + self.log_tail()) from e
        return r.status_code, r.text

    def props(self) -> dict[str, Any]:
        return self.request("GET", "/props")

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return self.request("POST", "/tokenize", json={"content": text, "add_special": add_special})["tokens"]

    def detokenize(self, tokens: list[int]) -> str:
        return self.request("POST", "/detokenize", json={"tokens": tokens})["content"]

    def _completion_body(self, prompt: str | list[int], n_predict: int, params: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
                "cache_prompt": self.config.cache_prompt, "seed": self.config.seed, **params}

    def complete(self, prompt: str | list[int], n_predict: int = 32, **params: Any) -> dict[str, Any]:
        """A greedy /completion unless params say otherwise."""
        return self.request("POST", "/completion", json=self._completion_body(prompt, n_predict, params))

    def complete_streamed(self, prompt: str | list[int], n_predict: int = 32,
                          on_first_token: Callable[[], None] | None = None, timeout: float = 3600,
                          **params: Any) -> dict[str, Any]:
        """complete() streamed: calls on_first_token() once the first token is out (the prompt
        evaluated) and returns the last event, which carries the timings."""
        body = {**self._completion_body(prompt, n_predict, params), "stream": True}
        last: dict[str, Any] = {}
        with requests.post(f"{self.url}/completion", json=body, stream=True, timeout=timeout) as r:
            if r.status_code != 200:
                raise ServerError(f"/completion answered {r.status_code}: {r.text[:300]}\n{self.log_tail()}")
            for raw in r.iter_lines():
                if not raw.startswith(b"data: "):
                    continue
                if not last and on_first_token is not None:
                    on_first_token()
                last = json.loads(raw[6:])
        return last

    def complete_timed(self, prompt: str | list[int], n_predict: int = 32,
                       **params: Any) -> tuple[dict[str, Any], timings.RequestTiming]:
        """A completion and its timings, read from the response."""
        result = self.complete(prompt, n_predict, **params)
        return result, timings.from_response(result)
