"""RULER needle-in-a-haystack generator and scorer (llama_sparse.gates.niah); no server needed.

The expected strings below are written out by hand from RULER's sources (scripts/data/synthetic/
niah.py, constants.py, synthetic.yaml; see the module docstring), not derived from the module.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from llama_sparse.gates import niah
from llama_sparse.gates.niah import HAYSTACK_SENTENCE, NEEDLE_TEMPLATE, TASKS, NiahSample, generate, score

RULER_HAYSTACK = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

# RULER's niah template + answer prefix after its singular rewrite (num_needle_q * num_needle_v == 1).
SINGLE_INTRO = ("A special magic number is hidden within the following text. Make sure to memorize it. "
                "I will quiz you about the number afterwards.\n")
SINGLE_QUESTION = "\nWhat is the special magic number for {key} mentioned in the provided text?"
SINGLE_PREFIX = " The special magic number for {key} mentioned in the provided text is"
# ... and as written (plural) for niah_multivalue (num_needle_v = 4).
MULTI_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the numbers afterwards.\n")
MULTI_QUESTION = "\nWhat are all the special magic numbers for {key} mentioned in the provided text?"
MULTI_PREFIX = " The special magic numbers for {key} mentioned in the provided text are"

NEEDLE_RE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
UUID_NEEDLE_RE = re.compile(rf"One of the special magic uuids for ({UUID}) is: ({UUID})\.")

# RULER scripts/synthetic.yaml: the haystack each task uses ("essay" is prose here).
RULER_HAYSTACKS = {"niah_single_1": "repeat", "niah_single_2": "essay", "niah_single_3": "essay",
                   "niah_multikey_1": "essay", "niah_multikey_2": "needle", "niah_multikey_3": "needle",
                   "niah_multivalue": "essay"}
SINGLE_NUMBER_WORD_TASKS = ["niah_single_1", "niah_single_2", "niah_multikey_1", "niah_multikey_2"]


def words(text: str) -> int:
    return len(text.split())


def quarter_chars(text: str) -> int:
    return len(text) // 4


class CountingCounter:
    def __init__(self, fn=quarter_chars) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        return self.fn(text)


def the_needle(sample: NiahSample, value: str | None = None) -> str:
    kind = "uuids" if sample.task in ("niah_single_3", "niah_multikey_3") else "numbers"
    return f"One of the special magic {kind} for {sample.key} is: {value or sample.values[0]}."


def context_of(sample: NiahSample) -> str:
    kind = "uuid" if sample.task in ("niah_single_3", "niah_multikey_3") else "number"
    intro = MULTI_INTRO if sample.task == "niah_multivalue" else SINGLE_INTRO.replace("number", kind)
    question = (MULTI_QUESTION if sample.task == "niah_multivalue"
                else SINGLE_QUESTION.replace("number", kind)).format(key=sample.key)
    assert sample.prompt.startswith(intro)
    end = sample.prompt.rindex(question)
    return sample.prompt[len(intro):end]


def context_lines(sample: NiahSample) -> list[str]:
    return context_of(sample).split("\n")


def test_constants_are_rulers_strings() -> None:
    assert HAYSTACK_SENTENCE == RULER_HAYSTACK
    assert NEEDLE_TEMPLATE == "One of the special magic {type_needle_v} for {key} is: {value}."
    assert set(TASKS) == set(RULER_HAYSTACKS)
    for task, haystack in RULER_HAYSTACKS.items():
        assert generate(task, 3000, 1, seed=0, count_tokens=words)[0].haystack == haystack


@pytest.mark.parametrize("task", SINGLE_NUMBER_WORD_TASKS)
def test_single_value_prompt_is_rulers_template(task: str) -> None:
    for s in generate(task, 2000, 3, seed=7, count_tokens=words):
        intro_end = len(SINGLE_INTRO)
        assert s.prompt.startswith(SINGLE_INTRO)
        tail = SINGLE_QUESTION.format(key=s.key) + SINGLE_PREFIX.format(key=s.key)
        assert s.prompt.endswith(tail), s.prompt[-300:]  # ends in the answer prefix, no chat template
        assert intro_end < len(s.prompt) - len(tail)
        assert the_needle(s) in s.prompt
        template = s.prompt.replace(context_of(s), "")
        assert "Some special" not in template and "numbers are" not in template


def test_multivalue_prompt_is_rulers_plural_template() -> None:
    for s in generate("niah_multivalue", 2000, 3, seed=7, count_tokens=words):
        assert s.prompt.startswith(MULTI_INTRO)
        assert s.prompt.endswith(MULTI_QUESTION.format(key=s.key) + MULTI_PREFIX.format(key=s.key))
        assert len(s.values) == 4 and len(set(s.values)) == 4
        for v in s.values:
            assert f"One of the special magic numbers for {s.key} is: {v}." in s.prompt
        assert not s.distractor_keys


def test_uuid_prompts_are_rulers_singular_uuid_template() -> None:
    for task in ("niah_single_3", "niah_multikey_3"):
        for s in generate(task, 2000, 3, seed=7, count_tokens=words):
            intro = SINGLE_INTRO.replace("number", "uuid")
            assert s.prompt.startswith(intro)
            tail = (SINGLE_QUESTION + SINGLE_PREFIX).replace("number", "uuid").format(key=s.key)
            assert s.prompt.endswith(tail), s.prompt[-300:]
            assert re.fullmatch(UUID, s.values[0])
            assert the_needle(s) in s.prompt
            assert bool(re.fullmatch(UUID, s.key)) == (task == "niah_multikey_3")


def test_repeat_context_is_haystack_lines_plus_needle_line() -> None:
    s = generate("niah_single_1", 3000, 2, seed=1, count_tokens=words)[1]
    lines = context_lines(s)
    needles = [ln for ln in lines if ln != RULER_HAYSTACK]
    haystack = [ln for ln in lines if ln == RULER_HAYSTACK]
    assert len(needles) == 1
    assert all(NEEDLE_RE.fullmatch(ln) for ln in needles), needles
    assert len(haystack) == s.haystack_lines > 100


@pytest.mark.parametrize("task", ["niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue"])
def test_prose_context_is_consecutive_documentation_sentences_plus_needles(task: str) -> None:
    """The essay haystack is prose from Python's documentation topics: every sentence of the context
    but the needles is a sentence of pydoc_data.topics, in the order of the text (wrapping round)."""
    from pydoc_data.topics import topics

    corpus = niah.prose_sentences()
    flat = " ".join(" ".join(t.split()) for t in topics.values())
    for s in generate(task, 3000, 3, seed=1, count_tokens=words):
        context = context_of(s)
        needles = re.findall(r"One of the special magic \w+ for \S+ is: \S+\.", context)
        assert len(needles) == (1 if task.startswith("niah_single") else 4)
        assert the_needle(s) in needles
        for n in needles:
            context = context.replace(" " + n, "").replace(n + " ", "")
        assert "special magic" not in context
        starts = [i for i, x in enumerate(corpus) if context.startswith(x + " ")]
        runs = [[corpus[(i + j) % len(corpus)] for j in range(s.haystack_lines)] for i in starts]
        expected = next((run for run in runs if context == " ".join(run)), None)
        assert expected is not None, context[:300]
        assert s.haystack_lines > 50
        for sentence in expected[:20]:  # the sentences are the documentation's own words
            assert sentence in flat
        assert "The grass is green" not in context


@pytest.mark.parametrize("task", ["niah_multikey_2", "niah_multikey_3"])
def test_needle_haystack_is_needles_of_other_keys(task: str) -> None:
    needle_re = NEEDLE_RE if task == "niah_multikey_2" else UUID_NEEDLE_RE
    for s in generate(task, 3000, 2, seed=1, count_tokens=words):
        lines = context_lines(s)
        found = [needle_re.fullmatch(ln) for ln in lines]
        assert all(found), [ln for ln, m in zip(lines, found) if not m][:3]
        keys = [m.group(1) for m in found]
        assert len(keys) == len(set(keys)) == s.haystack_lines + 1  # distinct keys, the real one once
        assert dict(m.groups() for m in found)[s.key] == s.values[0]


def test_prose_source_is_named_and_hashed() -> None:
    src = niah.prose_source()
    assert src["source"].startswith("pydoc_data.topics")
    assert src["sentences"] == len(niah.prose_sentences()) > 1000
    assert re.fullmatch(r"[0-9a-f]{64}", src["sha256"])
    assert all(len(x) <= niah.PROSE_MAX_SENTENCE_CHARS and x[-1] in ".!?" for x in niah.prose_sentences())


@pytest.mark.parametrize("task", niah.PROSE_TASKS)
def test_prose_tasks_are_deterministic_per_seed_and_vary_across_samples(task: str) -> None:
    a = generate(task, 3000, 4, seed=9, count_tokens=words)
    assert a == generate(task, 3000, 4, seed=9, count_tokens=words)
    other = generate(task, 3000, 4, seed=10, count_tokens=words)
    assert [s.prompt for s in a] != [s.prompt for s in other]
    bodies = {context_of(s).replace(the_needle(s), "")[:200] for s in a}
    assert len(bodies) == len(a)  # each sample reads its own stretch of prose or its own needle lines


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("counter", [words, quarter_chars])
@pytest.mark.parametrize("target", [1500, 8000, 32768])
def test_length_within_two_percent_and_not_above(task: str, counter, target: int) -> None:
    for s in generate(task, target, 4, seed=3, count_tokens=counter):
        n = counter(s.prompt)
        assert n == s.prompt_tokens
        assert 0.98 * target <= n <= target, (n, target)
        assert s.context_tokens == target


@pytest.mark.parametrize("task", TASKS)
def test_count_tokens_called_few_times(task: str) -> None:
    first = CountingCounter()
    generate(task, 131072, 1, seed=0, count_tokens=first)
    assert 2 <= first.calls <= 25
    many = CountingCounter(words)
    generate(task, 65536, 10, seed=0, count_tokens=many)
    assert many.calls <= 25 * 10


@pytest.mark.parametrize("task", TASKS)
def test_needle_sits_at_sample_depth(task: str) -> None:
    n = 11
    samples = generate(task, 16000, n, seed=5, count_tokens=quarter_chars)
    assert [s.depth for s in samples] == pytest.approx([i / (n - 1) for i in range(n)])
    for s in samples:
        pos = s.prompt.index(the_needle(s))
        assert abs(pos / len(s.prompt) - s.depth) <= 0.05, (s.index, pos / len(s.prompt), s.depth)
    # the extremes: the needle right after the intro, and right before the question
    assert context_of(samples[0]).startswith(the_needle(samples[0]))
    assert context_of(samples[-1]).endswith(the_needle(samples[-1]))


def test_single_sample_depth_is_zero() -> None:
    (s,) = generate("niah_single_1", 2000, 1, seed=0, count_tokens=words)
    assert s.depth == 0.0


def test_multikey_has_three_distractors_elsewhere() -> None:
    for s in generate("niah_multikey_1", 16000, 5, seed=11, count_tokens=quarter_chars):
        assert len(s.values) == 1
        assert len(s.distractor_keys) == 3 and len(s.distractor_values) == 3
        assert len({s.key, *s.distractor_keys}) == 4  # keys unique within the sample
        assert len({*s.values, *s.distractor_values}) == 4  # and so are the values
        found = dict(NEEDLE_RE.findall(s.prompt))
        assert found == {s.key: s.values[0], **dict(zip(s.distractor_keys, s.distractor_values))}
        real = s.prompt.index(f"for {s.key} is:")
        for k in s.distractor_keys:  # distractors at other depths, at least a fifth of the prompt away
            assert abs(s.prompt.index(f"for {k} is:") - real) > 0.2 * len(s.prompt)
        # the question asks for the real key only
        def mentions(k: str) -> int:
            return len(re.findall(rf"(?<![a-z-]){re.escape(k)}(?![a-z-])", s.prompt))
        assert mentions(s.key) == 3 and all(mentions(k) == 1 for k in s.distractor_keys)


@pytest.mark.parametrize("task", TASKS)
def test_keys_and_values_shape(task: str) -> None:
    for s in generate(task, 4000, 20, seed=2, count_tokens=words):
        for k in (s.key, *s.distractor_keys):
            if task == "niah_multikey_3":
                assert re.fullmatch(UUID, k)
                continue
            adj, noun = k.split("-")
            assert adj in niah.ADJECTIVES and noun in niah.NOUNS
        for v in (*s.values, *s.distractor_values):
            if task in ("niah_single_3", "niah_multikey_3"):
                assert re.fullmatch(UUID, v)
            else:
                assert len(v) == 7 and 1_000_000 <= int(v) <= 9_999_999


def test_deterministic_and_seeded() -> None:
    a = generate("niah_multikey_1", 4000, 6, seed=42, count_tokens=words)
    b = generate("niah_multikey_1", 4000, 6, seed=42, count_tokens=words)
    c = generate("niah_multikey_1", 4000, 6, seed=43, count_tokens=words)
    assert a == b
    assert [s.prompt for s in a] == [s.prompt for s in b]
    assert [s.key for s in a] != [s.key for s in c]
    assert len({s.key for s in a}) > 1  # different samples get different keys


def test_score_single() -> None:
    s = generate("niah_single_1", 1500, 1, seed=0, count_tokens=words)[0]
    s = dataclasses.replace(s, values=("AbC1234",))
    assert score(s, " abc1234.") == 1.0  # case-insensitive
    assert score(s, "The special magic number is ABC1234") == 1.0
    real = generate("niah_single_1", 1500, 1, seed=0, count_tokens=words)[0]
    assert score(real, f" {real.values[0]}.\n") == 1.0
    wrong = str(int(real.values[0]) % 9_000_000 + 1_000_001)
    assert wrong != real.values[0]
    assert score(real, f" {wrong}.") == 0.0
    assert score(real, "") == 0.0


def test_score_multivalue_fraction() -> None:
    s = generate("niah_multivalue", 1500, 1, seed=0, count_tokens=words)[0]
    v = s.values
    assert score(s, ", ".join(v)) == 1.0
    assert score(s, f"{v[0]} and {v[2]}") == 0.5
    assert score(s, v[3]) == 0.25
    assert score(s, "none") == 0.0


def test_multikey_distractor_answer_scores_zero() -> None:
    s = generate("niah_multikey_1", 1500, 1, seed=0, count_tokens=words)[0]
    assert score(s, s.distractor_values[0]) == 0.0


def test_unmeetable_targets_raise() -> None:
    with pytest.raises(ValueError, match="smaller than the prompt"):
        generate("niah_single_1", 20, 1, seed=0, count_tokens=words)
    with pytest.raises(ValueError, match="within 2%"):  # 18-word lines cannot land within 2% of 300
        generate("niah_single_1", 300, 3, seed=0, count_tokens=words)
    with pytest.raises(ValueError, match="unknown niah task"):
        generate("niah_single_4", 4000, 1, seed=0, count_tokens=words)
    with pytest.raises(ValueError):
        generate("niah_single_1", 4000, 0, seed=0, count_tokens=words)


@pytest.mark.parametrize("task", TASKS)
def test_calibration_samples_are_other_questions_between_the_scored_depths(task: str) -> None:
    n = 8
    scored = generate(task, 4000, n, seed=42, count_tokens=words)
    calib = generate(task, 4000, n, seed=42, count_tokens=words, calibration=True)
    assert [s.depth for s in calib] == pytest.approx([(i + 0.5) / n for i in range(n)])
    assert not {s.depth for s in calib} & {s.depth for s in scored}
    # a method calibrating on these never saw a scored question's key or value
    assert not {s.key for s in calib} & {k for s in scored for k in (s.key, *s.distractor_keys)}
    assert not {v for s in calib for v in s.values} & {v for s in scored for v in (*s.values, *s.distractor_values)}
    assert calib == generate(task, 4000, n, seed=42, count_tokens=words, calibration=True)
    (one,) = generate(task, 4000, 1, seed=42, count_tokens=words, calibration=True)
    assert one.depth == 0.5
