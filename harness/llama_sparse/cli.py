"""The `llama-sparse` command: one entry point, one verb per module."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.project import Project


def _cmd_vendor(args: argparse.Namespace) -> int:
    from llama_sparse.vendor import vendor

    vendor(Project.find(), sdist=args.sdist)
    return 0


def _cmd_patches(args: argparse.Namespace) -> int:
    from llama_sparse import patches

    project = Project.find()
    if args.action == "apply":
        patches.apply(project, discard=args.discard)
    elif args.action == "export":
        patches.export(project)
    else:
        problems = patches.check(project)
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1 if problems else 0
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from llama_sparse.build import DEFAULT_TARGETS, BuildConfig, build

    from llama_sparse import ctest

    targets = list(args.target or DEFAULT_TARGETS)
    if args.tests:
        targets += ctest.targets()
    defines = {}
    for d in args.define or []:
        key, sep, value = d.partition("=")
        if not sep or not key:
            raise UserError(f"--define {d!r}: expected KEY=VALUE (a CMake cache entry)")
        defines[key] = value
    cfg = BuildConfig(variant="upstream" if args.upstream else "patched", jobs=args.jobs,
                      cuda=args.cuda, targets=tuple(targets), extra_defines=defines)
    print(build(Project.find(), cfg))
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from llama_sparse import models

    if args.action == "list":
        for name, spec in models.REAL_MODELS.items():
            where = models.cached_path(name)
            print(f"{name:14} {'fetched' if where else 'not fetched':12} {spec.description}")
        print(f"{models.TINY_QWEN3:14} {'generated':12} Qwen3 graph, random weights, written by llama-sparse")
        return 0
    if not args.name:
        raise UserError(f"models {args.action} needs a model name")
    path = models.resolve(args.name, log=lambda m: print(m, file=sys.stderr))
    print(path)
    return 0


def _cmd_smoke(args: argparse.Namespace) -> int:
    from llama_sparse import smoke

    r = smoke.run(args.model, depth=args.depth, n_predict=args.n_predict, threads=args.threads,
                  log_dir=Path(args.out))
    t = r.timing
    print(f"model {r.model.name}, depth {r.depth_tokens} tokens")
    if t.prompt:
        print(f"prompt eval: {t.prompt.tokens} tokens in {t.prompt.ms:.0f} ms, {t.prompt.tokens_per_second:.1f} tokens/s")
    if t.decode:
        print(f"decode:      {t.decode.tokens} tokens in {t.decode.ms:.0f} ms, {t.decode.tokens_per_second:.1f} tokens/s")
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from llama_sparse import profile
    from llama_sparse.estimate import parse_context

    flags = list(args.flags or [])
    if flags and flags[0] == "--":
        flags = flags[1:]
    if args.yarn_orig_ctx:
        flags = ["--rope-scaling", "yarn", "--rope-scale", str(args.yarn_scale), "--yarn-orig-ctx",
                 str(args.yarn_orig_ctx), *flags]
    p = profile.run(args.model, parse_context(args.context), args.n_predict, flags, Path(args.out),
                    Path(args.slots) if args.slots else None, threads=args.threads)
    print(profile.table(p))
    return 0


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from llama_sparse import fuzz

    project = Project.find()
    binary = fuzz.build(project, jobs=args.jobs)
    print(f"running {args.cases} cases (seed {args.seed}) under ASan + UBSan")
    r = fuzz.run(binary, cases=args.cases, seed=args.seed, threads=args.threads)
    sys.stdout.write(r.output if not r.ok else "\n".join(
        line for line in r.output.splitlines() if line.startswith("fuzz:")) + "\n")
    if r.sanitizer_report:
        print("llama-sparse: a sanitizer reported an error (above)", file=sys.stderr)
    return 0 if r.ok else 1


def _cmd_cuda_check(args: argparse.Namespace) -> int:
    from llama_sparse import cudacheck

    source = Path(args.source) if args.source else Project.find().vendor_dir
    units = tuple(args.unit) if args.unit else cudacheck.TRANSLATION_UNITS
    archs = tuple(a.strip() for a in args.archs.split(",") if a.strip())
    t0 = time.monotonic()
    r = cudacheck.check(source, units=units, archs=archs, jobs=args.jobs)
    for u in r.failed:
        print(f"\n== {u.unit}: nvcc failed ==\n{u.first_errors()}", file=sys.stderr)
    took = time.monotonic() - t0
    if r.ok:
        print(f"cuda-check: {len(r.units)} translation units compile for sm_{', sm_'.join(archs)} ({took:.0f} s)")
        return 0
    print(f"cuda-check: FAILED: {', '.join(u.unit for u in r.failed)} ({took:.0f} s)", file=sys.stderr)
    return 1


def _cmd_ctest(args: argparse.Namespace) -> int:
    from llama_sparse import ctest

    proc = ctest.run(Project.find().build_dir / "patched")
    print(proc.stdout, end="")
    print(proc.stderr, end="", file=sys.stderr)
    return proc.returncode


def _cmd_abi(args: argparse.Namespace) -> int:
    import tempfile

    from llama_sparse import abi
    from llama_sparse.build import bin_dir

    project = Project.find()
    with tempfile.TemporaryDirectory(prefix="llama-sparse-abi-") as tmp:
        pin = abi.extract_headers(project.vendor_dir, Path(tmp), ref=args.ref)
        ours = (abi.HeaderTree(Path(args.against), args.against) if args.against
                else abi.patched_headers(project.vendor_dir))
        report = abi.compare_headers(pin, ours)
    print(report.summary())
    failed = not report.ok
    # Check 5 needs shared builds of both trees: it runs whenever they are there.
    pin_libs = Path(args.pin_libs) if args.pin_libs else bin_dir(project, "upstream")
    our_libs = Path(args.our_libs) if args.our_libs else bin_dir(project, "patched")
    missing = abi.missing_libraries(pin_libs, our_libs)
    if missing:
        print(f"exported symbols: not compared (no shared library at {', '.join(map(str, missing))})")
    else:
        exports = abi.compare_exports(pin_libs, our_libs)
        print(exports.summary())
        failed = failed or not exports.ok
    print(f"abi: {'FAILED' if failed else 'OK'}")
    return 1 if failed else 0


def _cmd_lib_path(args: argparse.Namespace) -> int:
    from llama_sparse.binaries import lib_dir

    print(lib_dir("upstream" if args.upstream else "patched"))
    return 0


def _cmd_python_bindings(args: argparse.Namespace) -> int:
    from llama_sparse import bindings
    from llama_sparse.binaries import lib_dir

    project = Project.find()
    if args.action == "install":
        bindings.install(project)
        return 0
    extra = {"LLAMA_SPARSE_ATTN": args.sparse_attn} if args.sparse_attn else {}
    run = bindings.run_tests(project, lib_dir(), extra)
    print(run.output, end="")
    return run.returncode


def _cmd_python_check(args: argparse.Namespace) -> int:
    from llama_sparse import models, pycheck
    from llama_sparse.binaries import lib_dir

    project = Project.find()
    cfg = pycheck.CheckConfig(model=models.resolve(args.model), context=args.context, steps=args.steps,
                              threads=args.threads)
    result = pycheck.run(cfg, Path(args.out or project.root / "results" / "python-check"),
                         upstream_lib=lib_dir("upstream"), our_lib=lib_dir("patched"))
    print(result.markdown())
    return 0 if result.identical_rows == result.compared_rows else 1


def _report_exit(ctx, table: str | None = None) -> int:
    """Print the report's table (or `table`), its files and the verdict; the exit status."""
    from llama_sparse.gates.markdown import markdown_table

    paths = ctx.save()
    print(table if table is not None else markdown_table(ctx.report))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    verdict = ctx.report.verdict()
    print(f"gate {ctx.spec.name}: {'PASSED' if verdict else 'FAILED' if verdict is False else 'done (no thresholds)'}")
    return 1 if verdict is False else 0


