"""The ABI check: silent on the pin against itself, loud on each kind of break made in a scratch
copy of the pin's headers, and the real check of the patched tree against the pin."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_sparse import abi, cli
from llama_sparse.build import bin_dir
from llama_sparse.project import Project

pytestmark = [
    pytest.mark.skipif(not (Project.find(Path(__file__).parent).vendor_dir / ".git").exists(),
                       reason="needs `llama-sparse vendor` first"),
    pytest.mark.skipif(shutil.which("gcc") is None, reason="the ABI check compiles with gcc"),
]

LLAMA_H = "include/llama.h"
GGML_H = "ggml/include/ggml.h"


@pytest.fixture(scope="session")
def pin_headers(project: Project, tmp_path_factory: pytest.TempPathFactory) -> abi.HeaderTree:
    return abi.extract_headers(project.vendor_dir, tmp_path_factory.mktemp("pin-headers"))


@pytest.fixture(scope="session")
def pin_api(pin_headers: abi.HeaderTree) -> abi.PublicApi:
    return abi.parse_public_api(pin_headers)


@pytest.fixture
def scratch(pin_headers: abi.HeaderTree, tmp_path: Path) -> abi.HeaderTree:
    """A copy of the pin's headers a test may spoil."""
    shutil.copytree(pin_headers.root, tmp_path / "scratch")
    return abi.HeaderTree(tmp_path / "scratch", "scratch")


def edit(tree: abi.HeaderTree, rel: str, old: str, new: str) -> None:
    """Replace the one occurrence of old: a test whose edit no longer applies must say so."""
    path = tree.root / rel
    text = path.read_text()
    assert text.count(old) == 1, f"{rel}: {old!r} occurs {text.count(old)} times, expected once"
    path.write_text(text.replace(old, new))


def append_field(tree: abi.HeaderTree, struct: str, declaration: str) -> None:
    path = tree.root / LLAMA_H
    text = path.read_text()
    start = text.index(f"struct {struct} {{")
    close = re.compile(r"\n\s*\};").search(text, start)
    assert close, f"no end to struct {struct}"
    path.write_text(text[:close.start()] + f"\n        {declaration};" + text[close.start():])


def enumerators(api: abi.PublicApi, enum: str) -> tuple[str, ...]:
    return next(e.enumerators for e in api.enums if e.name == enum)


def messages(report: abi.AbiReport) -> list[str]:
    return [d.message for d in report.differences]


def test_the_pin_against_itself_differs_in_nothing(pin_headers: abi.HeaderTree, pin_api: abi.PublicApi) -> None:
    # every comparison and spelling runs; only compiling twice does not (the same headers give
    # the same program output, so it is measured once)
    report = abi.compare_headers(pin_headers, pin_headers)
    assert report.ok, report.summary()
    assert not report.tolerated
    c = report.counts
    # counts from the headers, held to what llama.h and ggml.h alone must give at least
    assert c.structs > 30 and c.fields > 200, report.summary()
    assert c.enumerators > 350 and c.functions > 800 and c.typedefs > 40, report.summary()
    assert "llama.h" in " ".join(pin_api.headers) and GGML_H in pin_api.headers
    names = {a.name for a in pin_api.aggregates}
    assert {"llama_context_params", "llama_model_params", "ggml_tensor", "ggml_bf16_t"} <= names
    # the anonymous union of llama_model_kv_override is measured member by member
    kv = next(a for a in pin_api.aggregates if a.name == "llama_model_kv_override")
    assert {"val_i64", "val_f64", "val_str"} <= {f.path for f in kv.fields}
    assert "GGML_OP_UNARY" in enumerators(pin_api, "ggml_op")
    skipped = {s.path: s.reason for s in report.skipped_headers}
    assert "include/llama-cpp.h" in skipped and "ggml/include/ggml-cpp.h" in skipped
    assert all(r.startswith("not C: ") for r in skipped.values())


def test_a_field_appended_to_llama_context_params_is_a_size_change(pin_headers: abi.HeaderTree,
                                                                   scratch: abi.HeaderTree) -> None:
    append_field(scratch, "llama_context_params", "int32_t abi_test_extra")
    report = abi.compare_headers(pin_headers, scratch)
    assert len(report.differences) == 1, report.summary()
    m = re.fullmatch(r"llama_context_params: sizeof (\d+) -> (\d+)", report.differences[0].message)
    assert m and int(m.group(2)) > int(m.group(1)), report.summary()


