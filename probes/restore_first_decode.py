"""A prompt-cache restore at long context: what it costs a slot, in time and memory.

A slot saved once with a long prompt (prefilled by the first arm) is restored into a fresh
llama-server per arm, then continued with a short tail. Per arm: the restore's own time (the
server's `restore_ms`), the first request after it (`prompt_ms` of the tail, `predicted_ms` of its
tokens), and the server's peak resident memory above what it held before the restore (VmHWM reset
through /proc/PID/clear_refs, read from /proc/PID/status). Prints a Markdown table; --json writes
the figures.

    python probes/restore_first_decode.py MODEL --ctx 32768 --work DIR [--bin-dir NAME=DIR ...]
            [--repeat 3] [--json OUT] -- [server flags common to every arm]

Every arm is named by a build (--bin-dir NAME=DIR; the default: this checkout's build) and runs
dense and with --sparse-attn on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from llama_sparse.gates.texts import reference_text
from llama_sparse.server import ServerConfig, ServerProcess

SLOT_FILE = "long.bin"


@dataclass
class RestoreRun:
    build: str
    arm: str
    restore_ms: float
    tail_prompt_ms: float
    tail_prompt_n: int
    first_token_ms: float      # the tail's prompt and the first generated token
    restored_tokens: int
    peak_extra_mib: float      # peak RSS during restore + first decode, above the RSS before


def rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def long_prompt(server: ServerProcess, n_ctx: int) -> list[int]:
    text = reference_text()
    while len(text) < n_ctx*6:
        text += "\n\n" + text
    tokens = server.tokenize(text)
    return tokens[: n_ctx - 256]


def save_slot(cfg: ServerConfig, work: Path, n_ctx: int) -> list[int]:
    with ServerProcess(cfg, work / "save.log") as server:
        prompt = long_prompt(server, n_ctx)
        t0 = time.monotonic()
        print(f"prefilling {len(prompt)} tokens once, to save the slot ...", file=sys.stderr, flush=True)
        server.complete(prompt, n_predict=1, id_slot=0, cache_prompt=True)
        print(f"  {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        server.request("POST", "/slots/0?action=save", json={"filename": SLOT_FILE})
    (work / "prompt.json").write_text(json.dumps(prompt))
    return prompt


def restore_once(cfg: ServerConfig, work: Path, prompt: list[int], build: str, arm: str, i: int) -> RestoreRun:
    with ServerProcess(cfg, work / f"{build}-{arm}-{i}.log") as server:
        assert server.proc is not None
        pid = server.proc.pid
        server.complete("Hello", n_predict=1, id_slot=0, cache_prompt=False)  # every lazy start-up cost paid
        before = rss_kib(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        r = server.request("POST", "/slots/0?action=restore", json={"filename": SLOT_FILE})
        tail = server.tokenize(" The next section begins with a question.")
        c = server.complete(prompt + tail, n_predict=4, id_slot=0, cache_prompt=True)
        peak = rss_kib(pid, "VmHWM")
        t = c["timings"]
        return RestoreRun(build=build, arm=arm, restore_ms=r["timings"]["restore_ms"],
                          tail_prompt_ms=t["prompt_ms"], tail_prompt_n=t["prompt_n"],
                          first_token_ms=t["prompt_ms"] + t["predicted_per_token_ms"],
                          restored_tokens=r["n_restored"], peak_extra_mib=(peak - before)/1024)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--bin-dir", action="append", default=[], help="NAME=DIR: a build to measure (repeatable)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.flags = flags  # server flags common to every arm

    a.work.mkdir(parents=True, exist_ok=True)
    builds = [tuple(b.split("=", 1)) for b in a.bin_dir] or [("this", "")]
    arms = {"dense": [], "sparse": ["--sparse-attn", "on"]}

    def config(bin_dir: str, extra: list[str]) -> ServerConfig:
        env = {"LD_LIBRARY_PATH": bin_dir} if bin_dir else {}
        exe = Path(bin_dir) / "llama-server" if bin_dir else None
        return ServerConfig(model=a.model, ctx_size=a.ctx, threads=os.cpu_count(), binary=exe, env=env,
                            extra_args=["--slot-save-path", f"{a.work}/", *a.flags, *extra])

    prompt_file = a.work / "prompt.json"
    if (a.work / SLOT_FILE).exists() and prompt_file.exists():
        prompt = json.loads(prompt_file.read_text())
    else:
        prompt = save_slot(config(builds[0][1], []), a.work, a.ctx)

    runs: list[RestoreRun] = []
    for build, bin_dir in builds:
        for arm, extra in arms.items():
            for i in range(a.repeat):
                run = restore_once(config(bin_dir, extra), a.work, prompt, build, arm, i)
                print(f"{build} {arm} #{i}: restore {run.restore_ms:.0f} ms, first token {run.first_token_ms:.0f} ms,"
                      f" peak +{run.peak_extra_mib:.1f} MiB", file=sys.stderr, flush=True)
                runs.append(run)

    print(f"\nRestore of a {len(prompt)}-token slot, then a {runs[0].tail_prompt_n}-token tail and its first token"
          f" (median of {a.repeat}; peak: resident memory above the level before the restore)\n")
    print("| build | arm | restore ms | first token after it, ms | restore + first token, ms | peak MiB |")
    print("|---|---|---:|---:|---:|---:|")
    for build, _ in builds:
        for arm in arms:
            rs = [r for r in runs if r.build == build and r.arm == arm]
            med = lambda f: statistics.median(getattr(r, f) for r in rs)  # noqa: E731
            print(f"| {build} | {arm} | {med('restore_ms'):.0f} | {med('first_token_ms'):.0f} |"
                  f" {statistics.median(r.restore_ms + r.first_token_ms for r in rs):.0f} |"
                  f" {max(r.peak_extra_mib for r in rs):.1f} |")
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
