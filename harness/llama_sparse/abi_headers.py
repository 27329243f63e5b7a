"""The headers check (checks 1, 2 and 4 of `llama-sparse abi`, as llama_sparse.abi lists them):
the pin's public headers, extracted from the vendor checkout's git (`extract_headers`), read by
pycparser (`parse_public_api`), and their declarations looked for in another tree
(`compare_declarations`). Their layout is measured by llama_sparse.abi_layout.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from llama_sparse.abi_difference import Difference
from llama_sparse.errors import UserError
from llama_sparse.gitrepo import GitRepo
from llama_sparse.project import UPSTREAM_TAG

HEADER_DIRS = ("include", "ggml/include")   # a llama.cpp tree's public header folders

# Enough of the C library for the public headers to preprocess without the system's headers,
# whose GNU extensions pycparser cannot read. Only the parser sees these: the generated program
# is compiled against the real ones, so every size it prints is the platform's.
FAKE_SYSTEM_HEADERS = {
    "stdint.h": """
typedef signed char int8_t;   typedef unsigned char uint8_t;
typedef short int16_t;        typedef unsigned short uint16_t;
typedef int int32_t;          typedef unsigned int uint32_t;
typedef long long int64_t;    typedef unsigned long long uint64_t;
typedef long intptr_t;        typedef unsigned long uintptr_t;
typedef long long intmax_t;   typedef unsigned long long uintmax_t;
#define INT8_MAX 127
#define INT16_MAX 32767
#define INT32_MAX 2147483647
#define INT64_MAX 9223372036854775807LL
#define UINT32_MAX 4294967295U
#define UINT64_MAX 18446744073709551615ULL
#define SIZE_MAX UINT64_MAX
#define UINTPTR_MAX 0xFFFFFFFFFFFFFFFFUL
""",
    "stddef.h": """