def _cmd_gate(args: argparse.Namespace) -> int:
    from llama_sparse.gates import spec as specs
    from llama_sparse.gates.runner import run_gate

    project = Project.find()
    if args.list:
        for s in specs.discover(project.root / "gates"):
            print(f"{str(s.path.relative_to(project.root)):24} {s.kind:9} {', '.join(a.name for a in s.arms):30} {s.description}")
        return 0
    if args.render:
        from llama_sparse.gates.runner import render

        for kind, path in render(Path(args.render)).items():
            print(f"{kind}: {path}")
        return 0
    if not args.file:
        raise UserError("gate needs a FILE (see `llama-sparse gate --list`)")
    ctx = run_gate(specs.load(Path(args.file)), Path(args.out or project.root / "results"), only=args.only)
    return _report_exit(ctx)


def _cmd_demo(args: argparse.Namespace) -> int:
    from llama_sparse import demo

    project = Project.find()
    plan = demo.FULL if args.full else demo.QUICK
    if args.samples is not None:
        plan = dataclasses.replace(plan, samples=args.samples)
    run = demo.run(Path(args.out or project.root / "results"), model=args.model, plan=plan)
    return _report_exit(run.ctx, table=run.summary())


def _cmd_estimate(args: argparse.Namespace) -> int:
    from llama_sparse import estimate, results

    project = Project.find()
    results_dir = project.root / "docs" / "results"
    paths = args.calibration or [results.current(results_dir, g).markdown.with_suffix(".json")
                                 for g in estimate.DEFAULT_CALIBRATION]
    reports = [estimate.read_report(Path(p)) for p in paths]
    limit = estimate.parse_context(args.fit_up_to) if args.fit_up_to else None
    if limit:
        reports = [dataclasses.replace(r, points=[p for p in r.points if p.n_ctx <= limit]) for r in reports]
    costs = estimate.calibrate(reports)
    print(estimate.describe(costs))
    if args.check:
        for path in [*paths, *(args.check_against or [])]:
            report = estimate.read_report(Path(path))
            if report.model not in estimate.GATE_MODELS:
                raise UserError(f"estimate: {path} measured {report.model}, whose shape is not known here")
            table, worst = estimate.error_table(costs, estimate.GATE_MODELS[report.model], report.points, limit)
            print(f"\n{Path(path).name} ({report.model}, {report.machine}): largest error {worst:.0%}\n{table}")
        return 0
    if args.model in estimate.PRESETS:
        shapes = [estimate.PRESETS[args.model]]
    elif args.model:
        shapes = [estimate.shape_from_gguf(Path(args.model))]
    else:
        shapes = list(estimate.PRESETS.values())
    contexts = [estimate.parse_context(c) for c in args.context.split(",")]
    fraction = estimate.DEFAULT_CEILING if args.read_fraction is None else args.read_fraction
    rows = [estimate.estimate(costs, shape, n, cache, fraction, args.min_kv)
            for shape in shapes for n in contexts for cache in (args.cache_type_k or ["f16", "q8_0"])]
    print()
    print(estimate.format_table(rows))
    what = "its ceiling; the tolerance reads fewer where attention is concentrated" if args.read_fraction is None else "as asked"
    print(f"\nthe block method reading {fraction:.0%} of the blocks ({what}); SCSA at the share of dense's attention it measured")
    return 0


