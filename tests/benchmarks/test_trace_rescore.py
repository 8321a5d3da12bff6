"""Rescoring recorded TRACE generations both ways (clbench.benchmarks.trace_rescore)."""

from __future__ import annotations

import json

import pytest

from clbench.benchmarks.trace_rescore import main, rescore
from clbench.metrics.text import TEXT_METRICS, TRACE_TASK_METRICS, trace_score

ROWS = {"FOMC": [("Answer: A", "A ", "A"), ("Answer: B", "B", "B"), ("Answer: C", "c", "C"), ("Answer: A", "", "A")],
        "Py150": [("<s> x =", " x = <NUM_LIT:1> <EOL>", "x = 1 <EOL>"), ("<s> y", "y = 2 <EOL>", "y = 3 <EOL>")]}


def _write_run(folder, rows=ROWS):
    (folder / "predictions").mkdir(parents=True)
    for task, items in rows.items():
        text = "".join(json.dumps({"prompt": p, "prediction": g, "answer": a, "score": 0.0}) + "\n" for p, g, a in items)
        (folder / "predictions" / f"{task}.jsonl").write_text(text)
    return {"status": "ok", "objective": {"scoring": "trace",
                                          "predictions": {t: f"predictions/{t}.jsonl" for t in rows}}}


def _expected(task, scoring):
    prompts, preds, refs = zip(*ROWS[task])
    if scoring == "trace":
        return trace_score(task, preds, refs, prompts)
    values = TEXT_METRICS[TRACE_TASK_METRICS[task]]().sample_scores(list(preds), list(refs), list(prompts))
    return sum(values) / len(values)


def test_a_run_folder_is_scored_both_ways(tmp_path, capsys):
    result = _write_run(tmp_path / "run")
    (tmp_path / "run" / "result.json").write_text(json.dumps(result))
    scores, missing = rescore([tmp_path / "run"])
    assert missing == []
    for task in ROWS:
        for scoring in ("trace", "normalized"):
            assert scores[task][scoring] == [pytest.approx(_expected(task, scoring))]
    assert scores["FOMC"]["trace"][0] == 0.25 and scores["FOMC"]["normalized"][0] == 0.5
    assert main([str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "| FOMC | 1 | 25.0 | 50.0 | +25.0 |" in out and "| OP | 1 |" in out


def test_a_leaderboard_directory_reads_its_runs_and_names_those_without_generations(tmp_path, capsys):
    (tmp_path / "entries").mkdir()
    for name, kept in (("h1", True), ("h2", False)):
        entry = _write_run(tmp_path / "runs" / name) if kept else {"status": "ok", "objective": {
            "predictions": {"FOMC": "predictions/FOMC.jsonl"}}}
        entry.update(config_hash=name, strategy={"name": f"s{name}"}, order_label="standard", seed=0)
        (tmp_path / "entries" / f"{name}.json").write_text(json.dumps(entry))
    scores, missing = rescore([tmp_path])
    assert len(scores["FOMC"]["trace"]) == 1 and missing == ["sh2 standard seed 0"]
    assert main([str(tmp_path)]) == 0
    assert "1 run(s) without recorded generations left out: sh2 standard seed 0" in capsys.readouterr().out


def test_nothing_to_rescore_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clbench: error: ") and err.count("\n") == 1 and "leaderboard directory" in err
    (tmp_path / "entries").mkdir()
    assert main([str(tmp_path)]) == 2
    assert "no run with recorded generations" in capsys.readouterr().err
