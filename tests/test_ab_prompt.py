"""The ab gate's prompt: exactly the tokens asked for, from the pinned tree's docs or, with
`prompt_text: prose`, from the needle gates' prose ending in a request to summarise it."""

from llama_sparse.gates.ab import PROSE_REQUEST, prompt_tokens
from llama_sparse.gates.niah import prose_sentences


class WordTokenizer:
    """A server stand-in whose tokens are words (ids from a shared table), BOS 0 when asked."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.words: dict[int, str] = {}

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        out = [0] if add_special else []
        for w in text.split():
            if w not in self.ids:
                self.ids[w] = len(self.ids) + 1
                self.words[self.ids[w]] = w
        return out + [self.ids[w] for w in text.split()]

    def text(self, toks: list[int]) -> str:
        return " ".join(self.words[t] for t in toks if t)


def test_prose_prompt_is_prose_ending_in_the_request() -> None:
    tok = WordTokenizer()
    toks = prompt_tokens(tok, 3000, "prose")
    assert len(toks) == 3000
    text = tok.text(toks)
    assert text.endswith(" ".join(PROSE_REQUEST.split()))
    body = text[: -len(" ".join(PROSE_REQUEST.split()))].split()
    # the body is the needle gates' prose, from its first sentence on
    assert " ".join(body[:8]) == " ".join(" ".join(prose_sentences()).split()[:8])


def test_reference_prompt_is_not_the_prose() -> None:
    tok = WordTokenizer()
    ref = prompt_tokens(tok, 3000)
    assert len(ref) == 3000
    assert not tok.text(ref).endswith(" ".join(PROSE_REQUEST.split()))
