"""TRACE read from a generated tree in its official layout; trace-mini; malformed files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from clbench.benchmarks.trace import ORDERS, TASKS, TextRecords, read_split, trace, write_trace
from clbench.benchmarks.trace_mini import generate, trace_mini
from clbench.errors import UserError
from clbench.metrics.text import make_text_metric
from clbench.data.streams import ordered_experiences, resolve_order
from helpers import checked

N_TRAIN, N_EVAL, N_TEST = 30, 5, 12

# MH-MoE paper, appendix A.3.4, written out here independently of clbench/benchmarks/trace.py.
PAPER_ORDERS = {
    "standard": "C-STANCE FOMC MeetingBank Py150 ScienceQA NumGLUE-cm NumGLUE-ds 20Minuten",
    "order1": "FOMC C-STANCE ScienceQA Py150 MeetingBank NumGLUE-cm NumGLUE-ds 20Minuten",
    "order2": "FOMC C-STANCE ScienceQA Py150 NumGLUE-ds NumGLUE-cm MeetingBank 20Minuten",
    "order3": "FOMC C-STANCE ScienceQA Py150 MeetingBank NumGLUE-ds NumGLUE-cm 20Minuten",
}


@pytest.fixture(scope="module")
def data():
    return generate(n_train=N_TRAIN, n_eval=N_EVAL, n_test=N_TEST, seed=3)


@pytest.fixture(scope="module")
def root(tmp_path_factory, data) -> Path:
    return write_trace(tmp_path_factory.mktemp("trace") / "LLM-CL-Benchmark", data)


@pytest.fixture
def copy(root, tmp_path) -> Path:
    """A private copy of the tree, to break."""
    return Path(shutil.copytree(root, tmp_path / "tree"))


def test_reads_the_official_layout(root, data):
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json"))
    assert files == sorted(f"{t}/{s}.json" for t in TASKS for s in ("train", "eval", "test"))
    scenario = trace(str(root))
    assert [e.name for e in scenario.train_stream] == list(TASKS)
    for i, (tr, te) in enumerate(zip(scenario.train_stream, scenario.test_stream)):
        assert tr.domain_id == te.domain_id == i and tr.classes_in_this_experience == []
        assert tr.dataset[0] == data[tr.name]["train"][0]  # the Avalanche dataset yields the dict
    exps = ordered_experiences(scenario, "default")
    for exp in exps:
        assert isinstance(exp.train, TextRecords)
        assert exp.train.records() == data[exp.name]["train"]
        assert exp.test.records() == data[exp.name]["test"]
    spec = scenario.clbench
    assert spec.objective == "causal_lm" and spec.scenario_type == "domain-il"
    assert spec.num_classes is None and spec.input_shape is None
    assert spec.objective_args["task_metrics"] == {  # TRACE's own scoring by default
        "C-STANCE": "trace_exact_match", "FOMC": "trace_exact_match", "MeetingBank": "trace_rouge_l",
        "Py150": "trace_edit_similarity", "ScienceQA": "trace_first_char", "NumGLUE-cm": "trace_exact_match",
        "NumGLUE-ds": "trace_exact_match", "20Minuten": "trace_sari"}
    lenient = trace(str(root), scoring="normalized").clbench
    assert lenient.objective_args["task_metrics"] == {
        "C-STANCE": "answer_letter", "FOMC": "exact_match", "MeetingBank": "rouge_l", "Py150": "edit_similarity",
        "ScienceQA": "answer_letter", "NumGLUE-cm": "exact_match", "NumGLUE-ds": "exact_match", "20Minuten": "sari"}


def test_eval_split_root_above_and_case_insensitive_folders(root, copy, data):
    exps = ordered_experiences(trace(str(root.parent), tasks=["FOMC"], test_split="eval"), "default")
    assert exps[0].test.records() == data["FOMC"]["eval"]
    (copy / "C-STANCE").rename(copy / "C-Stance")
    exps = ordered_experiences(trace(str(copy), tasks=["C-STANCE"]), "default")
    assert exps[0].train.records() == data["C-STANCE"]["train"]


def test_orders_are_the_papers(root):
    scenario = trace(str(root))
    assert ORDERS.keys() == PAPER_ORDERS.keys()
    for name, order in PAPER_ORDERS.items():
        assert [TASKS[i] for i in resolve_order(scenario, name)] == order.split()
    assert resolve_order(scenario, "default") == list(range(8))
    perm = resolve_order(scenario, {"permutation": 5})
    assert sorted(perm) == list(range(8)) and perm == resolve_order(scenario, {"permutation": 5})
    # A subset keeps each order's relative order.
    subset = trace(str(root), tasks=["MeetingBank", "Py150", "FOMC"])
    assert [e.name for e in subset.train_stream] == ["FOMC", "MeetingBank", "Py150"]
    assert [e.name for e in ordered_experiences(subset, "order1")] == ["FOMC", "Py150", "MeetingBank"]
    assert [e.domain_id for e in subset.train_stream] == [1, 2, 3]


def test_subsampling_is_seeded_reproducible_and_independent_of_the_task_subset(root, data):
    def sample(**kw):
        return {e.name: (e.train.records(), e.test.records())
                for e in ordered_experiences(trace(str(root), n_train=10, n_test=4, **kw), "default")}

    a, b, c = sample(), sample(), sample(subsample_seed=1)
    assert a == b and a != c
    fomc = sample(tasks=["FOMC", "Py150"])
    assert fomc["FOMC"] == a["FOMC"] and fomc["Py150"] == a["Py150"]
    for task, (train, test) in a.items():
        assert len(train) == 10 and len(test) == 4
        positions = [data[task]["train"].index(r) for r in train]
        assert positions == sorted(positions)  # a subset, kept in file order
    with pytest.raises(UserError, match=rf"train\.json: n_train=31 but the file holds {N_TRAIN} records"):
        trace(str(root), tasks=["FOMC"], n_train=N_TRAIN + 1)
    with pytest.raises(UserError, match=r"benchmark\.init_args\.n_test: n_test must be >= 1, got 0"):
        checked(trace, root=str(root), n_test=0)


def test_task_and_argument_errors(root, tmp_path):
    with pytest.raises(UserError, match=r"init_args\.tasks\[0\]: expected one of .*got str 'FOMCC'; "
                                        r"did you mean 'FOMC'"):
        checked(trace, root=str(root), tasks=["FOMCC"])
    with pytest.raises(UserError, match=r"init_args\.tasks: tasks must list each item once"):
        checked(trace, root=str(root), tasks=["FOMC", "FOMC"])
    with pytest.raises(UserError, match="TRACE root does not exist"):
        trace(str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="scenario_type"):
        checked(trace, root=str(root), tasks=["FOMC"], scenario_type="class-il")
    assert trace(str(root), tasks=["FOMC"], scenario_type="task-il").clbench.scenario_type == "task-il"
    with pytest.raises(UserError, match=r"benchmark\.init_args\.scoring: expected one of 'trace', 'normalized', got "
                                        r"str 'lenient'"):
        checked(trace, root=str(root), tasks=["FOMC"], scoring="lenient")
    with pytest.raises(UserError, match="scoring: expected one of"):
        checked(trace_mini, tasks=["FOMC"], n_train=2, n_test=2, scoring="TRACE")


def _error(copy, **kw) -> str:
    with pytest.raises(UserError) as err:
        trace(str(copy), **kw)
    assert err.value.exit_code == 2
    message = str(err.value)
    assert "\n" not in message
    return message


def test_missing_task_folder_and_file_are_named(copy):
    shutil.rmtree(copy / "Py150")
    shutil.rmtree(copy / "20Minuten")
    message = _error(copy)
    assert message.startswith(f"{copy / 'Py150'}: TRACE task folder missing (and 1 more: 20Minuten)")
    (copy / "FOMC" / "test.json").unlink()
    assert _error(copy, tasks=["FOMC"]).startswith(f"{copy / 'FOMC' / 'test.json'}: file missing")


def _write(path: Path, records=None, raw: bytes | None = None) -> None:
    path.write_bytes(raw if raw is not None else json.dumps(records, ensure_ascii=False).encode("utf-8"))


GOOD = {"prompt": "p", "answer": "a"}


@pytest.mark.parametrize("content, expected", [
    ([GOOD, GOOD, {"prompt": "p"}], "record 2: no 'answer' key"),
    ([GOOD, {"answer": "a"}], "record 1: no 'prompt' key"),
    ([GOOD, {"prompt": "p", "answer": 3}], "record 1: 'answer' is a number, expected a string"),
    ([GOOD, ["p", "a"]], "record 1: expected an object with 'prompt' and 'answer', found a list"),
    ({"prompt": "p", "answer": "a"}, "expected a JSON list of records, found an object (JSON Lines?"),
    ([], "the list holds no records"),
    (b"", "the file is empty"),
    (b"  \n", "the file is empty"),
    (b'[{"prompt": "p", "answer": "a"}, {"prompt": "p" "answer": "a"}]', "record 1: not valid JSON: Expecting ','"),
    (b'[{"prompt": "p", "answer": "a"} {"prompt": "q", "answer": "b"}]', "record 0: not valid JSON: expected ','"),
    (b'[{"prompt": "p", "answer": "a"}, {"prompt": "\xff", "answer": "b"}]',
     "record 1: not valid UTF-8 (byte 0xff at offset 45)"),
    (b'\xef\xbb\xbf[{"prompt": "p", "answer": "a"}, {"prompt": "ok", "answer": "b"}, {"prompt": "\xe4"}]',
     "record 2: not valid UTF-8 (byte 0xe4 at offset 81)"),
])
def test_malformed_file_gives_one_line_naming_file_and_record(copy, content, expected):
    path = copy / "NumGLUE-ds" / "train.json"
    _write(path, raw=content) if isinstance(content, bytes) else _write(path, content)
    message = _error(copy, tasks=["NumGLUE-ds", "FOMC"])
    assert message.startswith(f"{path}: {expected}")


def test_utf8_bom_and_non_ascii_are_read(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"prompt": "Zürich 中立", "answer": "C"}], ensure_ascii=False)
                     .encode("utf-8"))
    assert read_split(path) == [{"prompt": "Zürich 中立", "answer": "C"}]


def test_trace_mini_equals_its_written_tree_and_is_deterministic(tmp_path):
    written = write_trace(tmp_path / "mini", generate(n_train=40, n_eval=0, n_test=10, seed=7))
    from_disk = ordered_experiences(trace(str(written)), "order2")
    in_memory = ordered_experiences(trace_mini(n_train=40, n_test=10, seed=7), "order2")
    again = ordered_experiences(trace_mini(n_train=40, n_test=10, seed=7), "order2")
    for a, b, c in zip(from_disk, in_memory, again):
        assert a.name == b.name and a.train.records() == b.train.records() == c.train.records()
        assert a.test.records() == b.test.records()
    mini_spec, disk_spec = trace_mini(n_train=40, n_test=10, seed=7).clbench, trace(str(written)).clbench
    assert mini_spec.objective_args == disk_spec.objective_args and mini_spec.named_orders == disk_spec.named_orders
    other = ordered_experiences(trace_mini(n_train=40, n_test=10, seed=8), "default")
    assert other[0].train.records() != ordered_experiences(trace_mini(n_train=40, n_test=10, seed=7),
                                                           "default")[0].train.records()


def test_trace_mini_prompts_are_unique_and_answers_follow_the_rules(data):
    for task, splits in data.items():
        prompts = [r["prompt"] for s in splits.values() for r in s]
        assert len(prompts) == len(set(prompts)), task
    for r in data["NumGLUE-cm"]["train"]:
        count = int(re.search(r"counts (\d+) (\w+)", r["prompt"])[1])
        assert int(r["answer"]) % count == 0
    for r in data["NumGLUE-ds"]["train"]:
        a, b = map(int, re.findall(r"(\d+) (?:more are added|are removed|\w+ of)", r["prompt"])[:2])
        assert int(r["answer"]) == (a + b if "added" in r["prompt"] else a - b)
    for r in data["FOMC"]["train"] + data["C-STANCE"]["train"] + data["ScienceQA"]["train"]:
        assert r["answer"] in "ABCD" and len(r["answer"]) == 1
    for r in data["MeetingBank"]["train"]:
        assert r["answer"].startswith("The council voted to") and r["answer"].split(". ")[0] in r["prompt"]
    for r in data["Py150"]["train"]:
        assert r["answer"].endswith("<EOL>") and "<s>" in r["prompt"]
    for r in data["20Minuten"]["train"]:
        assert len(r["answer"].split()) < len(r["prompt"].split("\n\n")[1].split())


def test_a_shared_template_hides_the_task_that_the_own_prompts_give_away():
    """``template: shared``: the same draws and answers, one prompt form for every task. The
    control: a prompt's first line names its task in the own form (a lookup of the training
    prompts' first lines identifies every test prompt of six of the eight tasks), and none in
    the shared form, where the first line carries content only and each task's own instruction
    appears nowhere."""
    from clbench.benchmarks.trace_mini import SHARED_TEMPLATE

    own = generate(n_train=30, n_eval=0, n_test=20, seed=3)
    shared = generate(n_train=30, n_eval=0, n_test=20, seed=3, template="shared")
    head, tail = SHARED_TEMPLATE.split("{content}")
    for task in own:
        for split in ("train", "test"):
            assert [r["answer"] for r in shared[task][split]] == [r["answer"] for r in own[task][split]]
            assert all(r["prompt"].startswith(head) and r["prompt"].endswith(tail) for r in shared[task][split])
        prompts = [r["prompt"] for s in shared[task].values() for r in s]
        assert len(prompts) == len(set(prompts)), task
        instruction = own[task]["test"][0]["prompt"].split("\n")[0]
        assert not any(instruction in p for p in prompts), task

    def identified(data: dict) -> float:
        """Share of test prompts whose task a lookup of the training prompts' first lines gives."""
        seen: dict[str, set[str]] = {}
        for task, splits in data.items():
            for r in splits["train"]:
                seen.setdefault(r["prompt"].split("\n")[0], set()).add(task)
        tests = [(task, r["prompt"]) for task, splits in data.items() for r in splits["test"]]
        return sum(seen.get(p.split("\n")[0]) == {task} for task, p in tests) / len(tests)

    assert identified(own) == 6 / 8  # all but the two NumGLUE tasks, which share their instruction
    assert identified(shared) == 0.0
    spec = trace_mini(n_train=30, n_test=20, seed=3, template="shared")
    first = ordered_experiences(spec, "default")[0]
    assert first.test.records() == shared[first.name]["test"]