def test_an_op_inserted_before_unary_shifts_every_later_op(pin_headers: abi.HeaderTree, pin_api: abi.PublicApi,
                                                           scratch: abi.HeaderTree) -> None:
    edit(scratch, GGML_H, "        GGML_OP_UNARY,\n", "        GGML_OP_ABI_TEST,\n        GGML_OP_UNARY,\n")
    report = abi.compare_headers(pin_headers, scratch)
    ops = enumerators(pin_api, "ggml_op")
    shifted = ops[ops.index("GGML_OP_UNARY"):-1]   # COUNT grows: allowed
    expected = {f"ggml_op {op}" for op in shifted}
    assert {m.partition(":")[0] for m in messages(report)} == expected, report.summary()
    unary = next(m for m in messages(report) if m.startswith("ggml_op GGML_OP_UNARY:"))
    old, new = map(int, re.findall(r"\d+", unary))
    assert new == old + 1
    assert [t for t in report.tolerated if "GGML_OP_COUNT" in t], report.summary()


def test_an_op_appended_before_count_is_allowed(pin_headers: abi.HeaderTree, scratch: abi.HeaderTree) -> None:
    edit(scratch, GGML_H, "        GGML_OP_COUNT,\n", "        GGML_OP_ABI_TEST,\n        GGML_OP_COUNT,\n")
    report = abi.compare_headers(pin_headers, scratch)
    assert report.ok, report.summary()
    # not silent because nothing was seen: the sentinel's growth is recorded
    assert len(report.tolerated) == 1 and report.tolerated[0].startswith("ggml_op GGML_OP_COUNT: ")


def test_a_count_that_shrinks_is_reported(pin_headers: abi.HeaderTree, pin_api: abi.PublicApi,
                                          scratch: abi.HeaderTree) -> None:
    last_op = enumerators(pin_api, "ggml_op")[-2]
    edit(scratch, GGML_H, f"        {last_op},\n", "")
    report = abi.compare_headers(pin_headers, scratch)
    assert any(m.startswith("ggml_op GGML_OP_COUNT: ") and "must not shrink" in m for m in messages(report)), \
        report.summary()
    assert any(m.startswith(f"ggml_op {last_op}: does not compile") for m in messages(report)), report.summary()


def test_a_changed_parameter_type_is_reported(pin_headers: abi.HeaderTree, scratch: abi.HeaderTree) -> None:
    edit(scratch, LLAMA_H, "llama_set_n_threads(struct llama_context * ctx, int32_t n_threads,",
         "llama_set_n_threads(struct llama_context * ctx, int64_t n_threads,")
    report = abi.compare_headers(pin_headers, scratch)
    assert messages(report) == [
        "prototype llama_set_n_threads: void llama_set_n_threads(struct llama_context *, int32_t, int32_t)"
        " -> void llama_set_n_threads(struct llama_context *, int64_t, int32_t)"], report.summary()


def test_a_renamed_field_is_reported_and_the_rest_still_compared(pin_headers: abi.HeaderTree,
                                                                 scratch: abi.HeaderTree) -> None:
    edit(scratch, LLAMA_H, "        uint32_t n_ctx; ", "        uint32_t n_ctx_renamed; ")
    append_field(scratch, "llama_context_params", "int32_t abi_test_extra")
    report = abi.compare_headers(pin_headers, scratch)
    found = messages(report)
    assert any(m.startswith("llama_context_params.n_ctx: does not compile against scratch: ")
               and "n_ctx" in m for m in found), report.summary()
    # the program is compiled again without the refused lines: the size change is still seen
    assert any(m.startswith("llama_context_params: sizeof ") for m in found), report.summary()


def test_a_field_type_of_the_same_size_is_reported(pin_headers: abi.HeaderTree, scratch: abi.HeaderTree) -> None:
    edit(scratch, LLAMA_H, "        uint32_t n_ctx; ", "        float    n_ctx; ")
    report = abi.compare_headers(pin_headers, scratch)
    assert messages(report) == ["llama_context_params.n_ctx: type uint32_t -> float"], report.summary()


def test_headers_that_no_longer_compile_are_reported(pin_headers: abi.HeaderTree, scratch: abi.HeaderTree) -> None:
    edit(scratch, "ggml/include/gguf.h", "#include \"ggml.h\"", "#include \"ggml.h\"\nthis is not C;")
    report = abi.compare_headers(pin_headers, scratch)
    assert not report.ok
    assert all(d.check == "headers" for d in report.differences), report.summary()


