"""scripts/gpu-gate.sh is ready to run: its gate files load, name GPU arms, and the script parses."""

from __future__ import annotations

import re
import subprocess

from llama_sparse.gates import spec


def test_gpu_gate_files_load_and_offload_every_arm(project) -> None:
    files = sorted((project.root / "gates" / "gpu").glob("*.yaml"))
    assert {f.stem for f in files} >= {"identity", "anchor", "niah", "niah-gemma3", "ab", "ab-gemma3"}
    names = set()
    for f in files:
        s = spec.load(f)
        assert s.name.startswith("gpu-") and s.name not in names
        names.add(s.name)
        for arm in s.arms:
            assert "-ngl" in arm.flags, f"{f.name}: arm {arm.name} does not offload to the GPU"
    contexts = {c for f in files for c in spec.load(f).context_lengths}
    assert min(c for c in contexts if c > 1024) <= 8192 and max(contexts) >= 32000   # 8K to 32K
    caches = {c for f in files for c in spec.load(f).cache_types}
    assert {"f16", "q8_0"} <= caches


def test_gpu_gate_script_parses_and_names_existing_gates(project) -> None:
    script = project.root / "scripts" / "gpu-gate.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for path in re.findall(r"gates/gpu/[\w-]+\.yaml", text):
        assert (project.root / path).is_file(), path
    assert "test-backend-ops -b CUDA0" in text and "CMAKE_CUDA_ARCHITECTURES=native" in text