@pytest.mark.parametrize("scoring", ["trace", "normalized"])
def test_trace_mini_references_score_one_by_their_tasks_metric(data, scoring):
    from clbench.metrics.text import TRACE_SCORINGS

    for task, splits in data.items():
        records = splits["test"]
        prompts = [r["prompt"] for r in records]
        answers = [r["answer"] for r in records]
        metric = make_text_metric(TRACE_SCORINGS[scoring][task])
        metric.update(answers, answers, sources=prompts)
        # SARI's deletion precision subtracts reference counts, so a source n-gram that occurs
        # more often in the prompt than in the reference keeps even the reference just below 1.
        # rouge 1.0.1's F is 2PR / (P + R + 1e-8).
        assert float(metric.compute()) == pytest.approx(1.0, abs=1e-6 if task != "20Minuten" else 0.01), task
        shifted = make_text_metric(TRACE_SCORINGS[scoring][task])
        shifted.update(answers[1:] + answers[:1], answers, sources=prompts)
        assert float(shifted.compute()) < 0.95, task


def test_data_check_reads_a_trace_tree(tmp_path):
    """`clbench data check trace` summarises text tasks (no classes) and names a bad record."""
    import json
    import subprocess
    import sys

    from clbench.benchmarks.trace import write_trace
    from clbench.benchmarks.trace_mini import generate

    root = write_trace(tmp_path / "TRACE", generate(tasks=["FOMC", "Py150"], n_train=4, n_eval=1, n_test=2))
    ok = subprocess.run([sys.executable, "-m", "clbench.cli.main", "data", "check", "trace", "--root", str(root),
                         "--json", "tasks=[FOMC, Py150]"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout)
    assert summary["objective"] == "causal_lm" and [e["train"] for e in summary["experiences"]] == [4, 4]
    (root / "FOMC" / "test.json").write_text(json.dumps([{"prompt": "x"}]))
    bad = subprocess.run([sys.executable, "-m", "clbench.cli.main", "data", "check", "trace", "--root", str(root),
                          "tasks=[FOMC, Py150]"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "FOMC/test.json" in bad.stderr and "record 0" in bad.stderr


def test_a_validation_split_is_scored_in_the_test_sets_place_and_overlaps_neither():
    """``n_validation``: a run scores held-out prompts that are neither test nor training
    prompts; the test prompts are the test-scored stream's, and without it nothing changes."""
    plain = trace_mini(n_train=30, n_test=20, seed=3)
    held = trace_mini(n_train=30, n_test=20, seed=3, n_validation=10)
    data = generate(n_train=30, n_eval=10, n_test=20, seed=3)
    for position in range(3):
        kept, scored = ordered_experiences(plain, "default")[position], ordered_experiences(held, "default")[position]
        assert kept.name == scored.name
        assert kept.test.records() == data[kept.name]["test"]  # the test-scored stream's test set
        assert scored.test.records() == data[scored.name]["eval"] and len(scored.test.records()) == 10
        validation = {r["prompt"] for r in scored.test.records()}
        assert not validation & {r["prompt"] for r in kept.test.records()}
        assert not validation & {r["prompt"] for r in scored.train.records()}
    assert generate(n_train=30, n_eval=0, n_test=20, seed=3)[kept.name]["test"] == data[kept.name]["test"]
