"""Gate definitions: YAML files load into the dataclasses, and every mistake is refused clearly."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from llama_sparse.errors import UserError
from llama_sparse.gates.spec import Arm, GateSpec, SpecError, discover, load

GATES_DIR = Path(__file__).resolve().parent.parent / "gates"

VALID = """\
    kind: ab
    description: a sparse arm against dense
    models: [smollm2-135m, ./local.gguf]
    context_lengths: [2048, "8K"]
    cache_types: [f16, q8_0]
    repeats: 7
    n_predict: 32
    batch: [1, 4]
    seed: 7
    threads: 2
    arms:
      - dense
      - name: sparse-25
        flags: [--sparse-attn, "on", --sparse-attn-coverage, "0.25"]
      - name: up
        variant: upstream
        flags: "-fa off"
    thresholds:
      min_ratio: 1.5
    """


def write(tmp_path: Path, text: str, name: str = "gate.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def refused(tmp_path: Path, text: str, name: str = "gate.yaml") -> str:
    path = write(tmp_path, text, name)
    with pytest.raises(SpecError) as info:
        load(path)
    msg = str(info.value)
    # every line of the message starts with the file it is about
    for line in msg.splitlines():
        assert line.startswith(str(path)) or line.startswith(name), line
    return msg


def test_valid_file_loads_into_dataclasses(tmp_path: Path) -> None:
    spec = load(write(tmp_path, VALID))
    assert isinstance(spec, GateSpec)
    assert spec.name == "gate" and spec.kind == "ab"
    assert spec.description == "a sparse arm against dense"
    assert spec.models == ("smollm2-135m", str((tmp_path / "local.gguf").resolve()))
    assert spec.context_lengths == (2048, 8192)
    assert spec.cache_types == ("f16", "q8_0")
    assert (spec.repeats, spec.n_predict, spec.batch, spec.seed, spec.threads) == (7, 32, (1, 4), 7, 2)
    assert spec.thresholds == {"min_ratio": 1.5}
    dense, sparse, up = spec.arms
    assert dense == Arm(name="dense")
    assert sparse.flags == ("--sparse-attn", "on", "--sparse-attn-coverage", "0.25")
    assert sparse.sparse is True and sparse.coverage == 0.25 and sparse.variant == "patched"
    assert up == Arm(name="up", flags=("-fa", "off"), variant="upstream")
    assert spec.reference is dense and spec.arm("up") is up
    with pytest.raises(Exception):
        spec.kind = "niah"  # frozen


def test_defaults_and_niah_n_predict(tmp_path: Path) -> None:
    spec = load(write(tmp_path, """\
        kind: niah
        models: [smollm2-135m]
        context_lengths: [1024]
        arms: [dense]
        """, "my-gate.yaml"))
    assert spec.name == "my-gate"
    assert spec.n_predict == 128          # niah default
    assert spec.samples == 24 and spec.tasks == ("niah_single_1",) and spec.cache_types == ("f16",)
    assert spec.thresholds == {} and spec.threads is None and spec.seed == 42
    other = load(write(tmp_path, """\
        kind: logits
        models: [smollm2-135m]
        context_lengths: [1024]
        arms: [a, b]
        """, "l.yaml"))
    assert other.n_predict == 64


def test_to_dict_is_json_and_complete(tmp_path: Path) -> None:
    spec = load(write(tmp_path, VALID))
    d = json.loads(json.dumps(spec.to_dict()))
    assert d["name"] == "gate" and d["kind"] == "ab" and d["path"] == str(spec.path)
    assert d["context_lengths"] == [2048, 8192]
    assert [a["name"] for a in d["arms"]] == ["dense", "sparse-25", "up"]
    assert d["arms"][1]["coverage"] == 0.25 and d["arms"][1]["sparse"] is True
    assert d["thresholds"] == {"min_ratio": 1.5} and d["repeats"] == 7


def test_unknown_key_names_file_key_and_close_match(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID.replace("repeats: 7", "repeat: 7"), "x.yaml")
    assert "x.yaml" in msg
    assert "key 'repeat' unknown" in msg
    assert "did you mean 'repeats'?" in msg
    assert "known keys:" in msg and "context_lengths" in msg
    assert "x.yaml:6:" in msg  # the line the key is on


def test_unknown_arm_key_is_refused(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID.replace("variant: upstream", "varient: upstream"))
    assert "arms[2] ('up')" in msg and "key 'varient' unknown" in msg and "'variant'" in msg


def test_ab_with_two_repeats_is_refused_with_reason(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID.replace("repeats: 7", "repeats: 2"))
    assert "repeats: 2" in msg and ">= 5" in msg and "10%" in msg


def test_negative_context_is_refused(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID.replace('[2048, "8K"]', "[2048, -4096]"))
    assert "context_lengths[1]" in msg and "-4096" in msg and "positive" in msg


@pytest.mark.parametrize("value", ["[]", "[1024.5]", "[true]", "1024x", "[0]", "[1024, 1024]"])
def test_bad_context_lengths(tmp_path: Path, value: str) -> None:
    msg = refused(tmp_path, VALID.replace('[2048, "8K"]', value))
    assert "context_lengths" in msg


def test_unknown_kind_is_refused(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID.replace("kind: ab", "kind: speed"))
    assert "kind: 'speed' is not a gate kind" in msg and "identity, niah, logits, ab" in msg


def test_duplicate_arm_is_refused(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID.replace("name: up", "name: dense"))
    assert "name 'dense' is used twice" in msg


def test_unknown_cache_type_is_refused(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID.replace("[f16, q8_0]", "[f16, q8]"))
    assert "'q8' is not a known KV cache type" in msg and "did you mean 'q8_0'?" in msg


def test_unknown_threshold_for_kind_is_refused(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID.replace("min_ratio: 1.5", "min_score: 1.0"))
    assert "'min_score' unknown for kind ab" in msg and "min_ratio" in msg


BASE = {"kind": "ab", "models": ["smollm2-135m"], "context_lengths": [1024], "arms": ["dense"],
        "repeats": 5, "thresholds": {"min_ratio": 1.0}}


@pytest.mark.parametrize("override, expect", [
    ({"arms": []}, "arms: must not be empty"),
    ({"arms": "dense"}, "arms: must be a list"),
    ({"repeats": "seven"}, "repeats: must be an integer"),
    ({"repeats": 5.0}, "repeats: must be an integer"),
    ({"threads": 0}, "threads: 0 is out of range"),
    ({"seed": -1}, "seed: -1 is out of range"),
    ({"batch": [0]}, "batch[0]"),
    ({"models": ["gpt-5"]}, "'gpt-5' is not a known model"),
    ({"thresholds": {"min_ratio": -1}}, "min_ratio: -1 is out of range"),
    ({"thresholds": {"min_ratio": "fast"}}, "min_ratio: must be a number"),
    ({"tasks": ["niah_single_1"]}, "tasks: applies to kind niah or load or frontier only"),
    ({"clients": 8}, "clients: applies to kind load only"),
    ({"time_limit": 60}, "time_limit: applies to kind load only"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "tasks": ["niah_x"]}, "'niah_x' is not a known niah task"),
    ({"kind": "niah", "repeats": 1, "thresholds": {"min_score": 1.5}}, "min_score: 1.5 is out of range"),
    ({"kind": "niah", "repeats": 1, "thresholds": {"max_lost": 0.5}}, "max_lost: must be a whole number"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "shared_prefill": "yes"}, "shared_prefill: must be true or false"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "shared_prefill": True, "batch": [1, 4]},
     "shared_prefill: the arms answer one prompt at a time"),
    ({"kind": "load", "repeats": 1, "thresholds": {}, "shared_prefill": True}, "shared_prefill: applies to kind"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "samples": 8, "only_samples": [3, 8]},
     "only_samples: [8] outside the 8 samples (indices 0 to 7)"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "only_samples": [-1]}, "is not a sample index"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "only_samples": [2, 2]}, "is listed twice"),
    ({"only_samples": [1]}, "only_samples: applies to kind niah or frontier only"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "stagger": 2}, "stagger: needs a batch above 1"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "batch": [1, 4], "stagger": -1}, "stagger: must be seconds"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "batch": [1, 4], "stagger": "soon"}, "stagger: must be seconds"),
    ({"stagger": 1}, "stagger: applies to kind niah only"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "json_schema": "digits"}, "json_schema: must be a JSON schema (a mapping)"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "json_schema": {}}, "json_schema: must be a JSON schema (a mapping)"),
    ({"json_schema": {"type": "object"}}, "json_schema: applies to kind niah only"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "mix": ["greedy", "beam"]}, "mix: must be a list of the requests greedy, json, sampled, backend"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "mix": []}, "mix: must be a list of the requests"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "mix": ["greedy", "json"]}, "mix: its json requests need the gate's json_schema"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "shared_prefill": True, "mix": ["greedy", "sampled"]}, "mix: the shared-prefill arms answer"),
    ({"mix": ["greedy"]}, "mix: applies to kind niah only"),
    ({"speed_context": 8192}, "speed_context: applies to kind frontier only"),
    ({"prompt_text": "poetry"}, "prompt_text: must be one of reference, prose, not 'poetry'"),
    ({"kind": "niah", "repeats": 1, "thresholds": {}, "prompt_text": "prose"}, "prompt_text: applies to kind ab or ttft only"),
    ({"kind": "frontier", "arms": ["dense", "b"], "thresholds": {}, "speed_context": "fast"},
     "speed_context: must be a positive token count"),
    ({"kind": "frontier", "arms": ["dense"], "thresholds": {}}, "arms: kind frontier needs at least 2 arms"),
    ({"kind": "frontier", "thresholds": {}, "arms": [{"name": "on", "flags": ["--sparse-attn", "on"]}, "dense"]},
     "its first arm must be dense (no sparse flags), not 'on'"),
    ({"kind": "frontier", "arms": ["dense", "b"], "thresholds": {}, "repeats": 3},
     "for kind frontier: two identical dense arms differ"),
    ({"kind": "frontier", "arms": ["dense", "b"], "thresholds": {"max_lost": 0}}, "'max_lost' unknown for kind frontier"),
    ({"description": ["a"]}, "description: must be a string"),
    ({"name": "Bad Name"}, "is not a valid gate name"),
])
def test_bad_values_are_refused(tmp_path: Path, override: dict, expect: str) -> None:
    data = {**BASE, **override}
    if data["kind"] not in ("ab", "frontier"):
        data.pop("repeats")
    msg = refused(tmp_path, yaml.safe_dump(data))
    assert expect in msg


def test_base_of_bad_values_is_valid(tmp_path: Path) -> None:
    assert load(write(tmp_path, yaml.safe_dump(BASE))).kind == "ab"


def test_ab_prompt_text_is_read(tmp_path: Path) -> None:
    assert load(write(tmp_path, yaml.safe_dump(BASE))).prompt_text == "reference"
    assert load(write(tmp_path, yaml.safe_dump({**BASE, "prompt_text": "prose"}), name="p.yaml")).prompt_text == "prose"


def test_stagger_with_a_batch_loads(tmp_path: Path) -> None:
    data = {**BASE, "kind": "niah", "thresholds": {}, "batch": [1, 4], "stagger": 1.5}
    data.pop("repeats")
    assert load(write(tmp_path, yaml.safe_dump(data))).stagger == 1.5


def test_a_json_schema_is_kept_for_the_requests(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    data = {**BASE, "kind": "niah", "thresholds": {}, "json_schema": schema}
    data.pop("repeats")
    spec = load(write(tmp_path, yaml.safe_dump(data)))
    assert spec.json_schema == schema and spec.to_dict()["json_schema"] == schema


def test_only_samples_are_kept_in_order_given(tmp_path: Path) -> None:
    data = {**BASE, "kind": "niah", "thresholds": {}, "samples": 24, "only_samples": [21, 12]}
    data.pop("repeats")
    spec = load(write(tmp_path, yaml.safe_dump(data)))
    assert spec.only_samples == (21, 12)
    assert spec.to_dict()["only_samples"] == [21, 12]


def test_arm_flag_problems(tmp_path: Path) -> None:
    msg = refused(tmp_path, """\
        kind: ab
        models: [smollm2-135m]
        context_lengths: [1024]
        arms:
          - name: a
            flags: [--sparse-attn, on]
          - name: b
            flags: [-c, "4096"]
          - name: c
            variant: upstream
            sparse: true
          - name: D
          - name: e
            coverage: 1.5
        """)
    assert "quote it" in msg                                  # YAML's `on` is a boolean
    assert "'-c' is set from the gate's 'context_lengths'" in msg
    assert "upstream build has no sparse attention" in msg
    assert "'D' is not a valid arm name" in msg
    assert "coverage: 1.5 is out of range" in msg


def test_identity_and_logits_need_a_reference_and_another_arm(tmp_path: Path) -> None:
    msg = refused(tmp_path, """\
        kind: identity
        models: [smollm2-135m]
        context_lengths: [1024]
        arms: [patched]
        """)
    assert "needs at least 2 arms" in msg


def test_missing_required_keys(tmp_path: Path) -> None:
    msg = refused(tmp_path, "kind: niah\n")
    for key in ("models", "context_lengths", "arms"):
        assert f"key '{key}' missing" in msg


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID.replace("repeats: 7", "repeats: 2").replace("[f16, q8_0]", "[f99]"))
    assert "repeats: 2" in msg and "'f99'" in msg
    assert len(msg.splitlines()) == 2


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    msg = refused(tmp_path, "kind: niah\nmodels: [smollm2-135m\ncontext_lengths: [1024]\n", "broken.yaml")
    assert msg.startswith(str(tmp_path / "broken.yaml") + ":") or msg.startswith("broken.yaml:")
    assert "YAML error" in msg and "line 2" in msg


def test_duplicate_yaml_key_is_refused(tmp_path: Path) -> None:
    msg = refused(tmp_path, VALID + "repeats: 9\n")
    assert "duplicate key 'repeats'" in msg


def test_not_a_mapping_and_empty(tmp_path: Path) -> None:
    assert "must be a mapping" in refused(tmp_path, "- a\n- b\n")
    assert "empty gate file" in refused(tmp_path, "# nothing\n")


def test_spec_error_is_a_user_error() -> None:
    assert issubclass(SpecError, UserError)


def test_discover_sorted_and_collects_all_broken_files(tmp_path: Path) -> None:
    write(tmp_path, VALID, "b.yaml")
    write(tmp_path, yaml.safe_dump({"kind": "niah", "models": ["smollm2-135m"], "context_lengths": [512],
                                    "arms": ["dense"], "thresholds": {"min_score": 1.0}}), "a.yml")
    (tmp_path / "notes.txt").write_text("not a gate")
    assert [s.name for s in discover(tmp_path)] == ["a", "b"]
    write(tmp_path, "kind: nope\n", "c.yaml")
    write(tmp_path, "kind: [\n", "d.yaml")
    with pytest.raises(SpecError) as info:
        discover(tmp_path)
    assert "c.yaml" in str(info.value) and "d.yaml" in str(info.value)
    with pytest.raises(SpecError):
        discover(tmp_path / "missing")


def test_every_gate_in_the_repository_loads() -> None:
    files = sorted(GATES_DIR.glob("*.y*ml"))
    assert {f.name for f in files} >= {"identity.yaml", "niah.yaml", "ab.yaml", "logits.yaml"}
    specs = {s.name: s for s in discover(GATES_DIR)}
    assert len(specs) == len(files)
    assert specs["identity"].kind == "identity"
    assert [a.variant for a in specs["identity"].arms] == ["upstream", "patched", "patched", "patched"]
    assert specs["identity"].arms[2].sparse  # the select-all anchor
    assert specs["identity"].arms[3].sparse  # the select-all prefill anchor
    assert specs["niah"].thresholds == {"min_score": 1.0} and specs["niah"].n_predict == 128
    assert specs["ab"].repeats >= 5 and specs["ab"].context_lengths == (2048, 4096, 8192)
    assert [a.name for a in specs["logits"].arms] == ["dense", "dense-again"]
    assert specs["logits"].thresholds == {"max_diff_steps": 0}


def test_discover_refuses_the_same_gate_name_twice(tmp_path: Path) -> None:
    write(tmp_path, VALID, "one.yaml")
    write(tmp_path, "name: one\n" + textwrap.dedent(VALID), "two.yaml")
    with pytest.raises(SpecError) as info:
        discover(tmp_path)
    assert "gate 'one' is also defined in" in str(info.value)


def test_load_kind_reads_its_keys(tmp_path: Path) -> None:
    spec = load(write(tmp_path, """\
        kind: load
        models: [smollm2-135m]
        context_lengths: [2048]
        batch: [4]
        clients: 8
        requests: 300
        time_limit: 900
        arms: [dense]
        """))
    assert (spec.kind, spec.batch, spec.clients, spec.requests, spec.time_limit) == ("load", (4,), 8, 300, 900.0)


def test_load_kind_refuses_bad_values(tmp_path: Path) -> None:
    msg = refused(tmp_path, """\
        kind: load
        models: [smollm2-135m]
        context_lengths: [2048]
        batch: [1, 4]
        clients: 0
        time_limit: -5
        arms: [dense]
        """)
    assert "batch: kind load takes one value" in msg
    assert "clients:" in msg and "time_limit: must be a positive number of seconds" in msg


def test_skip_steps_for_logits(tmp_path: Path) -> None:
    spec = load(write(tmp_path, """\
        kind: logits
        models: [smollm2-135m]
        context_lengths: [2048]
        samples: 64
        skip_steps: 33
        arms: [dense, {name: scsa, flags: [--sparse-attn, scsa]}]
        """))
    assert spec.skip_steps == 33
    assert spec.arms[1].sparse     # an SCSA arm is a sparse arm (it needs the patched build)


@pytest.mark.parametrize("extra, expect", [
    ("skip_steps: 65", "skip_steps: 65 leaves none of the 65 rows"),
    ("skip_steps: -1", "skip_steps: -1 is out of range"),
    ("skip_steps: many", "skip_steps: must be an integer"),
])
def test_skip_steps_bad_values(tmp_path: Path, extra: str, expect: str) -> None:
    msg = refused(tmp_path, f"""\
        kind: logits
        models: [smollm2-135m]
        context_lengths: [2048]
        samples: 64
        {extra}
        arms: [dense, dense-again]
        """)
    assert expect in msg


def test_skip_steps_is_for_logits_only(tmp_path: Path) -> None:
    msg = refused(tmp_path, yaml.safe_dump({**BASE, "skip_steps": 3}))
    assert "skip_steps: applies to kind logits only" in msg


def test_scsa_flags_mark_an_arm_sparse(tmp_path: Path) -> None:
    spec = load(write(tmp_path, yaml.safe_dump({**BASE, "arms": [
        "dense", {"name": "scsa-tuned", "flags": ["--sparse-attn", "scsa", "--scsa-tolerance", "0.05"]}]})))
    assert [a.sparse for a in spec.arms] == [False, True]
    assert spec.arms[1].coverage is None   # SCSA reads what its thresholds open: no fixed coverage bound


def test_calibration_samples_for_niah(tmp_path: Path) -> None:
    niah_gate = {"kind": "niah", "models": ["gemma3-270m"], "context_lengths": [16384], "samples": 8,
                 "arms": ["dense", {"name": "scsa", "flags": ["--sparse-attn", "scsa"]}]}
    assert load(write(tmp_path, yaml.safe_dump(niah_gate))).calibration_samples == 0
    spec = load(write(tmp_path, yaml.safe_dump({**niah_gate, "calibration_samples": 2})))
    assert spec.calibration_samples == 2 and spec.to_dict()["calibration_samples"] == 2
    assert "calibration_samples: -1 is out of range" in refused(
        tmp_path, yaml.safe_dump({**niah_gate, "calibration_samples": -1}))
    assert "calibration_samples: must be an integer" in refused(
        tmp_path, yaml.safe_dump({**niah_gate, "calibration_samples": "one"}))
    assert "calibration_samples: applies to kind niah or frontier only" in refused(
        tmp_path, yaml.safe_dump({**BASE, "calibration_samples": 1}))


def test_taus_files_are_taken_from_the_gate_folder(tmp_path: Path) -> None:
    (tmp_path / "taus").mkdir()
    (tmp_path / "taus" / "g.json").write_text('{"0:0": 0.01}')
    spec = load(write(tmp_path, yaml.safe_dump({**BASE, "arms": ["dense", {
        "name": "scsa", "flags": ["--sparse-attn", "scsa", "--scsa-taus", "taus/g.json",
                                  "--scsa-taus-out=out.json"]}]})))
    flags = spec.arms[1].flags
    assert flags[flags.index("--scsa-taus") + 1] == str(tmp_path / "taus" / "g.json")
    assert f"--scsa-taus-out={tmp_path / 'out.json'}" in flags
    msg = refused(tmp_path, yaml.safe_dump({**BASE, "arms": [{
        "name": "scsa", "flags": ["--sparse-attn", "scsa", "--scsa-taus", "missing.json"]}]}))
    assert "--scsa-taus missing.json: no such file" in msg


def test_only_selects_several_arms_and_keeps_the_reference(tmp_path: Path) -> None:
    from llama_sparse.gates.runner import GateContext, run_gate
    from llama_sparse.progress import Progress

    spec = load(write(tmp_path, VALID))
    with Progress(plain=True) as p:
        def names(only: tuple[str, ...]) -> list[str]:
            return [a.name for a in GateContext(spec=spec, out_dir=tmp_path, progress=p, only=only).arms]

        assert names(()) == ["dense", "sparse-25", "up"]
        assert names(("up",)) == ["dense", "up"]
        assert names(("up", "sparse-25")) == ["dense", "sparse-25", "up"]  # the file's order
    # an unknown name among good ones is refused before any server starts or folder is made
    with pytest.raises(UserError, match="no arm named 'sparse-50'; arms: dense, sparse-25, up"):
        run_gate(spec, tmp_path / "results", only=["up", "sparse-50"])
    assert not (tmp_path / "results").exists()


def test_cli_only_is_repeatable() -> None:
    from llama_sparse.cli import make_parser

    args = make_parser().parse_args(["gate", "gates/x.yaml", "--only", "a", "--only", "b"])
    assert args.only == ["a", "b"]


def test_arm_env_reaches_the_server_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llama_sparse.gates.runner import GateContext
    from llama_sparse.progress import Progress
    spec = load(write(tmp_path, yaml.safe_dump({**BASE, "arms": [
        "dense", {"name": "sched", "flags": ["--sparse-attn", "on"], "env": {"GGML_SCHED_MAX_COPIES": 1}}]})))
    assert spec.arms[0].env == ()
    assert spec.arms[1].env == (("GGML_SCHED_MAX_COPIES", "1"),)
    assert spec.arms[1].to_dict()["env"] == {"GGML_SCHED_MAX_COPIES": "1"}
    ctx = GateContext(spec=spec, out_dir=tmp_path, progress=Progress())
    monkeypatch.setattr(ctx, "build_info", lambda variant: None)
    monkeypatch.setattr(ctx, "model_path", lambda name: tmp_path / "m.gguf")
    assert ctx.server_config(spec.arms[0], "m", 1024, "f16").env == {}
    assert ctx.server_config(spec.arms[1], "m", 1024, "f16").env == {"GGML_SCHED_MAX_COPIES": "1"}


def test_arm_env_problems(tmp_path: Path) -> None:
    msg = refused(tmp_path, yaml.safe_dump({**BASE, "arms": [
        "dense",
        {"name": "a", "env": {"PATH": "/tmp"}},
        {"name": "b", "env": {"LLAMA_ARG_THREADS": [1, 2]}},
        {"name": "c", "env": "GGML_X=1"}]}))
    assert "'PATH' is not a GGML_* or LLAMA_* variable name" in msg
    assert "LLAMA_ARG_THREADS: the value must be a string or a number, not a list" in msg
    assert "env: must be a mapping of variable to value, not a string" in msg


def test_frontier_reads_its_keys(tmp_path: Path) -> None:
    spec = load(write(tmp_path, yaml.safe_dump({
        "kind": "frontier", "models": ["smollm2-135m"], "context_lengths": ["4K", 7168],
        "tasks": ["niah_multikey_1"], "samples": 6, "shared_prefill": True, "calibration_samples": 1,
        "repeats": 5, "speed_context": "8K",
        "arms": ["dense", {"name": "b32-0.25", "flags": ["--sparse-attn", "on", "--sparse-attn-coverage", "0.25"],
                           "coverage": 0.25}]})))
    assert spec.kind == "frontier" and spec.speed_context == 8192 and spec.context_lengths == (4096, 7168)
    assert spec.n_predict == 128 and spec.shared_prefill and spec.arms[1].sparse
    assert load(write(tmp_path, yaml.safe_dump({"kind": "frontier", "models": ["smollm2-135m"],
                                                "context_lengths": [4096], "arms": ["dense", "b"]}),
                      name="g2.yaml")).speed_context == 8192


def test_a_mix_is_kept_in_order(tmp_path: Path) -> None:
    data = {**BASE, "kind": "niah", "thresholds": {}, "batch": [1, 4], "mix": ["greedy", "json", "backend"],
            "json_schema": {"type": "object"}}
    data.pop("repeats")
    spec = load(write(tmp_path, yaml.safe_dump(data)))
    assert spec.mix == ("greedy", "json", "backend") and spec.to_dict()["mix"] == ["greedy", "json", "backend"]
