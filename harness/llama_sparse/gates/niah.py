"""RULER needle-in-a-haystack prompts and scoring: niah_single_1, niah_multikey_1, niah_multivalue.

Follows RULER's `niah` task (Hsieh et al., NVIDIA, 2024). The wording is quoted from the RULER
sources (Apache-2.0, "Copyright (c) 2024, NVIDIA CORPORATION"):

* scripts/data/synthetic/niah.py (hsiehjackson/RULER @ 56f7e8ee275ed5a9ac6fcf403d2dec8ef2b6ab4b,
  the RULER author's repository; same text in xuuHuang/RULER @ fa17be2774a7): the needle
  ``"One of the special magic {type_needle_v} for {key} is: {value}."``, the "repeat" haystack
  ``"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."``
  (``sentences = [haystack] * num_haystack``, needles inserted between them,
  ``context = "\\n".join(sentences)``), 7-digit values (``random.randint(10**6, 10**7 - 1)``),
  "adjective-noun" keys from wonderwords, and the singular rewrite of the template when
  ``num_needle_q * num_needle_v == 1`` (Some->A, "are all"->is, are->is, answers->answer,
  "numbers"->"number").
* scripts/data/synthetic/constants.py (FerrisChi/RULER @ 08b17256fafe2d447311954949a2d6556ebabcc8,
  xuuHuang/RULER @ fa17be2774a7): ``TASKS['niah']['template']`` and ``['answer_prefix']``, which
  scripts/data/prepare.py joins as ``model_template.format(task_template=template) +
  answer_prefix``; with the ``base`` model template ("{task_template}", scripts/data/template.py)
  that is the raw prompt, no chat template.
* scripts/synthetic.yaml (FerrisChi/RULER @ 08b17256): niah_single_1 (num_needle_k=1, v=1, q=1),
  niah_multikey_1 (num_needle_k=4), niah_multivalue (num_needle_v=4).
* scripts/eval/synthetic/constants.py (xuuHuang/RULER @ fa17be2774a7): niah is scored with
  ``string_match_all``: the fraction of reference strings found, case-insensitive, in the output.

Deliberate differences from RULER, all asked for by our issue:

* Upstream niah_multikey_1 and niah_multivalue use the Paul Graham "essay" haystack; here all three
  tasks use the "repeat" haystack (no essay corpus, no network).
* Keys come from a fixed in-module list of adjectives and nouns instead of wonderwords' lists.
* Needle depth is not random: sample i of n sits at depth i/(n-1); for several needles the first
  (the queried key's needle, or the first value for multivalue) sits at that depth and the others
  at the evenly spaced depths (depth + k/m) mod 1.
* The length fit is a binary search over the number of haystack lines so that the whole prompt is
  within 2% of, and not above, ``context_tokens`` (RULER steps by 25 lines and budgets
  ``max_seq_length`` = prompt + 128 generated tokens; here the target counts the prompt only).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

HAYSTACK_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

# RULER: needle = "One of the special magic {type_needle_v} for {key} is: {value}." formatted with
# type_needle_v=args.type_needle_v ("numbers", never singularised for the needle).
NEEDLE_TEMPLATE = "One of the special magic numbers for {key} is: {value}."

# RULER scripts/data/synthetic/constants.py, TASKS['niah'] (quoted exactly).
RULER_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
RULER_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
RULER_TYPE_NEEDLE_V = "numbers"
TOKENS_TO_GENERATE = 128  # RULER TASKS['niah']['tokens_to_generate']; the caller generates these

# task -> (num_needle_k, num_needle_v, num_needle_q), from RULER scripts/synthetic.yaml.
_TASK_SPECS: dict[str, tuple[int, int, int]] = {
    "niah_single_1": (1, 1, 1),
    "niah_multikey_1": (4, 1, 1),
    "niah_multivalue": (1, 4, 1),
}
TASKS: tuple[str, ...] = tuple(_TASK_SPECS)

LENGTH_TOLERANCE = 0.02  # the prompt is within 2% of the target, never above it

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
    task: str            # "niah_single_1" | "niah_multikey_1" | "niah_multivalue"
    index: int
    depth: float         # 0..1, where the queried needle sits in the haystack
    context_tokens: int  # target
    prompt: str          # full prompt for /completion: RULER template filled, ending in the answer prefix
    key: str
    values: tuple[str, ...]   # expected values
    distractor_keys: tuple[str, ...]
    distractor_values: tuple[str, ...] = ()  # values of the distractor needles (multikey), for diagnosis
    prompt_tokens: int = 0                    # count_tokens(prompt)
    haystack_lines: int = 0                   # number of HAYSTACK_SENTENCE lines in the context


def task_template(task: str) -> str:
    """RULER's template + answer prefix for `task`, with RULER's singular rewrite applied.

    Still has the ``{context}`` and ``{query}`` fields; ``{type_needle_v}`` is filled.
    """
    num_k, num_v, num_q = _spec(task)
    template = RULER_TEMPLATE + RULER_ANSWER_PREFIX
    type_needle_v = RULER_TYPE_NEEDLE_V
    if num_q * num_v == 1:  # exactly RULER niah.py's rewrite, applied before formatting
        template = template.replace("Some", "A")
        template = template.replace("are all", "is")
        template = template.replace("are", "is")
        template = template.replace("answers", "answer")
        type_needle_v = type_needle_v[:-1]  # remove "s"
    return template.replace("{type_needle_v}", type_needle_v)


def needle(key: str, value: str) -> str:
    return NEEDLE_TEMPLATE.format(key=key, value=value)


def sample_depth(index: int, n_samples: int) -> float:
    return 0.0 if n_samples <= 1 else index / (n_samples - 1)


def generate(task: str, context_tokens: int, n_samples: int, seed: int,
             count_tokens: Callable[[str], int], calibration: bool = False) -> list[NiahSample]:
    """`n_samples` prompts for `task`, each `context_tokens` long (within 2%, never above) as
    measured by `count_tokens` (the model's tokenizer). Deterministic in its arguments; sample i's
    keys and values depend only on (task, seed, i), so they are the same at every length.

    With `calibration`, the samples are drawn from a stream of their own (keys and values apart
    from the scored samples' of any count) and sit between the scored depths, at (i + 0.5) / n:
    prompts of the same kind for a method to calibrate on, never the questions it is scored on.

    Raises ValueError for an unknown task, a non-positive sample count, or a target that cannot be
    met: smaller than the template with its needles, or too small for one haystack line's worth of
    tokens to fit in the 2% tolerance.
    """
    num_k, num_v, _ = _spec(task)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if context_tokens < 1:
        raise ValueError(f"context_tokens must be >= 1, got {context_tokens}")
    template = task_template(task)
    samples: list[NiahSample] = []
    hint: int | None = None
    for index in range(n_samples):
        depth = (index + 0.5) / n_samples if calibration else sample_depth(index, n_samples)
        key, values, d_keys, d_values = _draw(task, seed, index, num_k, num_v, calibration)
        # (depth, needle text): the queried needle (or first value) at the sample's depth first.
        texts = [needle(key, v) for v in values] + [needle(k, v) for k, v in zip(d_keys, d_values)]
        m = len(texts)
        placed = [((depth + j / m) % 1.0 if j else depth, t) for j, t in enumerate(texts)]

        def build(n_lines: int, placed=placed, key=key) -> str:
            return template.format(context=_context(n_lines, placed), query=key)

        n_lines, prompt, tokens = _fit(build, context_tokens, count_tokens, hint, task)
        hint = n_lines
        samples.append(NiahSample(
            task=task, index=index, depth=depth, context_tokens=context_tokens, prompt=prompt,
            key=key, values=tuple(values), distractor_keys=tuple(d_keys),
            distractor_values=tuple(d_values), prompt_tokens=tokens, haystack_lines=n_lines))
    return samples


def score(sample: NiahSample, output: str) -> float:
    """RULER's string_match_all for one sample: fraction of expected values found in `output`,
    case-insensitively (substring match)."""
    if not sample.values:
        raise ValueError("sample has no expected values")
    out = output.lower()
    return sum(1.0 for v in sample.values if v.lower() in out) / len(sample.values)


# --- internals -------------------------------------------------------------------------------

def _spec(task: str) -> tuple[int, int, int]:
    try:
        return _TASK_SPECS[task]
    except KeyError:
        raise ValueError(f"unknown niah task {task!r}; expected one of {', '.join(TASKS)}") from None


def _draw(task: str, seed: int, index: int, num_k: int, num_v: int,
          calibration: bool = False) -> tuple[str, list[str], list[str], list[str]]:
    """Keys (distinct) and 7-digit values (distinct) for one sample."""
    stream = "calibration/" if calibration else ""
    rng = random.Random(f"llama_sparse.gates.niah/{stream}{task}/{seed}/{index}")
    picks = rng.sample(range(len(ADJECTIVES) * len(NOUNS)), num_k)
    keys = [f"{ADJECTIVES[p // len(NOUNS)]}-{NOUNS[p % len(NOUNS)]}" for p in picks]
    seen: set[str] = set()
    values: list[str] = []
    while len(values) < num_k * num_v:
        v = str(rng.randint(10**6, 10**7 - 1))  # RULER generate_random_number(num_digits=7)
        if v not in seen:
            seen.add(v)
            values.append(v)
    key, d_keys = keys[0], keys[1:]
    return key, values[:num_v], d_keys, values[num_v:]


def _context(n_lines: int, placed: list[tuple[float, str]]) -> str:
    """`n_lines` haystack lines with each needle inserted as its own line at its depth."""
    sentences = [HAYSTACK_SENTENCE] * n_lines
    at = sorted(((round(d * n_lines), -j, t) for j, (d, t) in enumerate(placed)), reverse=True)
    for pos, _, text in at:  # highest position first, as RULER does, so lower ones stay valid
        sentences.insert(pos, text)
    return "\n".join(sentences)


def _fit(build: Callable[[int], str], target: int, count_tokens: Callable[[str], int],
         hint: int | None, task: str) -> tuple[int, str, int]:
    """The largest haystack line count whose prompt is <= target tokens; checked to be >= 98%."""
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
    limit = 4 * target + 16  # each line adds at least a token with any sane tokenizer
    if hint is None:  # first sample: estimate lines from one probe (secant through n=0)
        probe = max(1, (target - base) // max(1, int(count_tokens(HAYSTACK_SENTENCE + "\n"))))
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
        raise ValueError(
            f"{task}: cannot meet {target} tokens within {LENGTH_TOLERANCE:.0%}: {lo} haystack lines "
            f"give {tokens} tokens, {lo + 1} give {tok(lo + 1)} (target too small for one line's "
            f"granularity)")
    return lo, prompt, tokens