typedef unsigned long size_t;
typedef long ptrdiff_t;
typedef int wchar_t;
#define NULL ((void *)0)
#define offsetof(t, m) ((size_t)&((t *)0)->m)
""",
    "stdbool.h": "typedef _Bool bool;\n#define true 1\n#define false 0\n",   # a typedef: spelled "bool"
    "stdio.h": '#include <stddef.h>\ntypedef struct _IO_FILE FILE;\n',
    "stdarg.h": "typedef void * va_list;\n",
    "stdlib.h": "#include <stddef.h>\n",
    "string.h": "#include <stddef.h>\n",
    "limits.h": "#define INT_MAX 2147483647\n#define CHAR_BIT 8\n",
    "inttypes.h": "#include <stdint.h>\n",
}

# What pycparser cannot read, defined away. The headers define GGML_API, GGML_BACKEND_API and
# LLAMA_API themselves; with *_SHARED undefined they take their static-build branch (`extern`, or
# nothing), and the `__attribute__((visibility))` of the shared branch goes with __attribute__.
# GGML_DEPRECATED(func, hint), DEPRECATED and GGML_ATTRIBUTE_FORMAT expand to __attribute__ under
# __GNUC__ (kept, so the headers read as gcc reads them); GGML_NORETURN is _Noreturn, which
# pycparser reads. GGML_RESTRICT is C99 `restrict` in C.
PARSER_DEFINES = (
    "-U__cplusplus", "-UGGML_SHARED", "-UGGML_BACKEND_SHARED", "-ULLAMA_SHARED",
    "-D__attribute__(x)=", "-D__declspec(x)=", "-D__restrict__=restrict", "-D__restrict=restrict",
    "-D__inline__=inline", "-D__inline=inline", "-D__extension__=", "-D__asm__(x)=",
    "-D__builtin_va_list=void *",
)


@dataclass(frozen=True)
class HeaderTree:
    """A folder laid out as llama.cpp: public headers in include/ and ggml/include/."""

    root: Path
    label: str   # how reports name it: "upstream", "patched", a path

    @property
    def include_dirs(self) -> tuple[Path, ...]:
        return tuple(self.root / d for d in HEADER_DIRS)

    def header_files(self) -> list[str]:
        """Every .h directly in the public folders, relative to the root."""
        return sorted(f"{d}/{p.name}" for d in HEADER_DIRS if (self.root / d).is_dir()
                      for p in (self.root / d).glob("*.h"))

    def include_flags(self) -> list[str]:
        return [f"-I{d.resolve()}" for d in self.include_dirs]

    def digest(self) -> str:
        """The headers' names and contents (not where they are): the key of the memos below, so
        that a second copy of the same headers is neither parsed nor measured again."""
        h = hashlib.sha256()
        for rel in self.header_files():
            h.update(rel.encode() + b"\0" + (self.root / rel).read_bytes() + b"\0")
        return h.hexdigest()


def extract_headers(vendor_dir: Path, dest: Path, ref: str = UPSTREAM_TAG) -> HeaderTree:
    """Write the header folders as they are at `ref` (the pin by default: every .h git holds
    under them there) into dest."""
    repo = GitRepo(vendor_dir)
    if not repo.is_repo() or repo.rev(ref) is None:
        raise UserError(f"{vendor_dir}: no git tree with the ref {ref!r} (run `llama-sparse vendor`)")
    names = repo.out("ls-tree", "-r", "--name-only", ref, "--", *HEADER_DIRS).splitlines()
    headers = [n for n in names if n.endswith(".h")]
    if not headers:
        raise UserError(f"{vendor_dir}: no headers under {', '.join(HEADER_DIRS)} at {ref}")
    for rel in headers:
        blob = subprocess.run(["git", "-C", str(vendor_dir), "show", f"{ref}:{rel}"],
                              capture_output=True, check=True).stdout
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(blob)
    return HeaderTree(dest, ref)


def patched_headers(vendor_dir: Path) -> HeaderTree:
    """The working tree of the vendor checkout: the patched headers."""
    return HeaderTree(vendor_dir, "patched")


# ---------------------------------------------------------------------------------------------
# What the pin's headers declare


@dataclass(frozen=True)
class SkippedHeader:
    path: str     # relative to the tree
    reason: str


@dataclass(frozen=True)
class Field:
    path: str     # as offsetof takes it: "n_ctx", "val_i64" (in an anonymous union), "inner.x"
    type: str     # canonical spelling (parameter names dropped, struct bodies left out)
    flexible: bool = False   # a flexible array member: no sizeof


@dataclass(frozen=True)
class Aggregate:
    """A struct or union with a body in a public header."""

    name: str              # how messages name it: "llama_context_params", "ggml_bf16_t"
    c_type: str            # how C spells it: "struct llama_context_params", "ggml_bf16_t"
    header: str
    fields: tuple[Field, ...]
    bitfields: tuple[str, ...]   # offsetof and sizeof cannot take these: left out


@dataclass(frozen=True)
class Enum:
    name: str              # "ggml_op", a typedef name, or "anonymous enum (ggml/include/x.h:12)"
    c_type: str | None     # "enum ggml_op" or the typedef name; None for an anonymous enum
    header: str
    enumerators: tuple[str, ...]


@dataclass(frozen=True)
class PublicApi:
    """Everything the C parser found in one tree's public headers."""

    tree: HeaderTree
    headers: tuple[str, ...]            # parsed, in include order
    skipped: tuple[SkippedHeader, ...]
    aggregates: tuple[Aggregate, ...]
    enums: tuple[Enum, ...]
    functions: dict[str, str]           # name -> canonical prototype
    typedefs: dict[str, str]            # name -> canonical typedef
    objects: dict[str, str]             # extern variables: name -> canonical declaration

    @property
    def n_fields(self) -> int:
        return sum(len(a.fields) for a in self.aggregates)

    @property
    def n_enumerators(self) -> int:
        return sum(len(e.enumerators) for e in self.enums)


class HeaderParseError(UserError):
    """A tree's headers do not preprocess, parse or compile: the message says where. For the
    pin's this stops the check; for the other tree's it is one of the differences."""


GCC_ENV = {**os.environ, "LC_ALL": "C"}   # gcc's messages with plain quotes, whatever the locale


def find_gcc() -> str:
    gcc = shutil.which("gcc")
    if not gcc:
        raise UserError("the ABI check needs gcc on PATH")
    return gcc


