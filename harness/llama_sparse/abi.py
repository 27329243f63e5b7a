"""`llama-sparse abi`: does the patched tree keep the binary interface of the pinned upstream?

A program built against upstream's headers must keep working when it is linked against, or
loads, our libraries. Nothing here is a hand-kept list: everything compared is read from the
pin's public headers each time. The checks live in modules of their own, named below; this one
composes them into the report the CLI prints.

1. The public headers (`abi_headers`): `include/*.h` and `ggml/include/*.h` that compile as C
   (`llama.h` and the ggml ones; the C++ ones such as `llama-cpp.h` and `ggml-cpp.h` are
   skipped, each with the reason gcc gives).
2. pycparser reads the pin's headers, preprocessed by `gcc -E` over a few fake system headers
   written here, and lists every struct and union with a body (named, or typedef'd), every
   field (inside anonymous unions and structs too), every enum and its enumerators, every
   function prototype and every typedef (`abi_headers`).
3. One C program is generated from that list (`abi_layout`). It prints sizeof and _Alignof of
   each struct, offsetof and sizeof of each field, sizeof of each enum and the value of each
   enumerator. The same program is compiled against the pin's headers and against ours, and
   both outputs are compared line by line. A field or enumerator that is gone, or renamed, does
   not compile against ours: that is reported with gcc's message, and the rest is still compared.
4. The prototypes (return and parameter types, parameter names dropped, typedef names as
   spelled) and typedefs of the pin must be declared identically in ours; the field types too
   (`abi_headers`).
5. `compare_exports` (`abi_exports`): the symbols each of upstream's shared libraries exports
   (`nm -D`) must be exported by ours as well. It needs shared builds of both trees.
"""

from __future__ import annotations

from dataclasses import dataclass

from llama_sparse.abi_difference import Difference
from llama_sparse.abi_exports import SHARED_LIBRARIES, ExportReport, compare_exports, missing_libraries
from llama_sparse.abi_headers import (HeaderParseError, HeaderTree, PublicApi, SkippedHeader, compare_declarations,
                                      extract_headers, parse_public_api, patched_headers)
from llama_sparse.abi_layout import compare_layout, layout_probes, layout_program, measure

# What the CLI and the tests use, wherever it lives
__all__ = ["SHARED_LIBRARIES", "AbiReport", "Counts", "Difference", "ExportReport", "HeaderParseError", "HeaderTree",
           "PublicApi", "compare_exports", "compare_headers", "extract_headers", "missing_libraries",
           "parse_public_api", "patched_headers"]


@dataclass(frozen=True)
class Counts:
    headers: int
    structs: int
    fields: int
    enums: int
    enumerators: int
    functions: int
    typedefs: int
    objects: int


@dataclass(frozen=True)
class AbiReport:
    pin: str
    other: str
    counts: Counts
    skipped_headers: tuple[SkippedHeader, ...]
    skipped_bitfields: tuple[str, ...]
    differences: tuple[Difference, ...]
    tolerated: tuple[str, ...]     # *_COUNT sentinels that grew: allowed, listed for the record

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        c = self.counts
        lines = [f"abi: {self.pin} headers vs {self.other}",
                 f"  headers parsed: {c.headers}"]
        for s in self.skipped_headers:
            lines.append(f"  skipped {s.path}: {s.reason}")
        lines.append(f"  compared: {c.structs} structs/unions ({c.fields} fields), {c.enums} enums "
                     f"({c.enumerators} enumerators), {c.functions} functions, {c.typedefs} typedefs, "
                     f"{c.objects} variables")
        if self.skipped_bitfields:
            lines.append(f"  bitfields not measured (offsetof cannot take them): {', '.join(self.skipped_bitfields)}")
        else:
            lines.append("  bitfields: none")
        for t in self.tolerated:
            lines.append(f"  allowed: {t}")
        lines.append(f"  differences: {len(self.differences)}")
        lines += [f"    {d.message}" for d in self.differences]
        return "\n".join(lines)


def compare_headers(pin: HeaderTree, other: HeaderTree) -> AbiReport:
    """Checks 1 to 4: the layout program and the declarations of pin's public headers, in other."""
    api = parse_public_api(pin)
    probes = layout_probes(api)
    program = layout_program(api.headers, probes)
    pin_values = measure(pin, program)
    if pin_values.refused:   # the program is generated from these very headers
        raise HeaderParseError(f"the layout program does not compile against {pin.label}: "
                               f"{next(iter(pin_values.refused.values()))}")
    diffs: list[Difference] = []
    tolerated: list[str] = []
    try:
        other_values = measure(other, program)
        d, tolerated = compare_layout(probes, pin_values, other_values, other.label)
        diffs += d
    except HeaderParseError as e:
        diffs.append(Difference("headers", str(e)))
    try:
        diffs += compare_declarations(api, parse_public_api(other, api.headers))
    except HeaderParseError as e:
        diffs.append(Difference("headers", f"declarations not compared: {e}"))
    counts = Counts(len(api.headers), len(api.aggregates), api.n_fields, len(api.enums), api.n_enumerators,
                    len(api.functions), len(api.typedefs), len(api.objects))
    bitfields = tuple(f"{a.name}.{b}" for a in api.aggregates for b in a.bitfields)
    return AbiReport(pin.label, other.label, counts, api.skipped, bitfields, tuple(diffs), tuple(tolerated))
