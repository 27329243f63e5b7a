"""RULER needle-in-a-haystack prompts and scoring: the niah tasks of RULER's synthetic.yaml.

Follows RULER's `niah` task (Hsieh et al., NVIDIA, 2024). The wording is quoted from the RULER
sources (Apache-2.0, "Copyright (c) 2024, NVIDIA CORPORATION"):

* scripts/data/synthetic/niah.py (hsiehjackson/RULER @ 56f7e8ee275ed5a9ac6fcf403d2dec8ef2b6ab4b,
  the RULER author's repository; same text in xuuHuang/RULER @ fa17be2774a7): the needle
  ``"One of the special magic {type_needle_v} for {key} is: {value}."``, the "repeat" haystack
  ``"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."``
  (``sentences = [haystack] * num_haystack``, needles inserted between them,
  ``context = "\\n".join(sentences)``), the "essay" haystack (sentences joined by spaces, the
  needles inserted between sentences), the "needle" haystack (every line a needle of another
  key, ``context = "\\n".join(sentences)``), 7-digit values (``random.randint(10**6, 10**7 - 1)``),
  UUID values and keys (``uuid.uuid4()``), "adjective-noun" keys from wonderwords, and the
  singular rewrite of the template when ``num_needle_q * num_needle_v == 1`` (Some->A,
  "are all"->is, are->is, answers->answer, drop the final "s" of ``type_needle_v``).
* scripts/data/synthetic/constants.py (FerrisChi/RULER @ 08b17256fafe2d447311954949a2d6556ebabcc8,
  xuuHuang/RULER @ fa17be2774a7): ``TASKS['niah']['template']`` and ``['answer_prefix']``, which
  scripts/data/prepare.py joins as ``model_template.format(task_template=template) +
  answer_prefix``; with the ``base`` model template ("{task_template}", scripts/data/template.py)
  that is the raw prompt, no chat template.
* scripts/synthetic.yaml (FerrisChi/RULER @ 08b17256): niah_single_1 (repeat haystack),
  niah_single_2 (essay), niah_single_3 (essay, UUID values), niah_multikey_1 (essay,
  num_needle_k=4), niah_multikey_2 (needle haystack), niah_multikey_3 (needle haystack, UUID keys
  and values), niah_multivalue (essay, num_needle_v=4).
* scripts/eval/synthetic/constants.py (xuuHuang/RULER @ fa17be2774a7): niah is scored with
  ``string_match_all``: the fraction of reference strings found, case-insensitive, in the output.

Deliberate differences from RULER:

* The "essay" haystack is not Paul Graham's essays (a download) but English prose that every
  machine with Python has: the prose paragraphs of Python's own documentation topics
  (``pydoc_data.topics``, the text ``help()`` shows), split at sentence boundaries (see
  `prose_sentences`). Each sample's haystack is a run of consecutive sentences starting at a
  sentence drawn from (task, seed, index), wrapping round at the end of the text; so samples read
  different prose and one seed always gives the same prompts with a given Python.
  `prose_source()` names the text and its hash; gates record it beside their samples.
* Keys come from a fixed in-module list of adjectives and nouns instead of wonderwords' lists;
  UUIDs are drawn from the sample's seeded generator (version-4 layout), not ``uuid.uuid4()``.
* Needle depth is not random: sample i of n sits at depth i/(n-1); for several needles the first
  (the queried key's needle, or the first value for multivalue) sits at that depth and the others
  at the evenly spaced depths (depth + k/m) mod 1.
* The length fit is a binary search over the number of haystack units (lines, sentences or
  needle lines) so that the whole prompt is within 2% of, and not above, ``context_tokens``
  (RULER steps by 25 units and budgets ``max_seq_length`` = prompt + 128 generated tokens;
  here the target counts the prompt only).
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

HAYSTACK_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

# RULER: needle = "One of the special magic {type_needle_v} for {key} is: {value}." formatted with
# the plural type_needle_v ("numbers", "uuids"), never singularised for the needle.
NEEDLE_TEMPLATE = "One of the special magic {type_needle_v} for {key} is: {value}."

# RULER scripts/data/synthetic/constants.py, TASKS['niah'] (quoted exactly).
RULER_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
RULER_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
TOKENS_TO_GENERATE = 128  # RULER TASKS['niah']['tokens_to_generate']; the caller generates these


@dataclass(frozen=True)
class TaskSpec:
    """One RULER niah task as scripts/synthetic.yaml configures it."""

    num_needle_k: int
    num_needle_v: int
    num_needle_q: int
    haystack: str        # "repeat" | "essay" (prose here) | "needle"
    type_needle_k: str   # "words" | "uuids"
    type_needle_v: str   # "numbers" | "uuids"


_TASK_SPECS: dict[str, TaskSpec] = {
    "niah_single_1": TaskSpec(1, 1, 1, "repeat", "words", "numbers"),
    "niah_single_2": TaskSpec(1, 1, 1, "essay", "words", "numbers"),
    "niah_single_3": TaskSpec(1, 1, 1, "essay", "words", "uuids"),
    "niah_multikey_1": TaskSpec(4, 1, 1, "essay", "words", "numbers"),
    "niah_multikey_2": TaskSpec(1, 1, 1, "needle", "words", "numbers"),
    "niah_multikey_3": TaskSpec(1, 1, 1, "needle", "uuids", "uuids"),
    "niah_multivalue": TaskSpec(1, 4, 1, "essay", "words", "numbers"),
}
TASKS: tuple[str, ...] = tuple(_TASK_SPECS)
PROSE_TASKS: tuple[str, ...] = tuple(t for t, spec in _TASK_SPECS.items() if spec.haystack != "repeat")

LENGTH_TOLERANCE = 0.02  # the prompt is within 2% of the target, never above it
FIT_SHIFTS = 64   # starts a prose or needle haystack may move by to meet the 2% window
PROSE_MAX_SENTENCE_CHARS = 400  # longer "sentences" are run-ons of lists; one would break the 2% fit

# Stand-ins for wonderwords' adjectivelist.txt / nounlist.txt: 100 adjectives x 100 nouns.
ADJECTIVES: tuple[str, ...] = (
    "abundant", "adorable", "agreeable", "alive", "ancient", "angry", "anxious", "aromatic", "awful",
    "bashful", "beautiful", "bewildered", "bitter", "black", "bloody", "blue", "boiling", "brave",
    "breezy", "brief", "bright", "broad", "broken", "bumpy", "calm", "careful", "chilly", "clean",
    "clever", "cloudy", "clumsy", "cold", "colossal", "cool", "crooked", "cuddly", "curly", "curved",
    "damp", "dazzling", "deep", "delightful", "dizzy", "dry", "dusty", "eager", "early", "elegant",
    "empty", "energetic", "faint", "fancy", "fierce", "flat", "fluffy", "fragile", "fresh", "friendly",
    "gentle", "giant", "gigantic", "glamorous", "gleaming", "glorious", "graceful", "greasy", "green",
    "grumpy", "handsome", "happy", "harsh", "heavy", "helpful", "hollow", "huge", "humble", "icy",
    "jolly", "juicy", "kind", "lazy", "little", "lively", "loud", "lucky", "magnificent", "melodic",
    "mighty", "misty", "modern", "narrow", "nervous", "noisy", "obedient", "odd", "old", "orange",
    "plain", "polite", "proud",
)
NOUNS: tuple[str, ...] = (
    "anchor", "apple", "arch", "armchair", "badge", "bakery", "balloon", "banana", "basket", "beach",
    "bicycle", "blanket", "bottle", "bracelet", "bridge", "brush", "bucket", "butter", "cabin",
    "camera", "candle", "canoe", "carpet", "castle", "chair", "cherry", "chimney", "circle", "cloud",
    "coconut", "compass", "cookie", "cottage", "crayon", "crown", "cupboard", "curtain", "desk",
    "diamond", "dolphin", "drum", "eagle", "engine", "feather", "fence", "fiddle", "flag", "forest",
    "fountain", "garden", "giraffe", "glacier", "guitar", "hammer", "harbor", "helmet", "hill",
    "island", "jacket", "kettle", "kitten", "ladder", "lantern", "lemon", "library", "lighthouse",
    "lizard", "meadow", "mirror", "mountain", "necklace", "notebook", "ocean", "orchard", "owl",
    "paddle", "painting", "parrot", "pencil", "pepper", "piano", "pillow", "planet", "pocket",
    "pumpkin", "puzzle", "rabbit", "river", "rocket", "saddle", "sandwich", "scarf", "shovel",
    "squirrel", "telescope", "tiger", "tomato", "tractor", "umbrella", "violin",
)


@dataclass(frozen=True)
class NiahSample:
    task: str            # one of TASKS
    index: int
    depth: float         # 0..1, where the queried needle sits in the haystack
    context_tokens: int  # target
    prompt: str          # full prompt for /completion: RULER template filled, ending in the answer prefix
    key: str
    values: tuple[str, ...]   # expected values
    distractor_keys: tuple[str, ...]
    distractor_values: tuple[str, ...] = ()  # values of the distractor needles (multikey), for diagnosis
    prompt_tokens: int = 0                    # count_tokens(prompt)
    haystack_lines: int = 0                   # haystack units in the context: lines, prose sentences or needle lines
    haystack: str = "repeat"                  # the task's haystack kind: "repeat", "essay" (prose) or "needle"


def task_spec(task: str) -> TaskSpec:
    try:
        return _TASK_SPECS[task]
    except KeyError:
        raise ValueError(f"unknown niah task {task!r}; expected one of {', '.join(TASKS)}") from None


def task_template(task: str) -> str:
    """RULER's template + answer prefix for `task`, with RULER's singular rewrite applied.

    Still has the ``{context}`` and ``{query}`` fields; ``{type_needle_v}`` is filled.
    """
    spec = task_spec(task)
    template = RULER_TEMPLATE + RULER_ANSWER_PREFIX
    type_needle_v = spec.type_needle_v
    if spec.num_needle_q * spec.num_needle_v == 1:  # exactly RULER niah.py's rewrite, applied before formatting
        template = template.replace("Some", "A")
        template = template.replace("are all", "is")
        template = template.replace("are", "is")
        template = template.replace("answers", "answer")
        type_needle_v = type_needle_v[:-1]  # remove "s"
    return template.replace("{type_needle_v}", type_needle_v)


def needle(key: str, value: str, type_needle_v: str = "numbers") -> str:
    return NEEDLE_TEMPLATE.format(type_needle_v=type_needle_v, key=key, value=value)


def sample_depth(index: int, n_samples: int) -> float:
    return 0.0 if n_samples <= 1 else index / (n_samples - 1)


@functools.lru_cache(maxsize=1)
def prose_sentences() -> tuple[str, ...]:
    """The prose of Python's documentation topics (``pydoc_data.topics``), as sentences.

    Topics in sorted order; of each topic the paragraphs that are running text (no indented line:
    grammar, code and tables are indented there) of at least 12 words; each paragraph's whitespace
    collapsed and split after a full stop, question or exclamation mark followed by a capital, a
    digit or a quote; a sentence kept when it ends in one of those marks (not in a colon that
    introduced a dropped code block) and is at most PROSE_MAX_SENTENCE_CHARS long.
    """
    from pydoc_data.topics import topics

    sentences: list[str] = []
    for name in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[name]):
            lines = block.splitlines()
            if not lines or any(ln.startswith((" ", "\t")) for ln in lines):
                continue
            paragraph = " ".join(block.split())
            if len(paragraph.split()) < 12:
                continue
            for sentence in re.split(r"(?<=[.!?])\s+(?=[\"'(*A-Z0-9])", paragraph):
                if sentence[-1:] in ".!?" and len(sentence) <= PROSE_MAX_SENTENCE_CHARS:
                    sentences.append(sentence)
    if len(sentences) < 100:
        raise RuntimeError(f"pydoc_data.topics gave only {len(sentences)} prose sentences")
    return tuple(sentences)


def prose_source() -> dict:
    """What the prose haystack is made of: its source, the Python that shipped it, its size and hash."""
    sentences = prose_sentences()
    text = "\n".join(sentences)
    return {"source": "pydoc_data.topics (prose paragraphs of Python's documentation topics)",
            "python": ".".join(map(str, sys.version_info[:3])), "sentences": len(sentences),
            "characters": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def generate(task: str, context_tokens: int, n_samples: int, seed: int,
             count_tokens: Callable[[str], int], calibration: bool = False) -> list[NiahSample]:
    """`n_samples` prompts for `task`, each `context_tokens` long (within 2%, never above) as
    measured by `count_tokens` (the model's tokenizer). Deterministic in its arguments; sample i's
    keys, values and prose depend only on (task, seed, i), so they are the same at every length.

    With `calibration`, the samples are drawn from a stream of their own (keys and values apart
    from the scored samples' of any count) and sit between the scored depths, at (i + 0.5) / n:
    prompts of the same kind for a method to calibrate on, never the questions it is scored on.

    Raises ValueError for an unknown task, a non-positive sample count, or a target that cannot be
    met: smaller than the template with its needles, or too small for one haystack unit's worth of
    tokens to fit in the 2% tolerance.
    """
    spec = task_spec(task)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if context_tokens < 1:
        raise ValueError(f"context_tokens must be >= 1, got {context_tokens}")
    template = task_template(task)
    samples: list[NiahSample] = []
    hint: int | None = None
    for index in range(n_samples):
        depth = (index + 0.5) / n_samples if calibration else sample_depth(index, n_samples)
        rng = _rng(task, seed, index, calibration)
        key, values, d_keys, d_values = _draw(rng, spec)
        # (depth, needle text): the queried needle (or first value) at the sample's depth first.
        texts = ([needle(key, v, spec.type_needle_v) for v in values]
                 + [needle(k, v, spec.type_needle_v) for k, v in zip(d_keys, d_values)])
        m = len(texts)
        placed = [((depth + j / m) % 1.0 if j else depth, t) for j, t in enumerate(texts)]
        units, join = _haystack(spec, rng, (key, *d_keys))
        # A stretch of prose or needle lines whose last unit overshoots the 2% window is started a
        # unit later (up to FIT_SHIFTS times): the haystack stays whole sentences.
        for shift in range(FIT_SHIFTS if spec.haystack != "repeat" else 1):
            def build(n: int, placed=placed, key=key, units=units, join=join, shift=shift) -> str:
                return template.format(context=_context(units(shift + n)[shift:], placed, join), query=key)

            try:
                n_units, prompt, tokens = _fit(build, context_tokens, count_tokens, hint, task, units(8))
                break
            except _ShortFit:
                if shift == FIT_SHIFTS - 1 or spec.haystack == "repeat":
                    raise
        hint = n_units
        samples.append(NiahSample(
            task=task, index=index, depth=depth, context_tokens=context_tokens, prompt=prompt,
            key=key, values=tuple(values), distractor_keys=tuple(d_keys),
            distractor_values=tuple(d_values), prompt_tokens=tokens, haystack_lines=n_units,
            haystack=spec.haystack))
    return samples


def score(sample: NiahSample, output: str) -> float:
    """RULER's string_match_all for one sample: fraction of expected values found in `output`,
    case-insensitively (substring match)."""
    if not sample.values:
        raise ValueError("sample has no expected values")
    out = output.lower()
    return sum(1.0 for v in sample.values if v.lower() in out) / len(sample.values)


# --- internals -------------------------------------------------------------------------------

def _rng(task: str, seed: int, index: int, calibration: bool) -> random.Random:
    stream = "calibration/" if calibration else ""
    return random.Random(f"llama_sparse.gates.niah/{stream}{task}/{seed}/{index}")


def _uuid(rng: random.Random) -> str:
    """A version-4 UUID from `rng` (RULER's uuid.uuid4(), made deterministic)."""
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:]}"


def _word_key(pick: int) -> str:
    return f"{ADJECTIVES[pick // len(NOUNS)]}-{NOUNS[pick % len(NOUNS)]}"


def _draw(rng: random.Random, spec: TaskSpec) -> tuple[str, list[str], list[str], list[str]]:
    """Keys (distinct) and values (distinct) for one sample."""
    num_k, num_v = spec.num_needle_k, spec.num_needle_v
    if spec.type_needle_k == "words":
        keys = [_word_key(p) for p in rng.sample(range(len(ADJECTIVES) * len(NOUNS)), num_k)]
    else:
        keys = [_uuid(rng) for _ in range(num_k)]
    seen: set[str] = set()
    values: list[str] = []
    while len(values) < num_k * num_v:
        if spec.type_needle_v == "numbers":
            v = str(rng.randint(10**6, 10**7 - 1))  # RULER generate_random_number(num_digits=7)
        else:
            v = _uuid(rng)
        if v not in seen:
            seen.add(v)
            values.append(v)
    key, d_keys = keys[0], keys[1:]
    return key, values[:num_v], d_keys, values[num_v:]


def _haystack(spec: TaskSpec, rng: random.Random,
              keys: Sequence[str]) -> tuple[Callable[[int], list[str]], str]:
    """The sample's haystack as (units(n): its first n units, the string that joins them)."""
    if spec.haystack == "repeat":
        return (lambda n: [HAYSTACK_SENTENCE] * n), "\n"
    if spec.haystack == "essay":
        sentences = prose_sentences()
        start = rng.randrange(len(sentences))
        return (lambda n: [sentences[(start + i) % len(sentences)] for i in range(n)]), " "
    # "needle": every line a needle of another key with its own value (RULER's multikey_2/_3)
    lines: list[str] = []
    taken = set(keys)
    hay_rng = random.Random(rng.getrandbits(64))
    n_word_keys = len(ADJECTIVES) * len(NOUNS)

    def units(n: int) -> list[str]:
        while len(lines) < n:
            if spec.type_needle_k == "words":
                if len(taken) >= n_word_keys:
                    raise ValueError(f"niah_multikey needle haystack: more than {n_word_keys - len(keys)} "
                                     "lines asked for, and there are no more distinct word keys")
                k = _word_key(hay_rng.randrange(n_word_keys))
            else:
                k = _uuid(hay_rng)
            if k in taken:
                continue
            taken.add(k)
            v = str(hay_rng.randint(10**6, 10**7 - 1)) if spec.type_needle_v == "numbers" else _uuid(hay_rng)
            lines.append(needle(k, v, spec.type_needle_v))
        return lines[:n]

    return units, "\n"


def _context(units: list[str], placed: list[tuple[float, str]], join: str) -> str:
    """The haystack units with each needle inserted as its own unit at its depth."""
    n = len(units)
    at = sorted(((round(d * n), -j, t) for j, (d, t) in enumerate(placed)), reverse=True)
    for pos, _, text in at:  # highest position first, as RULER does, so lower ones stay valid
        units.insert(pos, text)
    return join.join(units)


class _ShortFit(ValueError):
    """No unit count lands the prompt within the 2% window (one unit overshoots it)."""


def _fit(build: Callable[[int], str], target: int, count_tokens: Callable[[str], int],
         hint: int | None, task: str, probe_units: list[str]) -> tuple[int, str, int]:
    """The largest haystack unit count whose prompt is <= target tokens; checked to be >= 98%.
    `probe_units` (a few of the haystack's first units) give the first estimate of tokens per unit."""
    cache: dict[int, tuple[int, str]] = {}

    def tok(n: int) -> int:
        if n not in cache:
            prompt = build(n)
            cache[n] = (int(count_tokens(prompt)), prompt)
        return cache[n][0]

    base = tok(0)
    if base > target:
        raise ValueError(
            f"{task}: target of {target} tokens is smaller than the prompt without haystack "
            f"({base} tokens)")
    limit = 4 * target + 16  # each unit adds at least a token with any sane tokenizer
    if hint is None:  # first sample: estimate lines from one probe (secant through n=0)
        per_unit = int(count_tokens("\n".join(probe_units) + "\n")) / max(1, len(probe_units))
        probe = max(1, int((target - base) / max(1.0, per_unit)))
        grown = tok(probe) - base
        hint = max(1, (target - base) * probe // grown) if grown > 0 else probe
        step = max(1, hint // 512)
    else:
        step = 1
    hint = min(hint, limit)
    # Bracket: lo fits (<= target), hi does not.
    if tok(hint) <= target:
        lo, hi = hint, None
        while hi is None:
            n = lo + step
            if n > limit:
                raise ValueError(f"{task}: count_tokens does not grow with the haystack")
            if tok(n) <= target:
                lo, step = n, step * 2
            else:
                hi = n
    else:
        lo, hi = None, hint
        while lo is None:
            n = max(0, hi - step)
            if tok(n) <= target:
                lo = n
            else:
                hi, step = n, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tok(mid) <= target:
            lo = mid
        else:
            hi = mid
    tokens, prompt = cache[lo]
    if tokens < (1.0 - LENGTH_TOLERANCE) * target:
        raise _ShortFit(
            f"{task}: cannot meet {target} tokens within {LENGTH_TOLERANCE:.0%}: {lo} haystack units "
            f"give {tokens} tokens, {lo + 1} give {tok(lo + 1)} (target too small for one unit's "
            f"granularity)")
    return lo, prompt, tokens
