"""The server harness on real builds: start, complete, timings, clear errors, always stopped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llama_sparse.binaries import binary
from llama_sparse.patches import patch_set_digest
from llama_sparse.server import ServerConfig, ServerError, ServerProcess

pytestmark = pytest.mark.slow


def test_version_names_the_patch_set(project) -> None:
    out = subprocess.run([str(binary("llama-server")), "--version"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    assert f"llama-sparse {project.version}" in text
    assert f"patch set {patch_set_digest(project.patches_dir)}," in text   # the committed patches/, as built
    assert project.pin.upstream_commit[:12] in text


def test_upstream_build_does_not_claim_the_patch_set() -> None:
    out = subprocess.run([str(binary("llama-server", "upstream")), "--version"], capture_output=True, text=True)
    assert "version:" in out.stdout + out.stderr
    assert "llama-sparse" not in out.stdout + out.stderr


@pytest.mark.parametrize("model_fixture", ["tiny_qwen3", "smollm2"])
def test_smoke_complete_and_timings(request, start_server, model_fixture: str) -> None:
    model: Path = request.getfixturevalue(model_fixture)
    server = start_server(ServerConfig(model=model, ctx_size=2048))
    assert server.props()["llama_sparse"].startswith("llama-sparse ")
    prompt = "The capital of France is"
    result, timing = server.complete_timed(prompt, n_predict=16, ignore_eos=True)
    assert result["tokens_predicted"] == 16
    assert timing.decode is not None and timing.decode.tokens == 16
    assert timing.prompt is not None and timing.prompt.tokens == len(server.tokenize(prompt))
    assert timing.decode.tokens_per_second > 0
    again, _ = server.complete_timed(prompt, n_predict=16, ignore_eos=True)
    assert again["content"] == result["content"]  # greedy: the same answer twice


def test_missing_model_is_a_clear_error_with_log_tail(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"GGUF but not really")
    server = ServerProcess(ServerConfig(model=bogus, startup_timeout=60), tmp_path / "s.log")
    with pytest.raises(ServerError) as e:
        server.start()
    assert "exited with code" in str(e.value)
    assert "last" in str(e.value) and "s.log" in str(e.value)
    assert not server.alive()


def test_server_killed_mid_session_is_reported_as_dead(start_server, tiny_qwen3: Path) -> None:
    server = start_server(ServerConfig(model=tiny_qwen3, ctx_size=1024))
    server.complete("hello", n_predict=4)
    server.proc.kill()
    server.proc.wait()
    with pytest.raises(ServerError, match="exited with code"):
        server.complete("hello", n_predict=4)


def test_stopped_on_exception(tmp_path: Path, tiny_qwen3: Path) -> None:
    server = ServerProcess(ServerConfig(model=tiny_qwen3, ctx_size=1024), tmp_path / "s.log")
    with pytest.raises(RuntimeError):
        with server:
            assert server.alive()
            raise RuntimeError("test failure inside the with block")
    assert not server.alive()


def test_wait_log_waits_for_a_line_written_after_the_response(tmp_path: Path) -> None:
    import threading

    log = tmp_path / "server.log"
    log.write_text("slot print_timing: eval time\n")
    server = ServerProcess(ServerConfig(model=tmp_path / "m.gguf"), log)
    # the server's log thread writes the request's last line a little after the response
    threading.Timer(0.3, lambda: log.write_text(log.read_text() + "total time = 1 ms\n")).start()
    assert "total time" in server.wait_log("total time", timeout=5)
    with pytest.raises(ServerError, match=r"'total time' \(2 time\(s\)\) did not reach the server log in 0.2 s"):
        server.wait_log("total time", count=2, timeout=0.2)
