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


def context_lines(sample: NiahSample) -> list[str]:
    intro = MULTI_INTRO if sample.task == "niah_multivalue" else SINGLE_INTRO
    question = (MULTI_QUESTION if sample.task == "niah_multivalue" else SINGLE_QUESTION).format(key=sample.key)
    assert sample.prompt.startswith(intro)
    end = sample.prompt.rindex(question)
    return sample.prompt[len(intro):end].split("\n")


def test_constants_are_rulers_strings() -> None:
    assert HAYSTACK_SENTENCE == RULER_HAYSTACK
    assert NEEDLE_TEMPLATE == "One of the special magic numbers for {key} is: {value}."
    assert TASKS == ("niah_single_1", "niah_multikey_1", "niah_multivalue")


@pytest.mark.parametrize("task", ["niah_single_1", "niah_multikey_1"])
def test_single_value_prompt_is_rulers_template(task: str) -> None:
    for s in generate(task, 2000, 3, seed=7, count_tokens=words):
        intro_end = len(SINGLE_INTRO)
        assert s.prompt.startswith(SINGLE_INTRO)
        tail = SINGLE_QUESTION.format(key=s.key) + SINGLE_PREFIX.format(key=s.key)
        assert s.prompt.endswith(tail), s.prompt[-300:]  # ends in the answer prefix, no chat template
        assert intro_end < len(s.prompt) - len(tail)
        assert NEEDLE_TEMPLATE.format(key=s.key, value=s.values[0]) in s.prompt
        assert "Some special" not in s.prompt and "numbers are" not in s.prompt


def test_multivalue_prompt_is_rulers_plural_template() -> None:
    for s in generate("niah_multivalue", 2000, 3, seed=7, count_tokens=words):
        assert s.prompt.startswith(MULTI_INTRO)
        assert s.prompt.endswith(MULTI_QUESTION.format(key=s.key) + MULTI_PREFIX.format(key=s.key))
        assert len(s.values) == 4 and len(set(s.values)) == 4
        for v in s.values:
            assert f"One of the special magic numbers for {s.key} is: {v}." in s.prompt
        assert not s.distractor_keys


@pytest.mark.parametrize("task", TASKS)
def test_context_is_haystack_lines_plus_needle_lines(task: str) -> None:
    s = generate(task, 3000, 2, seed=1, count_tokens=words)[1]
    lines = context_lines(s)
    needles = [ln for ln in lines if ln != RULER_HAYSTACK]
    haystack = [ln for ln in lines if ln == RULER_HAYSTACK]
    assert len(needles) == 4 if task != "niah_single_1" else len(needles) == 1
    assert all(NEEDLE_RE.fullmatch(ln) for ln in needles), needles
    assert len(haystack) == s.haystack_lines > 100


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
        pos = s.prompt.index(NEEDLE_TEMPLATE.format(key=s.key, value=s.values[0]))
        assert abs(pos / len(s.prompt) - s.depth) <= 0.05, (s.index, pos / len(s.prompt), s.depth)
    # the extremes: first needle line right after the intro, last one right before the question
    assert context_lines(samples[0])[0] == NEEDLE_TEMPLATE.format(key=samples[0].key, value=samples[0].values[0])
    assert context_lines(samples[-1])[-1] == NEEDLE_TEMPLATE.format(key=samples[-1].key,
                                                                    value=samples[-1].values[0])


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
            adj, noun = k.split("-")
            assert adj in niah.ADJECTIVES and noun in niah.NOUNS
        for v in (*s.values, *s.distractor_values):
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
    with pytest.raises(ValueError, match="within 2%"):  # 19-word lines cannot land within 2% of 600
        generate("niah_multikey_1", 600, 3, seed=0, count_tokens=words)
    with pytest.raises(ValueError, match="unknown niah task"):
        generate("niah_single_2", 4000, 1, seed=0, count_tokens=words)
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