def _write_fake_system_headers(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in FAKE_SYSTEM_HEADERS.items():
        (folder / name).write_text(text.lstrip())
    return folder


def first_error(stderr: str) -> str:
    for line in stderr.splitlines():
        if "error" in line:
            return line.strip()
    return stderr.strip().splitlines()[-1] if stderr.strip() else "(no message)"


def _parser_command(tree: HeaderTree, fake: Path) -> list[str]:
    return [find_gcc(), "-nostdinc", "-std=c11", f"-I{fake}", *tree.include_flags(), *PARSER_DEFINES]


def _c_headers(tree: HeaderTree, candidates: Sequence[str], fake: Path,
               work: Path) -> tuple[list[str], list[SkippedHeader]]:
    """The candidates that compile as C on their own, and the others with gcc's reason."""

    def check(rel: str) -> str | None:
        src = work / f"only-{rel.replace('/', '-')}.c"
        src.write_text(f'#include "{Path(rel).name}"\n')
        proc = subprocess.run([*_parser_command(tree, fake), "-fsyntax-only", str(src)],
                              capture_output=True, text=True, env=GCC_ENV)
        if proc.returncode == 0:
            return None
        return "not C: " + first_error(proc.stderr).replace(str(tree.root.resolve()) + "/", "")

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        reasons = dict(zip(candidates, pool.map(check, candidates)))
    ok = [h for h in candidates if reasons[h] is None]
    return ok, [SkippedHeader(h, r) for h, r in reasons.items() if r is not None]


def _preprocess(tree: HeaderTree, headers: Sequence[str], fake: Path, work: Path) -> str:
    src = work / "all-public-headers.c"
    src.write_text("".join(f'#include "{Path(h).name}"\n' for h in headers))
    proc = subprocess.run([*_parser_command(tree, fake), "-E", str(src)], capture_output=True, text=True,
                          env=GCC_ENV)
    if proc.returncode != 0:
        raise HeaderParseError(f"{tree.label}: gcc -E failed: {first_error(proc.stderr)}")
    return proc.stdout


def _parse(text: str, label: str):
    from pycparser import c_parser

    try:
        return c_parser.CParser().parse(text, filename=label)
    except Exception as e:   # pycparser raises ParseError, and plain errors on odd input
        raise HeaderParseError(f"{label}: pycparser: {e}") from e


# Canonical spellings ------------------------------------------------------------------------


def _strip_bodies(node) -> None:
    """Struct, union and enum bodies are compared by the layout check: spell them by name only."""
    from pycparser import c_ast

    for _, child in node.children():
        _strip_bodies(child)
    if isinstance(node, (c_ast.Struct, c_ast.Union)):
        node.decls = None
        node.name = node.name or "<anonymous>"
    elif isinstance(node, c_ast.Enum):
        node.values = None
        node.name = node.name or "<anonymous>"


def _strip_names(node) -> None:
    """Drop every name below node: parameter names do not take part in the ABI."""
    from pycparser import c_ast

    if isinstance(node, c_ast.TypeDecl):
        node.declname = None
    elif isinstance(node, c_ast.Decl):
        node.name = None
    for _, child in node.children():
        _strip_names(child)


def _strip_parameter_names(type_node) -> None:
    """Names inside every parameter list of a declarator (the declared name itself stays)."""
    from pycparser import c_ast

    if isinstance(type_node, c_ast.FuncDecl) and type_node.args is not None:
        _strip_names(type_node.args)
    for _, child in type_node.children():
        if not isinstance(child, c_ast.ParamList):
            _strip_parameter_names(child)


def _tidy(text: str) -> str:
    text = " ".join(text.split())
    return re.sub(r"\s+([,)\]])", r"\1", re.sub(r"([(\[])\s+", r"\1", text))


def _canonical_decl(decl) -> str:
    """`ret name(param types)`: storage (extern) and function specifiers (_Noreturn) left out,
    as they do not change how a call is made."""
    from pycparser import c_generator

    d = copy.deepcopy(decl)
    d.storage, d.funcspec, d.init = [], [], None
    _strip_bodies(d.type)
    _strip_parameter_names(d.type)
    return _tidy(c_generator.CGenerator().visit(d))


def _canonical_type(type_node) -> str:
    from pycparser import c_ast, c_generator

    t = copy.deepcopy(type_node)
    _strip_bodies(t)
    _strip_names(t)
    return _tidy(c_generator.CGenerator().visit(c_ast.Typename(None, [], None, t)))


def _canonical_typedef(td) -> str:
    from pycparser import c_generator

    t = copy.deepcopy(td)
    _strip_bodies(t.type)
    _strip_parameter_names(t.type)
    return _tidy(c_generator.CGenerator().visit(t))


# The walk -----------------------------------------------------------------------------------


def _base_type(type_node):
    """Below any array declarators: (the element type node, array depth)."""
    from pycparser import c_ast

    depth = 0
    while isinstance(type_node, c_ast.ArrayDecl):
        type_node, depth = type_node.type, depth + 1
    return type_node, depth


def _body_of(type_node):
    """The struct/union/enum a TypeDecl spells, or None."""
    from pycparser import c_ast

    if isinstance(type_node, c_ast.TypeDecl) and isinstance(type_node.type, (c_ast.Struct, c_ast.Union, c_ast.Enum)):
        return type_node.type
    return None


def _fields(decls, prefix: str, out: list[Field], bitfields: list[str]) -> None:
    """The members of a body, into out; anonymous members' members as the struct's own (C11)."""
    from pycparser import c_ast

    for d in decls or ():
        if not isinstance(d, c_ast.Decl):
            continue
        if d.bitsize is not None:
            bitfields.append(prefix + (d.name or "<unnamed>"))
            continue
        if d.name is None:
            inner = d.type if isinstance(d.type, (c_ast.Struct, c_ast.Union)) else _body_of(d.type)
            if isinstance(inner, (c_ast.Struct, c_ast.Union)) and inner.decls is not None:
                _fields(inner.decls, prefix, out, bitfields)
            continue
        flexible = isinstance(d.type, c_ast.ArrayDecl) and d.type.dim is None
        out.append(Field(prefix + d.name, _canonical_type(d.type), flexible))
        element, depth = _base_type(d.type)
        inner = _body_of(element)
        # A member of an unnamed struct type has no other name: its members are checked here.
        # A named one is an aggregate of its own, checked as such.
        if isinstance(inner, (c_ast.Struct, c_ast.Union)) and inner.name is None and inner.decls is not None:
            _fields(inner.decls, prefix + d.name + "[0]" * depth + ".", out, bitfields)


@dataclass
class _Collector:
    root: Path
    public: set[Path]
    aggregates: list[Aggregate] = field(default_factory=list)
    enums: list[Enum] = field(default_factory=list)
    functions: dict[str, str] = field(default_factory=dict)
    typedefs: dict[str, str] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)

    def header_of(self, node) -> str | None:
        if node.coord is None or not node.coord.file:
            return None
        path = Path(node.coord.file).resolve()
        if path not in self.public:
            return None
        return path.relative_to(self.root.resolve()).as_posix()

    def file_scope(self, ext) -> None:
        from pycparser import c_ast

        for node in ext:
            header = self.header_of(node)
            if header is None:
                continue   # a fake system header's
            if isinstance(node, c_ast.Typedef):
                self.typedefs[node.name] = _canonical_typedef(node)
                self.bodies(node.type, header, typedef_name=node.name)
            elif isinstance(node, c_ast.Decl):
                if isinstance(node.type, c_ast.FuncDecl):
                    if node.name:
                        self.functions[node.name] = _canonical_decl(node)
                elif node.name and "static" not in node.storage:
                    # a variable the libraries export (a static const in a header is the
                    # includer's own copy; GGML_TENSOR_SIZE is one, measured as sizeof anyway)
                    self.objects[node.name] = _canonical_decl(node)
                self.bodies(node.type, header)
            elif isinstance(node, c_ast.FuncDef):
                self.functions[node.decl.name] = _canonical_decl(node.decl)

    def bodies(self, node, header: str, typedef_name: str | None = None) -> None:
        """Every struct, union and enum with a body below node, in source order."""
        from pycparser import c_ast

        if isinstance(node, c_ast.TypeDecl) and typedef_name:
            target = node.type
            if isinstance(target, (c_ast.Struct, c_ast.Union, c_ast.Enum)) and target.name is None:
                self.body(target, header, typedef_name)
                for _, child in target.children():
                    self.bodies(child, header)
                return
        if isinstance(node, (c_ast.Struct, c_ast.Union, c_ast.Enum)):
            self.body(node, header, None)
        for _, child in node.children():
            self.bodies(child, header)

    def body(self, node, header: str, typedef_name: str | None) -> None:
        from pycparser import c_ast

        if isinstance(node, c_ast.Enum):
            if node.values is None:
                return
            names = tuple(e.name for e in node.values.enumerators)
            if node.name:
                self.enums.append(Enum(node.name, f"enum {node.name}", header, names))
            elif typedef_name:
                self.enums.append(Enum(typedef_name, typedef_name, header, names))
            else:
                line = node.coord.line if node.coord else 0
                self.enums.append(Enum(f"anonymous enum ({header}:{line})", None, header, names))
            return
        if node.decls is None:
            return
        kind = "struct" if isinstance(node, c_ast.Struct) else "union"
        if node.name:
            name, c_type = node.name, f"{kind} {node.name}"
        elif typedef_name:
            name, c_type = typedef_name, typedef_name
        else:
            return   # an unnamed member's type: its fields belong to the struct holding it
        fields: list[Field] = []
        bitfields: list[str] = []
        _fields(node.decls, "", fields, bitfields)
        self.aggregates.append(Aggregate(name, c_type, header, tuple(fields), tuple(bitfields)))


