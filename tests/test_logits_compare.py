"""logitsdump.compare: skipping the leading rows (the prefill's, SCSA's calibration steps)."""

import numpy as np
import pytest

from llama_sparse.gates.logitsdump import LogitsDump, compare


def dump(logits: np.ndarray) -> LogitsDump:
    return LogitsDump(n_prompt=4, tokens=logits.argmax(-1).astype(np.int32), logits=logits.astype(np.float32),
                      raw=logits.astype(np.float32).tobytes())


def test_skipped_rows_do_not_count() -> None:
    ref = np.zeros((6, 5))
    ref[:, 1] = 3.0
    other = ref.copy()
    other[0, 4] = 9.0            # the first row disagrees
    assert compare(dump(ref), dump(other))["top1"] == pytest.approx(5 / 6)
    m = compare(dump(ref), dump(other), skip=1)
    assert (m["steps"], m["top1"], m["diff_steps"], m["kl_max"]) == (5, 1.0, 0, 0.0)


def test_skipping_everything_is_an_error() -> None:
    ref = dump(np.zeros((3, 5)))
    with pytest.raises(ValueError, match="leaves none of the 3 rows"):
        compare(ref, ref, skip=3)


def test_an_arms_environment_reaches_the_logits_tool(tmp_path, monkeypatch) -> None:
    """The logits kind ran every arm without its `env` (a probe arm measured the plain build)."""
    import stat
    import sys

    from llama_sparse.gates.logitsdump import MAGIC, DumpRequest, run

    # a stand-in for llama-sparse-logits: one row whose token is the value of LLAMA_PROBE_X
    fake = tmp_path / "bin" / "llama-sparse-logits"
    fake.parent.mkdir()
    fake.write_text(f"""#!{sys.executable}
import os, struct, sys
out = sys.argv[sys.argv.index("--dump-out") + 1]
tok = int(os.environ.get("LLAMA_PROBE_X", "-1"))
open(out, "wb").write(struct.pack("<5i", {MAGIC}, 1, 1, 0, 1) + struct.pack("<if", tok, 0.0))
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("LLAMA_SPARSE_BIN_DIR", str(fake.parent))
    monkeypatch.delenv("LLAMA_PROBE_X", raising=False)

    def req(env):
        return DumpRequest(model=tmp_path / "m.gguf", prompt_file=tmp_path / "p.txt", ctx_size=64, steps=1,
                           out=tmp_path / "d.bin", env=env)

    assert run(req(()), tmp_path / "a.log").tokens.tolist() == [-1]
    assert run(req((("LLAMA_PROBE_X", "7"),)), tmp_path / "b.log").tokens.tolist() == [7]
    assert (tmp_path / "b.log").read_text().startswith("$ LLAMA_PROBE_X=7 ")