def test_the_cli_exits_1_on_a_difference_and_0_without(pin_headers: abi.HeaderTree, scratch: abi.HeaderTree,
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # library folders that do not exist: the exported-symbols check says it did not run
    no_libs = ["--pin-libs", str(tmp_path / "none-up"), "--our-libs", str(tmp_path / "none-ours")]
    assert cli.main(["abi", "--against", str(scratch.root), *no_libs]) == 0
    out = capsys.readouterr().out
    assert "differences: 0" in out and "exported symbols: not compared" in out and "abi: OK" in out
    append_field(scratch, "llama_context_params", "int32_t abi_test_extra")
    assert cli.main(["abi", "--against", str(scratch.root), *no_libs]) == 1
    out = capsys.readouterr().out
    assert "llama_context_params: sizeof " in out and "abi: FAILED" in out


SYNTHETIC_H = """
#pragma once
#include <stdint.h>
#include <stdbool.h>
struct outer {
    int32_t a;
    union { int64_t i; double d; };           /* an anonymous union: its members are outer's */
    struct { int8_t x; int64_t y; } named;    /* a member of an unnamed struct type */
    struct { char c; } many[3];
    void (*callback)(void * user_data, int n);
    unsigned flag : 1;
    char tail[];
};
typedef struct { uint16_t bits; } half_t;
enum { ANON_A, ANON_B = 5 };
typedef enum { TE_X, TE_COUNT } te_t;
int32_t f(const struct outer * o, void (*cb)(int value));
"""


def synthetic_tree(root: Path, text: str) -> abi.HeaderTree:
    (root / "include").mkdir(parents=True)
    (root / "include" / "llama.h").write_text(text)
    return abi.HeaderTree(root, root.name)


def test_nested_members_function_pointers_and_bitfields(tmp_path: Path) -> None:
    tree = synthetic_tree(tmp_path / "mine", SYNTHETIC_H)
    api = abi.parse_public_api(tree)
    outer = next(a for a in api.aggregates if a.name == "outer")
    assert [f.path for f in outer.fields] == ["a", "i", "d", "named", "named.x", "named.y", "many",
                                              "many[0].c", "callback", "tail"]
    assert outer.bitfields == ("flag",)
    assert next(f for f in outer.fields if f.path == "callback").type == "void (*)(void *, int)"
    assert {a.name for a in api.aggregates} == {"outer", "half_t"}
    assert {e.name for e in api.enums if e.c_type} == {"te_t"} and len(api.enums) == 2
    assert api.functions == {"f": "int32_t f(const struct outer *, void (*)(int))"}
    assert abi.compare_headers(tree, tree).ok

    changed = synthetic_tree(tmp_path / "changed", SYNTHETIC_H.replace("int64_t y;", "int32_t y;")
                             .replace("int value", "long value").replace("TE_X, TE_COUNT", "TE_X, TE_Y, TE_COUNT"))
    found = messages(abi.compare_headers(tree, changed))
    assert "outer.named.y: sizeof 8 -> 4" in found
    assert "outer.named.y: type int64_t -> int32_t" in found
    assert "prototype f: int32_t f(const struct outer *, void (*)(int)) -> int32_t f(const struct outer *, void (*)(long))" in found
    assert not [m for m in found if "TE_COUNT" in m]   # grew: allowed


# -- exported symbols ---------------------------------------------------------------------------


def shared_library(folder: Path, name: str, functions: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"{name}.c"
    src.write_text("".join(f"int {f}(void) {{ return {i}; }}\n" for i, f in enumerate(functions))
                   + "static int hidden(void) { return 7; }\nint (*keep)(void) = hidden;\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / name), str(src)], check=True)


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_a_symbol_upstream_exports_and_ours_does_not_is_reported(tmp_path: Path) -> None:
    for lib in abi.SHARED_LIBRARIES:
        stem = lib.removeprefix("lib").removesuffix(".so").replace("-", "_")
        shared_library(tmp_path / "up", lib, [f"{stem}_a", f"{stem}_b"])
        # ours drops llama's _b and adds a function of its own to each library
        ours = [f"{stem}_a", f"{stem}_new"] + ([] if lib == "libllama.so" else [f"{stem}_b"])
        shared_library(tmp_path / "ours", lib, ours)
    report = abi.compare_exports(tmp_path / "up", tmp_path / "ours")
    assert [d.message for d in report.differences] == ["libllama.so: llama_b exported by upstream, not by ours"]
    assert report.n_symbols >= 3 * len(abi.SHARED_LIBRARIES)   # two functions and `keep` each
    assert abi.compare_exports(tmp_path / "up", tmp_path / "up").ok


def test_the_patched_libraries_export_upstreams_symbols(project: Project) -> None:
    ours, theirs = bin_dir(project, "patched"), bin_dir(project, "upstream")
    missing = abi.missing_libraries(theirs, ours)
    if missing:
        pytest.skip(f"needs shared builds of both trees: no {', '.join(str(p.relative_to(project.root)) for p in missing)}")
    report = abi.compare_exports(theirs, ours)
    if not report.ok:
        pytest.fail(report.summary(), pytrace=False)


# -- the real check -----------------------------------------------------------------------------


def test_the_patched_headers_keep_upstreams_abi(project: Project, pin_headers: abi.HeaderTree) -> None:
    report = abi.compare_headers(pin_headers, abi.patched_headers(project.vendor_dir))
    if not report.ok:   # the whole report, not a repr: it is what a reader acts on
        pytest.fail(report.summary(), pytrace=False)