def _cmd_results(args: argparse.Namespace) -> int:
    from llama_sparse import results

    project = Project.find()
    results_dir = project.root / "docs" / "results"
    readme, gates_dir = project.root / "README.md", project.root / "gates"
    if args.action == "publish":
        if not args.run:
            raise UserError("results publish needs a run's folder: results/<gate>-<stamp>")
        for path in results.publish(Path(args.run), results_dir, gates_dir):
            print(f"wrote {path.relative_to(project.root)}")
    elif args.action == "index":
        (results_dir / results.INDEX).write_text(results.index(results_dir, gates_dir))
        print(f"wrote {(results_dir / results.INDEX).relative_to(project.root)}")
    elif args.action == "table":
        if args.write:
            readme.write_text(results.readme_with_table(readme, results_dir))
            print(f"wrote the table into {readme.name}")
        else:
            print(results.readme_table(results_dir))
    else:
        problems = results.stale(readme, results_dir, gates_dir)
        for line in problems:
            print(line)
        print("results: " + ("up to date with the reports" if not problems else f"{len(problems)} out of date"))
        return 1 if problems else 0
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llama-sparse", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)

    p = sub.add_parser("vendor", help="fetch the pinned upstream tree into vendor/llama.cpp")
    p.add_argument("--sdist", type=Path, help="use this sdist file instead of downloading it")
    p.set_defaults(func=_cmd_vendor)

    p = sub.add_parser("patches", help="apply, export or check the patch stack")
    p.add_argument("action", choices=["apply", "export", "check"])
    p.add_argument("--discard", action="store_true",
                   help="apply: throw away vendor commits and changes not in patches/")
    p.set_defaults(func=_cmd_patches)

    p = sub.add_parser("build", help="build the patched tree (or --upstream) into build/")
    p.add_argument("--upstream", action="store_true", help="build the unpatched upstream tree")
    p.add_argument("--cuda", action="store_true", help="also build the CUDA backend")
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument("--target", action="append", help="a cmake target (repeatable)")
    p.add_argument("--tests", action="store_true", help="also build upstream's CPU unit tests we run")
    p.add_argument("--define", action="append", metavar="KEY=VALUE",
                   help="an extra CMake cache entry, e.g. CMAKE_CUDA_ARCHITECTURES=native (repeatable)")
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser("models", help="list, fetch or locate the test models")
    p.add_argument("action", choices=["list", "fetch", "path"])
    p.add_argument("name", nargs="?", help="smollm2-135m | gemma3-270m | tiny-qwen3 | a .gguf path")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("smoke", help="one dense decode at depth on a real model; tokens/s from the log")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--depth", type=int, default=4096, help="prompt length in tokens")
    p.add_argument("--n-predict", type=int, default=64)
    p.add_argument("--threads", type=int)
    p.add_argument("--out", default="results/smoke", help="folder for the server log")
    p.set_defaults(func=_cmd_smoke)

    p = sub.add_parser("profile", help="where a decode step's time goes at a context: perf samples of llama-server "
                                       "by part (the key sketch, the walk, the reads, the weights ...)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--context", default="32k", help="tokens the decode ends at (default 32k)")
    p.add_argument("--n-predict", type=int, default=64, help="decode steps sampled (default 64)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--yarn-orig-ctx", type=int, help="serve with YaRN rope scaling over this trained context "
                                                     "(SmolLM2 past 8K: 8192)")
    p.add_argument("--yarn-scale", type=float, default=4.0)
    p.add_argument("--slots", help="folder of saved prompts, reused by later runs of the same model and "
                                   "context (default: OUT/slots)")
    p.add_argument("--out", default="results/profile", help="folder for the server log and perf.data")
    p.add_argument("flags", nargs=argparse.REMAINDER, help="-- then llama-server flags (--sparse-attn on ...)")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser("gate", help="run a gate defined in a YAML file (see gates/)")
    p.add_argument("file", nargs="?", help="gates/NAME.yaml")
    p.add_argument("--list", action="store_true", help="list the gates in gates/")
    p.add_argument("--only", action="append", metavar="ARM",
                   help="run only this arm and the reference arm (repeatable: several arms)")
    p.add_argument("--out", help="results folder (default: results/)")
    p.add_argument("--render", metavar="DIR",
                   help="draw an earlier run's report.md and plot.png again from its report.json")
    p.set_defaults(func=_cmd_gate)

    p = sub.add_parser("demo", help="the main job: needles in prose and decode A/B against dense on SmolLM2 at 8K")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--full", action="store_true",
                   help="the longer look: needles at 4K and 8K on prose and the repeat haystack, 8 each, speed at both")
    p.add_argument("--samples", type=int, help="needles per task and context (default: 4, or 8 with --full)")
    p.add_argument("--out", help="results folder (default: results/)")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("estimate", help="the decode speed-up to expect for a model (its GGUF header) at a context, "
                                        "from per-step costs measured by the A/B gates")
    p.add_argument("--model", help="a .gguf file, or one of Llama-3.1-8B, Qwen2.5-7B, Gemma-3-12B (default: all three)")
    p.add_argument("--context", default="8k,32k,128k", help="tokens, comma-separated (default: 8k,32k,128k)")
    p.add_argument("--cache-type-k", action="append", choices=sorted(("f16", "q8_0")),
                   help="KV cache type (repeatable; default: f16 and q8_0)")
    p.add_argument("--read-fraction", type=float, default=None,
                   help="the share of blocks the block method reads (default: its ceiling with the key sketch, 0.5)")
    p.add_argument("--min-kv", type=int, default=4096, help="--sparse-attn-min-kv (default 4096)")
    p.add_argument("--calibration", action="append", metavar="REPORT.json",
                   help="an ab report's JSON to fit the costs on (repeatable; default: the current "
                        "crossover-smollm2 and ab-defaults reports in docs/results)")
    p.add_argument("--check", action="store_true",
                   help="print each calibration point beside its estimate, and those of --check-against")
    p.add_argument("--check-against", action="append", metavar="REPORT.json",
                   help="another ab report to check the estimate against (repeatable)")
    p.add_argument("--fit-up-to", metavar="TOKENS",
                   help="fit on the points at or below this context only (--check then shows the longer ones "
                        "as a test of the extrapolation)")
    p.set_defaults(func=_cmd_estimate)

    p = sub.add_parser("results", help="docs/results: publish a run as its gate's current report, the index, "
                                       "the README's table (check: both agree with the reports)")
    p.add_argument("action", choices=["publish", "index", "table", "check"])
    p.add_argument("run", nargs="?", help="publish: a run's folder, results/<gate>-<stamp>")
    p.add_argument("--write", action="store_true", help="table: write it into README.md between its markers")
    p.set_defaults(func=_cmd_results)

    p = sub.add_parser("fuzz", help="fuzz the block-sparse CPU kernels under ASan and UBSan (builds build/fuzz)")
    p.add_argument("--cases", type=int, default=300)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=0,
                   help="threads of the optimized run (default 0: drawn per case from 1 to 64)")
    p.add_argument("--jobs", type=int, default=2, help="build jobs")
    p.set_defaults(func=_cmd_fuzz)

    p = sub.add_parser("cuda-check", help="compile the CUDA translation units the patches touch (nvcc, sm_86 and sm_90)")
    p.add_argument("--source", help="a llama.cpp tree (default: vendor/llama.cpp)")
    p.add_argument("--unit", action="append", help="only this unit, relative to ggml/src/ggml-cuda (repeatable)")
    p.add_argument("--archs", default="86,90", help="comma-separated compute capabilities")
    p.add_argument("--jobs", type=int, default=2)
    p.set_defaults(func=_cmd_cuda_check)

    p = sub.add_parser("abi", help="check that the patched headers (and libraries, once built shared) "
                                   "keep the pinned upstream's ABI")
    p.add_argument("--ref", default="upstream", help="the vendor tree's ref whose headers are the reference")
    p.add_argument("--against", metavar="DIR",
                   help="compare this llama.cpp tree's include/ and ggml/include/ (default: vendor/llama.cpp)")
    p.add_argument("--pin-libs", metavar="DIR", help="upstream's shared libraries (default: its build's bin/)")
    p.add_argument("--our-libs", metavar="DIR", help="our shared libraries (default: build/patched/bin)")
    p.set_defaults(func=_cmd_abi)

    p = sub.add_parser("lib-path", help="the folder of the patched libllama.so and ggml libraries "
                                        "(LLAMA_CPP_LIB_PATH for llama-cpp-python)")
    p.add_argument("--upstream", action="store_true", help="the unpatched build's instead")
    p.set_defaults(func=_cmd_lib_path)

    p = sub.add_parser("python-bindings", help="install llama-cpp-python from the pinned sdist without its native "
                                               "build, or run its vocab-only tests on our DSO")
    p.add_argument("action", choices=("install", "test"))
    p.add_argument("--sparse-attn", choices=("on", "auto", "scsa"),
                   help="test: with LLAMA_SPARSE_ATTN set to this in the environment")
    p.set_defaults(func=_cmd_python_bindings)

    p = sub.add_parser("python-check", help="llama_cpp.Llama on our DSO at a long context: logits against "
                                            "upstream's DSO, decode speed of sparse on and SCSA against off")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="0: every core")
    p.add_argument("--out", help="report folder (default: results/python-check)")
    p.set_defaults(func=_cmd_python_check)

    p = sub.add_parser("ctest", help="run upstream's CPU unit tests on the patched build")
    p.set_defaults(func=_cmd_ctest)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"llama-sparse: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("llama-sparse: interrupted", file=sys.stderr)
        return 130