def _parseable(tree: HeaderTree, headers: Sequence[str], fake: Path,
               work: Path) -> tuple[list[str], list[SkippedHeader]]:
    ok: list[str] = []
    skipped: list[SkippedHeader] = []
    for h in headers:
        try:
            _parse(_preprocess(tree, [h], fake, work), h)
            ok.append(h)
        except HeaderParseError as e:
            skipped.append(SkippedHeader(h, f"pycparser cannot read it: {e}"))
    if not ok:
        raise HeaderParseError(f"{tree.label}: pycparser reads none of the public headers: "
                               f"{skipped[0].reason if skipped else 'none found'}")
    return ok, skipped


_PARSED: dict[tuple[str, tuple[str, ...] | None], PublicApi] = {}


def parse_public_api(tree: HeaderTree, headers: Sequence[str] | None = None) -> PublicApi:
    """The public C API of a tree. headers: parse these (another tree's list, so that both sides
    read the same files); None: every header in the public folders that compiles as C."""
    try:
        import pycparser  # noqa: F401
    except ImportError as e:
        raise UserError("the ABI check needs pycparser: pip install pycparser (or the [test] extras)") from e
    key = (tree.digest(), tuple(headers) if headers is not None else None)
    if key in _PARSED:
        return dataclasses.replace(_PARSED[key], tree=tree)
    with tempfile.TemporaryDirectory(prefix="llama-sparse-abi-") as tmp:
        work = Path(tmp)
        fake = _write_fake_system_headers(work / "fake-libc")
        if headers is None:
            ok, skipped = _c_headers(tree, tree.header_files(), fake, work)
        else:
            ok, skipped = list(headers), []
        # llama.h first: it is the one the others serve, and its includes define the order
        ok.sort(key=lambda h: (h != "include/llama.h", h))
        try:
            ast = _parse(_preprocess(tree, ok, fake, work), tree.label)
        except HeaderParseError:
            if headers is not None:
                raise   # the other tree must read as the pin's does: the caller reports it
            # gcc takes them but pycparser does not: find which, one header at a time (slow, rare)
            ok, unparsed = _parseable(tree, ok, fake, work)
            skipped += unparsed
            ast = _parse(_preprocess(tree, ok, fake, work), tree.label)
    public = {(tree.root / h).resolve() for h in ok}
    collector = _Collector(tree.root, public)
    collector.file_scope(ast.ext)
    api = PublicApi(tree, tuple(ok), tuple(skipped), tuple(collector.aggregates), tuple(collector.enums),
                    collector.functions, collector.typedefs, collector.objects)
    _PARSED[key] = api
    return api


# ---------------------------------------------------------------------------------------------
# The comparison


def compare_declarations(pin: PublicApi, other: PublicApi) -> list[Difference]:
    """Check 4: pin's prototypes, typedefs, variables and field types, declared the same in other."""
    diffs: list[Difference] = []
    for kind, mine, theirs in (("prototype", pin.functions, other.functions),
                               ("typedef", pin.typedefs, other.typedefs),
                               ("variable", pin.objects, other.objects)):
        for name, decl in mine.items():
            if name not in theirs:
                diffs.append(Difference(kind, f"{kind} {name}: missing from {other.tree.label} ({decl})"))
            elif theirs[name] != decl:
                diffs.append(Difference(kind, f"{kind} {name}: {decl} -> {theirs[name]}"))
    # A field of the same size and offset can still change meaning (uint32_t to float).
    their_fields = {(a.c_type, f.path): f.type for a in other.aggregates for f in a.fields}
    for a in pin.aggregates:
        for f in a.fields:
            new = their_fields.get((a.c_type, f.path))
            if new is not None and new != f.type:
                diffs.append(Difference("field type", f"{a.name}.{f.path}: type {f.type} -> {new}"))
    return diffs
