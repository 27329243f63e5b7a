"""The timing-line parser, on lines recorded from real llama-server runs (tests/data)."""

from pathlib import Path

from llama_sparse import timings

DATA = Path(__file__).parent / "data" / "server-timing.log"


def test_parses_every_request_with_its_slot_and_task() -> None:
    recs = timings.parse(DATA.read_text())
    assert [(r.slot, r.task) for r in recs] == [(0, 0), (0, 0), (1, 1)]
    single = recs[0]
    assert single.prompt is not None and single.decode is not None
    assert (single.prompt.tokens, single.prompt.ms, single.prompt.tokens_per_second) == (1024, 2390.68, 428.33)
    assert (single.decode.tokens, single.decode.ms_per_token, single.decode.tokens_per_second) == (32, 8.63, 115.83)
    assert single.total_ms == 2658.31


def test_two_slots_kept_apart() -> None:
    recs = timings.parse(DATA.read_text())[1:]
    assert [r.decode.tokens for r in recs if r.decode] == [48, 64]
    assert [r.prompt.tokens for r in recs if r.prompt] == [19, 31]


def test_offset_reads_only_later_requests(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    text = DATA.read_text()
    first_block_end = text.index("graphs reused")
    log.write_text(text)
    assert len(timings.parse_file(log, offset=first_block_end)) == 2


def test_incomplete_block_is_not_a_record() -> None:
    lines = DATA.read_text().splitlines()
    without_total = "\n".join(ln for ln in lines if "total time" not in ln)
    assert timings.parse(without_total) == []


SCSA_LOG = """\
0.10.000.001 I slot print_timing: id  0 | task 5 | prompt eval time =    100.00 ms /    10 tokens (   10.00 ms per token,   100.00 tokens per second)
0.10.000.002 I slot print_timing: id  0 | task 5 |        eval time =    200.00 ms /    20 tokens (   10.00 ms per token,   100.00 tokens per second)
0.10.000.003 I slot print_timing: id  0 | task 5 |       total time =    300.00 ms /    30 tokens
0.10.000.004 I slot print_timing: id  0 | task 5 | scsa: decode read  22.5% of the visible rows (opened 1500, exact 750, of 10000); calls 270, clusters scored 16200, rebuilds 0, exact calls 0; calibration 32 steps, taus frozen
"""


def test_scsa_read_fraction_is_the_rows_read_over_the_visible() -> None:
    (rec,) = timings.parse(SCSA_LOG)
    assert rec.sparse_read_fraction == (1500 + 750) / 10000


def test_scsa_line_of_another_request_is_not_taken() -> None:
    other = SCSA_LOG.replace("| task 5 | scsa", "| task 6 | scsa")
    (rec,) = timings.parse(other)
    assert rec.sparse_read_fraction is None


BLOCK_LOG = SCSA_LOG.splitlines()[:3] + [
    "0.10.000.004 I slot print_timing: id  0 | task 5 | sparse attention: decode read  25.0% of the visible KV blocks (2592 of 10368 block reads)"]


def test_block_line_gives_the_fraction_and_the_visible_count() -> None:
    (rec,) = timings.parse("\n".join(BLOCK_LOG) + "\n")
    assert rec.sparse_read_fraction == 2592 / 10368
    assert rec.sparse_blocks_visible == 10368
    assert rec.sparse_rechecked is None   # a server before the recheck says nothing of it


def test_block_line_gives_the_steps_computed_again_densely() -> None:
    line = BLOCK_LOG[-1] + "; 3 of 64 steps computed again densely"
    (rec,) = timings.parse("\n".join(BLOCK_LOG[:-1] + [line]) + "\n")
    assert rec.sparse_read_fraction == 2592 / 10368
    assert rec.sparse_rechecked == (3, 64)


def _scsa_response(**sparse: int) -> dict:
    return {"id_slot": 0, "timings": {
        "prompt_n": 100, "prompt_ms": 50.0, "prompt_per_token_ms": 0.5, "prompt_per_second": 2000.0,
        "predicted_n": 40, "predicted_ms": 400.0, "predicted_per_token_ms": 10.0, "predicted_per_second": 100.0,
        "sparse": {"method": "scsa", "rows_read": 300, "rows_visible": 1000, **sparse}}}


def test_scsa_response_gives_its_steps_computed_again_over_its_decode_steps() -> None:
    # SCSA counts no sparse steps: the fraction computed again is over the request's decode steps
    assert timings.from_response(_scsa_response(steps_rechecked=6)).sparse_rechecked == (6, 40)
    # none computed again (SCSA without a recheck, or a server that does not count them): no figure
    assert timings.from_response(_scsa_response(steps_rechecked=0)).sparse_rechecked is None
    assert timings.from_response(_scsa_response()).sparse_read_fraction == 0.3
