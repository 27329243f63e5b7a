"""Across machines: llama.cpp's RPC backend runs the patched graph with sparse attention on.

A `ggml-rpc-server` on 127.0.0.1 takes every layer (-ngl 99): weights, the KV cache and the key
bounds live on the RPC device, fill and select run there. The masked flash attention stays on
the local CPU, because an RPC device cannot tell what the remote backend would do with the
block selection and our guard refuses it to every non-CPU device (62 graph splits per decode
step instead of 2). The logits of every step must equal the local run's, bit for bit.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from llama_sparse.binaries import binary
from llama_sparse.gates.texts import reference_text
from llama_sparse.server import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def rpc_server(tmp_path: Path):
    port = free_port()
    log = open(tmp_path / "rpc-server.log", "wb")
    proc = subprocess.Popen([str(binary("ggml-rpc-server")), "-t", "2", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    time.sleep(1.0)
    assert proc.poll() is None, (tmp_path / "rpc-server.log").read_text()
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=15)
    log.close()


def logits(model: Path, tmp_path: Path, name: str, *flags: str) -> tuple[bytes, str]:
    prompt = tmp_path / "prompt.txt"
    if not prompt.exists():
        prompt.write_text(reference_text()[:20000])
    out = tmp_path / f"{name}.bin"
    proc = subprocess.run([str(binary("llama-sparse-logits")), "-m", str(model), "-f", str(prompt), "-c", "4096",
                           "-fa", "on", "-t", "2", "--dump-steps", "12", "--dump-prompt-tokens", "3000",
                           "--dump-out", str(out), "-lv", "4", *flags],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out.read_bytes(), proc.stdout + proc.stderr


@pytest.mark.parametrize("arm", [["--sparse-attn", "on", "--sparse-attn-coverage", "0.25"],
                                 ["--sparse-attn", "off"]], ids=["sparse-0.25", "dense"])
def test_rpc_run_equals_local_run(smollm2: Path, tmp_path: Path, rpc_server: str, arm: list[str]) -> None:
    local, _ = logits(smollm2, tmp_path, "local", *arm)
    remote, log = logits(smollm2, tmp_path, "rpc", *arm, "--rpc", rpc_server, "-ngl", "99")
    assert re.search(r"RPC0\[127\.0\.0\.1:\d+\] KV buffer size", log)     # the cache really is remote
    if arm[1] == "on":
        assert re.search(r"sparse_attn_init: RPC0\[127\.0\.0\.1:\d+\] sparse-attention key bounds", log)
    assert len(local) > 1000 and local == remote


def test_rpc_protocol_version_bumped_for_the_new_ops(project) -> None:
    header = "ggml/include/ggml-rpc.h"
    ours = (project.vendor_dir / header).read_text()
    upstream = subprocess.run(["git", "-C", str(project.vendor_dir), "show", f"upstream:{header}"],
                              capture_output=True, text=True, check=True).stdout
    version = lambda text: tuple(int(re.search(rf"RPC_PROTO_{p}_VERSION\s+(\d+)", text).group(1))  # noqa: E731
                                 for p in ("MAJOR", "MINOR", "PATCH"))
    assert version(ours) > version(upstream)
    op_count = lambda text: int(re.search(r"GGML_OP_COUNT == (\d+)", text).group(1))  # noqa: E731
    assert op_count(ours) == op_count(upstream) + 3    # SPARSE_ATTN_FILL, SPARSE_ATTN_SELECT, SCSA_ATTN
