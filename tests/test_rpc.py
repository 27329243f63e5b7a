"""Across machines: llama.cpp's RPC backend runs the patched graph with sparse attention on.

A `ggml-rpc-server` on 127.0.0.1 takes every layer (-ngl 99): weights, the KV cache and the key
bounds live on the RPC device, fill and select run there, and so does the flash attention that
reads the selection when the server is a build of this patch set (its protocol version says so)
and says its device runs that node (RPC_CMD_SUPPORTS_OP).
A server of another build would ignore the selection, so there the attention stays on a local
device and the scheduler copies the K/V views it reads every step, with a warning that says so
(`GGML_RPC_SPARSE_LOCAL=1` forces that path). The logits of every step must equal the local
run's, bit for bit, on both paths.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from llama_sparse.binaries import binary
from llama_sparse.gates.texts import reference_text
from llama_sparse.server import free_port

pytestmark = pytest.mark.slow


@dataclass
class RpcServer:
    endpoint: str
    proc: subprocess.Popen
    log_path: Path


@pytest.fixture
def rpc_process(tmp_path: Path):
    port = free_port()
    log_path = tmp_path / "rpc-server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([str(binary("ggml-rpc-server")), "-t", "2", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    time.sleep(1.0)
    assert proc.poll() is None, log_path.read_text()
    yield RpcServer(f"127.0.0.1:{port}", proc, log_path)
    proc.terminate()
    proc.wait(timeout=15)
    log.close()


@pytest.fixture
def rpc_server(rpc_process: RpcServer) -> str:
    return rpc_process.endpoint


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


@pytest.mark.parametrize("arm", [["--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-score", "bound", "--sparse-attn-coverage", "0.25"],
                                 ["--sparse-attn", "off"]], ids=["sparse-0.25", "dense"])
def test_rpc_run_equals_local_run(smollm2: Path, tmp_path: Path, rpc_server: str, arm: list[str]) -> None:
    local, _ = logits(smollm2, tmp_path, "local", *arm)
    remote, log = logits(smollm2, tmp_path, "rpc", *arm, "--rpc", rpc_server, "-ngl", "99")
    assert re.search(r"RPC0\[127\.0\.0\.1:\d+\] KV buffer size", log)     # the cache really is remote
    if arm[1] == "on":
        assert re.search(r"sparse_attn_init: RPC0\[127\.0\.0\.1:\d+\] sparse-attention key bounds", log)
    assert len(local) > 1000 and local == remote


def _loopback_bytes() -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        if line.strip().startswith("lo:"):
            return int(line.split(":")[1].split()[0])
    pytest.skip("no loopback counters in /proc/net/dev")


def test_the_selection_runs_on_a_server_of_this_build_and_stays_local_with_another(
        smollm2: Path, tmp_path: Path, rpc_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    arm = ["--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--rpc", rpc_server, "-ngl", "99"]
    # the key sketch is CPU-only: with the KV cache on the server, `on` alone ranks by the key
    # bounds at their own coverage, which a local run asks for by name
    local, _ = logits(smollm2, tmp_path, "local", "--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-score", "bound")
    b0 = _loopback_bytes()
    remote, log = logits(smollm2, tmp_path, "rpc", *arm)
    b1 = _loopback_bytes()
    assert "sparse_attn           = on (key bounds, block 32, coverage 0.625" in log
    assert "sparse_attn_score = auto: key bounds, as the KV cache is on RPC0 and the key sketch is CPU-only" in log
    assert "makes sparse attention slower there" not in log
    monkeypatch.setenv("GGML_RPC_SPARSE_LOCAL", "1")   # as a server of another build is treated
    fallback, fallback_log = logits(smollm2, tmp_path, "rpc-local-fa", *arm)
    b2 = _loopback_bytes()
    assert "flash attention with a block selection runs on a local device" in fallback_log
    assert local == remote == fallback
    # the fallback copies every layer's K and V views each decode step (3000 cells x 3 KV heads x
    # 64 x f16 x 2, 30 layers: about 70 MB a step); on the server nothing but the graph and the
    # outputs travel: the weights (about 270 MB) dominate the remote run's bytes
    remote_bytes, fallback_bytes = b1 - b0, b2 - b1
    assert fallback_bytes > remote_bytes + 12 * 40_000_000, (remote_bytes, fallback_bytes)


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


# Each spoiled graph, as a hostile client would send it, and the reason the server gives. Before
# the checks (measured with the same client): the host pointer crashed the server (SIGSEGV), a
# fill row past the end aborted it, a block size of 0 killed it with SIGFPE (fill, select, flash
# attention), and a negative fill row, a NaN coverage and a selection of the wrong shape ran.
MALFORMED = {
    "scsa-host-pointer":   "SCSA_ATTN carries a host pointer",
    "fill-negative-row":   "a row index outside the cache",
    "fill-row-past-end":   "a row index outside the cache",
    "fill-block-size-0":   "block_size and kv_size must be positive",
    "select-coverage-nan": "coverage in (0, 1]",
    "select-tolerance-nan": "tolerance in [0, 1]",   # the key sketch's ceiling (op param 6), 0 elsewhere
    "select-block-size-0": "block_size > 0",
    "fa-block-size-0":     "block_size must be positive",
    "fa-selection-shape":  "the block selection's shape does not match",
    # before these checks: a tail without its selection crashed the server (SIGSEGV reading the
    # selection, SIGFPE dividing by its block size), 4 query heads over 3 KV heads ran and read a
    # fourth KV head past the cache, and keys the CPU cannot score aborted the server in the kernel
    "fa-tail-without-selection": "a block tail without a block selection",
    "fa-heads-not-divisible":    "the query heads must be a multiple of the KV heads",
    "fa-backend-lacks":          "the server's device does not run it",
}


def rpccheck(endpoint: str, case: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary("llama-sparse-rpccheck")), endpoint, case], capture_output=True, text=True,
                          timeout=120)


def test_rpc_server_refuses_malformed_sparse_ops_and_stays_up(rpc_process: RpcServer) -> None:
    first = rpccheck(rpc_process.endpoint, "valid")
    assert first.returncode == 0 and first.stdout.startswith("ok valid"), first.stdout + first.stderr
    for case, reason in MALFORMED.items():
        seen = len(rpc_process.log_path.read_text(errors="replace"))
        refused = rpccheck(rpc_process.endpoint, case)
        assert refused.returncode != 0, f"{case}: the server ran it: {refused.stdout}"
        assert "unknown case" not in refused.stderr, f"{case}: the client does not know the case: {refused.stderr}"
        assert rpc_process.proc.poll() is None, f"{case}: the server died\n" + rpc_process.log_path.read_text()[-3000:]
        # the refusal this case caused, not an earlier case's
        log = rpc_process.log_path.read_text(errors="replace")[seen:]
        assert f"refused graph node" in log and reason in log, f"{case}: no refusal in the log\n{log[-3000:]}"
        # and it still serves a well-formed graph, with the same result as before
        again = rpccheck(rpc_process.endpoint, "valid")
        assert again.returncode == 0 and again.stdout == first.stdout, f"after {case}: {again.stdout}{again.stderr}"


# Data the server checked, rewritten by an earlier node of the same graph (a copy into the bytes of
# the fill's row indices, or of the selection flash attention reads) after the check and before
# the kernel reads it. The kernels check every index where they read it: a row outside the cache
# is skipped, a selection's words are read only for the blocks that exist. Before: a row below
# zero wrote into the tensor before the key bounds (the canary, exit 3), one past the end aborted
# the server.
REWRITTEN = ("fill-rows-rewritten-negative", "fill-rows-rewritten-past-end", "fa-selection-rewritten")


def test_indices_rewritten_after_the_servers_check_are_computed_safely(rpc_process: RpcServer) -> None:
    for case in REWRITTEN:
        run = rpccheck(rpc_process.endpoint, case)
        assert rpc_process.proc.poll() is None, f"{case}: the server died\n" + rpc_process.log_path.read_text()[-3000:]
        assert run.returncode == 0 and run.stdout.startswith(f"ok {case}:"), f"{case}: {run.stdout}{run.stderr[-2000:]}"
        assert "nan" not in run.stdout.split("sum")[1], run.stdout


def test_the_client_asks_the_server_whether_its_device_runs_the_sparse_attention(rpc_process: RpcServer) -> None:
    """The client learns from the server, per node shape, whether the server's device runs a flash
    attention with a selection (a CUDA server lacks some head sizes a local run would send to the
    CPU); a node the server would refuse is not offered to it. Before: every such node was offered
    to any server of this protocol version."""
    run = rpccheck(rpc_process.endpoint, "supports")
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert run.stdout.strip() == "supports valid=1 heads-not-divisible=0 tail-without-selection=0 backend-lacks=0"
    log = rpc_process.log_path.read_text(errors="replace")
    # the answers came from the server, with its reasons
    assert "[supports_op] device 0 does not run FLASH_ATTN_EXT" in log, log[-3000:]
    assert "the query heads must be a multiple of the KV heads" in log


CONTRACT = Path(__file__).parent / "data" / "rpc-sparse-contract.txt"


def _sparse_contract(vendor: Path) -> str:
    """What a server and a client of the sparse ops must agree on: the ops' declarations (sources
    and parameters) in ggml.h, the rules a node must meet, and the RPC commands, without comments
    and with white space folded."""
    header = (vendor / "ggml/include/ggml.h").read_text()
    decls = re.findall(r"GGML_API[^;]*\b(?:ggml_sparse_attn_\w+|ggml_scsa_attn|ggml_flash_attn_ext_set_block_\w+)\s*\([^;]*;",
                       header)
    ggml_c = (vendor / "ggml/src/ggml.c").read_text()
    rules = re.search(r"const char \* ggml_sparse_attn_node_invalid\(.*?\n}\n", ggml_c, re.S)
    rpc = (vendor / "ggml/src/ggml-rpc/ggml-rpc.cpp").read_text()
    commands = re.search(r"enum rpc_cmd \{.*?\};", rpc, re.S)
    assert decls and rules and commands
    code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", "\n".join(decls + [rules.group(0), commands.group(0)]), flags=re.S)
    return " ".join(code.split())  # comments and white space are not the contract


def test_the_rpc_protocol_version_moves_with_the_sparse_ops_contract(project) -> None:
    """Each protocol version of this patch set names one contract of its ops: a change to their
    sources, parameters, rules or the commands must come with a new version (a client offers the
    attention to a server by what its version says it understands)."""
    import hashlib
    vendor = project.vendor_dir
    header = (vendor / "ggml/include/ggml-rpc.h").read_text()
    version = ".".join(re.search(rf"RPC_PROTO_{p}_VERSION\s+(\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH"))
    fingerprint = hashlib.sha256(_sparse_contract(vendor).encode()).hexdigest()[:16]
    recorded = [line.split() for line in CONTRACT.read_text().splitlines() if line and not line.startswith("#")]
    versions = [v for v, _ in recorded]
    assert len(set(versions)) == len(versions), f"{CONTRACT.name}: a version recorded twice"
    assert [version, fingerprint] in recorded, (
        f"the sparse ops' contract is {fingerprint} at protocol {version}, which {CONTRACT.name} does not record: "
        f"a changed contract needs a new RPC_PROTO_PATCH_VERSION and a new line '{{version}} {fingerprint}' there")
