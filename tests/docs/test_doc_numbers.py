"""The documents' leaderboard numbers that are not a fragment's table (a derived table, a count, a
verdict or a mean in a sentence), recomputed from the committed entries: a test fails where the
entries and the words disagree. Tables of a leaderboard's own cells are fragments instead
(``test_doc_tables.py``)."""

from __future__ import annotations

import json
import math
import statistics
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import pytest

from clbench.leaderboard.doc_tables import paired_rows, unit_values
from clbench.leaderboard.markdown import md_text

ROOT = Path(__file__).resolve().parents[2]
SHORT = "leaderboards/trace-mini-smollm2-short"
ORDERS = "leaderboards/trace-mini-smollm2-orders"  # MH-MoE against LoRAMoE at the route space, every order
TINY, SMOL = "leaderboards/trace-mini-moe", "leaderboards/trace-mini-smollm2"
# the tiny board's two prompt forms and its LoRAMoE variants, as its tables label them
TINY_FORMS = ("trace-mini", "trace-mini (template=shared)")
LORAMOE4, LORAMOE10 = "loramoe (num_experts=4, top_k=1)", "loramoe (num_experts=10, top_k=5)"
CONSTRAINED = 'loramoe (balance_delta=0.1, balance_weight=0.1, knowledge_tasks=["ScienceQA"], num_experts=4, top_k=1)'


def doc(name: str) -> str:
    """A document with its lines joined, so that a phrase wrapped over two lines is found."""
    return " ".join((ROOT / "docs" / name).read_text(encoding="utf-8").split())


def ok(row) -> list[dict]:
    """A table row's finished runs, as their entries' JSON."""
    return [e.document for e in row.ok]


def rows(boards, directory: str, label: str = "trace-mini") -> dict:
    return {row.label: row for row in boards.table(directory, label, "test").rows}


def pct(value: float, digits: int = 1) -> str:
    return f"{100 * value:.{digits}f}"


def whole(value: float) -> str:
    """A share in whole percent, halves to even as the table has them (34.5 is 34, 39.5 is 40),
    whatever the last bits of a float sum."""
    return str(Decimal(f"{100 * value:.9f}").quantize(Decimal("1"), ROUND_HALF_EVEN))


def by_order(row, score: str) -> dict[str, float]:
    return unit_values(row, score, "order")


def verdicts(boards, directory: str, a: str, b: str, scores: list[str],
             benchmark: str = "trace-mini") -> dict[str, str]:
    """score title -> "holds 0" / "above 0" / "below 0": what the paired fragment says."""
    table = boards.table(directory, benchmark, "test")
    found = {row.label: row for row in table.rows}
    lines = paired_rows(table, scores, [found[a]], [found[b]])[2:]
    return {line.split(" | ")[1]: line.rstrip(" |").rsplit(" | ", 1)[1] for line in lines}


def task_mean(row, name: str, cell) -> list[float]:
    """``cell(entry, j)`` of task ``name`` (its index j in the entry's own order), per run."""
    return [cell(e, e["experiences"].index(name)) for e in ok(row)]


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


# -- datasets.md ------------------------------------------------------------------------------
SPLIT = "leaderboards/fashion-mnist-split"


def test_split_board_meets_the_protocols_predictions(boards):
    """What the protocol predicts (naive class-IL ACC within 1/T ± 2 points, naive's task-IL
    diagonal at 95% or more on every task, joint at 85% or more on class-IL), measured on the
    committed runs, and the ranges docs/datasets.md gives for them."""
    text = doc("datasets.md")
    cil = rows(boards, SPLIT, "fashion-mnist-split")
    til = rows(boards, SPLIT, "fashion-mnist-split (scenario=task-il)")
    naive, tnaive, joint = ok(cil["naive"]), ok(til["naive"]), ok(cil["joint"])
    tasks = len(naive[0]["experiences"])
    acc = [e["scores"]["acc"] for e in naive]
    assert len(naive) == len(tnaive) == 5 and all(abs(a - 1 / tasks) <= 0.02 for a in acc)
    diagonal = [e["r_matrix"][j][j] for e in naive for j in range(tasks)]
    task_diagonal = [e["r_matrix"][j][j] for e in tnaive for j in range(tasks)]
    assert min(task_diagonal) >= 0.95 and min(diagonal) >= 0.95
    assert cil["joint"].stats["acc"].mean >= 0.85
    span = lambda values: f"{pct(min(values))}–{pct(max(values))}"  # noqa: E731
    assert f"ACC {span(acc)} in the five orders" in text
    assert max(diagonal) == max(task_diagonal) == 1.0 and f"its diagonal cells {pct(min(diagonal))}–100)" in text
    ends = span([e["scores"]["acc"] for e in tnaive])
    assert f"(diagonal cells {pct(min(task_diagonal))}–100) and ends at {ends}" in text
    assert f"reaches {pct(cil['joint'].stats['acc'].mean)} ± {pct(cil['joint'].stats['acc'].half)} on class-IL" in text
    assert f"({span([e['scores']['acc'] for e in joint])} by order)" in text


def test_split_board_claims(boards):
    text = doc("datasets.md")
    cil = rows(boards, SPLIT, "fashion-mnist-split")
    til = rows(boards, SPLIT, "fashion-mnist-split (scenario=task-il)")
    table = boards.table(SPLIT, "fashion-mnist-split", "test")
    keep = ["er_ace", "gdumb", "icarl", "derpp", "replay", "gem"]
    means = {label: row.stats["acc"].mean for label, row in cil.items()}
    assert f"ends at {pct(min(means[m] for m in keep))} to {pct(max(means[m] for m in keep))}% on" in text
    letters = table.groups.letters
    assert len(set.intersection(*(set(letters[m]) for m in keep))) >= 1  # one rank group shared by all six
    regularisers = ["lwf", "si", "mas", "ewc"]
    assert all(set(letters[m]) & set(letters["naive"]) for m in regularisers)
    assert "The regularisation methods share naive's rank group (LwF {}, SI {}, MAS {}, EWC {}, naive {})".format(
        *(pct(means[m]) for m in regularisers + ["naive"])) in text
    bwt = {m: cil[m].stats["bwt"].mean for m in regularisers}
    assert f"BWT from {round(100 * max(bwt.values()))} for LwF to {round(100 * min(bwt.values()))} for EWC".replace(
        "-", "−") in text and max(bwt, key=bwt.get) == "lwf" and min(bwt, key=bwt.get) == "ewc"
    agem = [e["scores"]["acc"] for e in ok(cil["agem"])]
    assert f"its orders spanning {pct(min(agem))}–{pct(max(agem))}" in text
    tmeans = {label: row.stats["acc"].mean for label, row in til.items()}
    near = [m for m in tmeans if m != "joint" and tmeans["joint"] - tmeans[m] <= 0.02]
    assert sorted(set(tmeans) - set(near) - {"joint"}) == ["lwf", "naive"]
    assert "every method but LwF and naive ends within 2 points of joint" in text
    tgroups = boards.table(SPLIT, "fashion-mnist-split (scenario=task-il)", "test").groups.letters
    assert set(tgroups["naive"]) & set(tgroups["joint"]) and "even naive" in text
    early = {(label, e["order_label"]): max(e["r_matrix"][j][j + 1] for j in range(len(e["r_matrix"]) - 1))
             for label, row in cil.items() if label != "joint" for e in ok(row)}
    scored = sorted(key for key, value in early.items() if value > 0)
    assert {label for label, _ in scored} == {"er_ace"} and len(scored) == 3
    assert max(early.values()) == pytest.approx(1 / 2000, rel=1e-6)
    assert "ER-ACE, whose loss leaves unseen classes' outputs alone, scored one test image of 2,000 in three of its" \
        " runs; every other run exactly 0" in text


ROTATED = "leaderboards/fashion-mnist-rotated"


def test_rotated_board_claims(boards):
    """docs/datasets.md's Rotated section, recomputed: naive's diagonal and end, joint above every
    sequential method, FWT intervals covering 0, the regularisers' groups against naive's, and
    GDumb's memory holding the first rotation only."""
    text = doc("datasets.md")
    table = boards.table(ROTATED, "fashion-mnist-rotated", "test")
    found = {row.label: row for row in table.rows}
    span = lambda values: f"{pct(min(values))}–{pct(max(values))}"  # noqa: E731
    naive = ok(found["naive"])
    diagonal = [e["r_matrix"][j][j] for e in naive for j in range(len(e["experiences"]))]
    ends = span([e["scores"]["acc"] for e in naive])
    assert len(naive) == 5 and f"(diagonal cells {span(diagonal)}) and ends at {ends}" in text
    joint, letters = found["joint"].stats["acc"], table.groups.letters
    assert table.rows[0].label == "joint" and not set(letters["joint"]) & set(letters[table.rows[1].label])
    by_order = span([e["scores"]["acc"] for e in ok(found["joint"])])
    assert f"reaches {pct(joint.mean)} ± {pct(joint.half)} ({by_order} by order)" in text
    fwt = [row.stats["fwt"] for row in table.rows if row.label != "joint"]
    assert all(f.mean - f.half <= 0 <= f.mean + f.half for f in fwt) and "every method's interval covers 0" in text
    apart = [m for m in ("ewc", "si", "mas") if not set(letters[m]) & set(letters["naive"])]
    assert apart == ["ewc", "si", "mas"] and set(letters["lwf"]) & set(letters["naive"])
    lwf = pct(found["lwf"].stats["acc"].mean)
    assert f"in rank groups that exclude it, while LwF ({lwf}) shares naive's" in text
    gdumb = ok(found["gdumb"])
    first = {pct(e["r_matrix"][-1][0]) for e in gdumb}
    others = [x for e in gdumb for x in e["r_matrix"][-1][1:]]
    assert len(first) == 1
    assert f"({first.pop()} on it at the end in every order, {span(others)} on the other four)" in text
    assert table.rows[-1].label == "gdumb" and "GDumb ends last" in text


def test_thesis_fashion_mnist_prototype_router_claim(boards):
    assert "The prototype router ends highest, with the least forgetting" in doc("datasets.md")
    table = boards.table("leaderboards/thesis-fashion-mnist", "fashion-mnist-rotated", "test")
    best = "naive (model.label=Prototype router)"
    assert table.rows[0].label == best and table.rows[0].rank == 1
    assert max(table.rows, key=lambda row: row.stats["bwt"].mean).label == best
    assert "Its 18 runs were remade" in doc("datasets.md") and sum(len(ok(r)) for r in table.rows) == 18
    assert {e["env"]["git_commit"][:7] for r in table.rows for e in ok(r)} == {"8c0c54c"}
    # "it shares a group with the EMA router only"
    letters = table.groups.letters
    assert [label for label in letters if set(letters[label]) & set(letters[best])] == \
        [best, "naive (model.label=EMA router)"]


# -- language-models.md: SmolLM2 on three tasks, and the tiny random Qwen3 --------------------------
def test_moses_routes_and_keys(boards):
    text = doc("language-models.md")
    tiny, smol = rows(boards, TINY)["moses"], rows(boards, SMOL)["moses"]
    assert {f"{v:.2f}" for v in by_order(tiny, "n_eff").values()} == {"10.31"}
    assert "On the tiny model it went from 68.00 to 10.31 in every order" in text
    smol_neff = {o: f"{v:.2f}" for o, v in by_order(smol, "n_eff").items()}
    assert f"to {smol_neff['standard']} (standard) and {smol_neff['order1']} (order 1)" in text
    final = {e["order_label"]: e["strategy"]["diagnostics"]["task_identification"][-1]["accuracy"] for e in ok(smol)}
    shares = f"{pct(final['standard'], 0)}% and {pct(final['order1'], 0)}%"
    assert f"its keys find the task for {shares} of the prompts" in text
    assert f"{final['standard']:.2f} (standard), {final['order1']:.2f} (order 1)" in text
    for benchmark in TINY_FORMS:
        for label in ("moses", "moses (protect=false)"):
            row = rows(boards, TINY, benchmark)[label]
            stages = [s["accuracy"] for e in ok(row) for s in e["strategy"]["diagnostics"]["task_identification"]]
            assert set(stages) == {1.0} and len(stages) == 4 * 8, (benchmark, label)
    assert "| yes: 1.00 at every stage of every order in both forms (the tasks' content differs) |" in text


def test_smollm2_claims(boards):
    text = doc("language-models.md")
    smol = rows(boards, SMOL)
    assert "seq_ft and replay gain about 30 points per task and keep them: their BWT above is positive" in text
    assert smol["seq_ft"].stats["bwt"].mean > 0 and smol["replay"].stats["bwt"].mean > 0
    assert "no: neither moves (BWT 0.0 in both orders)" in text
    for label in ("mh_moe", "loramoe"):
        assert {pct(v) for v in by_order(smol[label], "bwt").values()} == {"0.0"}
        untrained = [mean(e["r_init"]) for e in ok(smol[label])]
        assert all(abs(e["scores"]["acc"] - u) < 0.01 for e, u in zip(ok(smol[label]), untrained))
    assert "no: both stay at the untrained model's level" in text
    neff = {label: by_order(smol[label], "n_eff") for label in ("mh_moe", "loramoe")}
    assert all(neff["mh_moe"][o] < neff["loramoe"][o] for o in neff["loramoe"])
    assert "| lower in both orders: no finding (route space) |" in text
    assert min(smol.values(), key=lambda row: row.stats["acc"].mean).label == "moses"
    bwt = smol["moses"].stats["bwt"]
    assert f"BWT {pct(bwt.mean)} ± {pct(bwt.half)} (`protect: true`), at the lowest OP of the nine methods" in text
    assert len(smol) == 9
    assert verdicts(boards, SMOL, "o_lora", "seq_lora", ["bwt", "acc"]) == {"BWT": "holds 0", "OP (TRACE)": "holds 0"}


def test_tiny_qwen3_claims(boards):
    """The claims table's tiny-model column and the controls' sentences, in both prompt forms."""
    text = doc("language-models.md")
    scores = ["bwt", "acc", "n_eff", "n_eff_excess"]
    for benchmark in TINY_FORMS:  # at MH-MoE's route space: N_eff − null, BWT and OP tie
        found = verdicts(boards, TINY, "mh_moe", LORAMOE10, scores, benchmark)
        assert found == {"BWT": "holds 0", "OP (TRACE)": "holds 0", "N_eff": "below 0", "N_eff − null": "holds 0"}
        tiny = rows(boards, TINY, benchmark)
        neff = {label: by_order(tiny[label], "n_eff") for label in ("mh_moe", LORAMOE10)}
        assert all(neff["mh_moe"][o] < neff[LORAMOE10][o] for o in neff[LORAMOE10]), benchmark
    assert ("On the tiny model, at MH-MoE's route space LoRAMoE's plug-in N_eff is still higher in every order, "
            "but N_eff − null ties") in text
    assert "| no: N_eff − null ties at the route space in both forms (the plug-in N_eff, lower, is partly" in text
    assert verdicts(boards, TINY, "mh_moe", LORAMOE4, ["bwt", "acc"]) == {"BWT": "holds 0", "OP (TRACE)": "holds 0"}
    tiny = rows(boards, TINY)
    excess = tiny["mh_moe"].stats["n_eff_excess"].mean - tiny[LORAMOE4].stats["n_eff_excess"].mean
    assert f"and is {-excess:.0f} below it at 4" in doc("metrics.md")
    shared = verdicts(boards, TINY, "mh_moe", LORAMOE4, ["bwt", "acc"], TINY_FORMS[1])
    assert shared == {"BWT": "below 0", "OP (TRACE)": "above 0"}  # inside the test set's noise: the doc's ties
    form = rows(boards, TINY, TINY_FORMS[1])
    se = {k: mean(e["scores_stderr"][k] for label in ("mh_moe", LORAMOE4) for e in ok(form[label]))
          for k in ("bwt", "acc")}
    gaps = {k: form["mh_moe"].stats[k].mean - form[LORAMOE4].stats[k].mean for k in ("bwt", "acc")}
    assert all(abs(gaps[k]) < 2 * math.sqrt(2) * se[k] for k in gaps)
    assert (f"a run's BWT has a standard error of about {pct(se['bwt'])} points there, its OP about "
            f"{pct(se['acc'])}") in text
    assert f"(−{pct(-gaps['bwt'])} ± " in text
    assert ("| no: ties with both in both forms (in the shared form it forgets more than K = 4 across orders, "
            "inside") in text
    constrained = verdicts(boards, TINY, CONSTRAINED, LORAMOE4, ["bwt", "acc"])
    assert constrained == {"BWT": "holds 0", "OP (TRACE)": "holds 0"}
    bwt = {label: by_order(rows(boards, TINY)[label], "bwt") for label in (CONSTRAINED, LORAMOE4)}
    diffs = [bwt[CONSTRAINED][o] - bwt[LORAMOE4][o] for o in bwt[LORAMOE4]]
    assert f"| no: a tie ({'+' if mean(diffs) >= 0 else '−'}{pct(abs(mean(diffs)))} ± " in text
    moses_bwt = []
    for benchmark in TINY_FORMS:
        assert verdicts(boards, TINY, "moses (protect=false)", "moses", ["bwt"], benchmark) == {"BWT": "below 0"}
        tiny = rows(boards, TINY, benchmark)
        assert {pct(v) for v in by_order(tiny["moses"], "bwt").values()} == {"0.0"}
        stat = tiny["moses (protect=false)"].stats["bwt"]
        moses_bwt.append(f"{pct(stat.mean)} ± {pct(stat.half)}")
    assert f"no: `protect: false` forgets (BWT {moses_bwt[0]}; {moses_bwt[1]} in the shared form)" in text
    assert verdicts(boards, TINY, "o_lora", "seq_lora", ["bwt", "acc"]) == {"BWT": "holds 0", "OP (TRACE)": "holds 0"}


TASKS = ["MeetingBank", "Py150", "20Minuten"]


def test_what_each_method_keeps_of_the_untrained_model(boards):
    """The zero-shot table: the untrained and final rows per task (mean over the orders), the
    final row's sum over the untrained row's, and the mean gain of the diagonal over ``r_init``."""
    text = (ROOT / "docs" / "language-models.md").read_text(encoding="utf-8")
    smol = rows(boards, SMOL)
    untrained = [mean(task_mean(smol["seq_ft"], t, lambda e, j: e["r_init"][j])) for t in TASKS]
    assert f"| `r_init` (untrained) | {' | '.join(pct(v) for v in untrained)} | | |" in text
    for label in ("seq_ft", "seq_lora", "o_lora", "ewc", "gem", "replay", "loramoe", "mh_moe", "moses"):
        row = smol[label]
        final = [mean(task_mean(row, t, lambda e, j: e["r_matrix"][-1][j])) for t in TASKS]
        learned = mean(mean(e["r_matrix"][j][j] - e["r_init"][j] for j in range(len(e["experiences"])))
                       for e in ok(row))
        kept = f"{100 * sum(final) / sum(untrained):.0f}%"
        gain = f"{'+' if learned >= 0 else ''}{pct(learned)}"
        line = f"| `{label}` | {' | '.join(pct(v) for v in final)} | {kept} | {gain} |"
        assert line in text, line
    summaries = [row[e["experiences"].index("MeetingBank")] for e in ok(smol["moses"]) for row in e["r_matrix"]]
    assert f"MeetingBank's summaries drop to {pct(min(summaries), 0)}-{pct(max(summaries), 0)} whichever task" in doc(
        "language-models.md")
    lora = mean(task_mean(smol["seq_lora"], "MeetingBank", lambda e, j: e["r_matrix"][-1][j]))
    assert f"cost MeetingBank {100 * (untrained[0] - lora):.0f} points ({pct(untrained[0])} -> {pct(lora)})" in doc(
        "language-models.md")


# -- language-models.md: the short-answer suite ------------------------------------------------
SHORT_TASKS = ["C-STANCE", "FOMC", "ScienceQA", "NumGLUE-cm"]
SHORT_METHODS = ["seq_ft", "seq_lora", LORAMOE4, "mh_moe", "moses", "moses (protect=false)"]


def test_the_learned_tables_floor_is_each_test_sets_commonest_answer():
    """The floor of "which tasks each method learned" is the share of the commonest answer in the
    short suite's test set of each task (what answering one letter to every prompt scores)."""
    from collections import Counter

    from clbench.benchmarks.trace_mini import generate
    from clbench.leaderboard.suite import load_suite

    bench = load_suite(ROOT / "configs" / "suites" / "trace-mini-smollm2-short.yaml").runs[0].config["benchmark"]
    args = bench["init_args"]
    assert set(args) == {"tasks", "n_train", "n_test"}  # trace-mini's default seed and prompt form
    test = {task: [r["answer"] for r in splits["test"]] for task, splits in
            generate(args["tasks"], n_train=args["n_train"], n_test=args["n_test"]).items()}
    floor = ",".join(f"{task}:{round(100 * Counter(a).most_common(1)[0][1] / len(a))}" for task, a in test.items())
    text = doc("language-models.md")
    assert text.count(f"<!-- leaderboard-learned: {SHORT} trace-mini floor={floor}") == 2, floor


def test_which_tasks_clear_the_untrained_score(boards):
    """The first column of "which tasks each method learned", counted here on its own: the diagonal
    above the untrained score (0) by more than twice its standard error."""
    text = doc("language-models.md")
    short = rows(boards, SHORT)
    for label in SHORT_METHODS + [LORAMOE10, CONSTRAINED]:
        above = [sum(e["r_matrix"][j][j] - e["r_init"][j] > 2 * e["r_stderr"][j][j]
                     for e in ok(short[label]) for j in [e["experiences"].index(t)]) for t in SHORT_TASKS]
        runs = len(ok(short[label]))
        parts = ", ".join(f"{t} {n}/{runs}" for t, n in zip(SHORT_TASKS, above))
        assert f"| {md_text(label)} | {sum(above)} of {runs * len(SHORT_TASKS)} ({parts}) |" in text, label


def test_o_lora_and_replay_sentences(boards):
    """The short suite's O-LoRA and replay paragraphs, counted from their entries."""
    text = doc("language-models.md")
    short = rows(boards, SHORT)
    lora, ortho, replay = (by_order(short[m], s) for m, s in (("seq_lora", "bwt"), ("o_lora", "bwt"), ("replay", "acc")))
    assert f"ahead in {sum(ortho[o] > lora[o] for o in lora)} of the 4 orders" in text
    assert f"(OP {pct(by_order(short['o_lora'], 'acc')['standard'])})" in text
    assert all(replay[o] > v for o, v in by_order(short["seq_lora"], "acc").items())  # "ahead of seq_lora in every order"
    runs = ok(short["replay"])
    fomc = [(e["r_matrix"][j][j], e["r_matrix"][-1][j]) for e in runs for j in [e["experiences"].index("FOMC")]]
    assert f"(FOMC, {round(100 * mean(d for d, _ in fomc))} on average right after its stage, ends at " \
           f"{round(100 * mean(f for _, f in fomc))})" in text
    evals = [e["compute"]["eval_seconds"] for m in ("o_lora", "replay") for e in ok(short[m])]
    assert f"{min(evals):.0f}-{max(evals):.0f} s of each run" in text
    every = [e["compute"] for row in short.values() for e in ok(row)]
    hours = sum(c["wall_seconds"] for c in every) / 3600
    train = sum(c["train_seconds"] for c in every) / 3600
    assert f"record {hours:.1f} hours of run time, about {hours / 2:.1f} with two side by side" in text
    assert f"training alone is {train:.1f} hours ({train / 2:.1f} with two side by side)" in text


def test_short_suite_sentences(boards):
    text = doc("language-models.md")
    short = rows(boards, SHORT)
    se = mean(e["scores_stderr"]["acc"] for row in short.values() for e in ok(row))
    assert f"a run's OP has a test-set standard error of about {pct(se)} points" in text
    wins = {s: sum(by_order(short["mh_moe"], s)[o] > v for o, v in by_order(short[LORAMOE4], s).items())
            for s in ("bwt", "acc")}
    assert f"MH-MoE forgets less in {wins['bwt']} of the 4 orders, and its OP is higher in {wins['acc']} of 4" in text
    neff = {label: by_order(short[label], "n_eff") for label in ("mh_moe", LORAMOE4, "moses")}
    assert all(neff["mh_moe"][o] < neff[LORAMOE4][o] for o in neff[LORAMOE4])
    stat = {label: short[label].stats["n_eff"].mean for label in neff}
    assert f"(N_eff {stat['mh_moe']:.1f} against {stat[LORAMOE4]:.1f}, lower in every order)" in text
    assert (f"MoSEs' N_eff ({stat['moses']:.2f})" in text and f"LoRAMoE's ({stat[LORAMOE4]:.2f}," in text
            and f"MH-MoE's ({stat['mh_moe']:.2f}," in text)
    stages = [s["accuracy"] for e in ok(short["moses"]) for s in e["strategy"]["diagnostics"]["task_identification"]]
    assert set(stages) == {1.0} and "(100% at every stage of every order)" in text
    assert "identification accuracy 1.00 after the last stage of every order, and at every stage" in text
    assert {pct(v) for v in by_order(short["moses"], "bwt").values()} == {"0.0"}
    assert "its BWT is 0.0 in every order" in text and "(BWT 0.0 in every order, above both mixtures" in text


def test_short_suite_moses_without_protection(boards):
    """The control of "MoSEs barely forgets" on SmolLM2: protect: false ties with protect: true
    on BWT, its keys still find every task, and it learned fewer rules (the doc's table)."""
    text = doc("language-models.md")
    short = rows(boards, SHORT)
    found = verdicts(boards, SHORT, "moses (protect=false)", "moses", ["bwt", "acc", "forgetting"])
    assert found == {"BWT": "holds 0", "OP (TRACE)": "holds 0", "Forgetting": "holds 0"}
    stat = short["moses (protect=false)"].stats["bwt"]
    assert f"Without protection MoSEs still barely forgets here (BWT {pct(stat.mean)} ± {pct(stat.half)}" in text
    assert f"(BWT {pct(stat.mean)} ± {pct(stat.half)} against 0.0)" in text
    stages = [s["accuracy"] for e in ok(short["moses (protect=false)"])
              for s in e["strategy"]["diagnostics"]["task_identification"]]
    assert set(stages) == {1.0} and len(stages) == 16
    assert ("| moses (protect=false) | 16 of 16 (C-STANCE 4/4, FOMC 4/4, ScienceQA 4/4, NumGLUE-cm 4/4) "
            "| 2 of 16") in text
    assert "it learned even less (2 of its 16 diagonals clear one answer for every prompt, against 3" in text


def test_short_suite_route_space_control(boards):
    """MH-MoE against LoRAMoE at its route space on SmolLM2: BWT and OP tie, and both the plug-in
    N_eff and N_eff − null are lower in every order (the one seeds' claim the suite finds)."""
    text = doc("language-models.md")
    short = rows(boards, SHORT)
    found = verdicts(boards, SHORT, "mh_moe", LORAMOE10, ["bwt", "acc", "n_eff", "n_eff_excess"])
    assert found == {"BWT": "holds 0", "OP (TRACE)": "holds 0", "N_eff": "below 0", "N_eff − null": "below 0"}
    for score in ("n_eff", "n_eff_excess"):
        values = {label: by_order(short[label], score) for label in ("mh_moe", LORAMOE10)}
        assert all(values["mh_moe"][o] < values[LORAMOE10][o] for o in values[LORAMOE10]), score
    excess = [by_order(short["mh_moe"], "n_eff_excess")[o] - v
              for o, v in by_order(short[LORAMOE10], "n_eff_excess").items()]
    assert f"| yes, at the route space: N_eff − null lower in every order (−{-mean(excess):.2f} ± " in text
    assert f"and so is N_eff − null, by {-mean(excess):.1f}, an interval that excludes 0" in text
    remade = ok(short["mh_moe"])  # remade for the control, pinned, with the R and N_eff of before
    assert {e["env"]["git_commit"][:7] for e in remade} == {"d0c6c6b"}
    assert all(e["env"]["cpu"]["pin"] == "avx2" for e in remade)
    neff = {label: by_order(short[label], "n_eff") for label in ("mh_moe", LORAMOE10, LORAMOE4)}
    gaps = [mean(neff[b][o] - neff["mh_moe"][o] for o in neff[b]) for b in (LORAMOE10, LORAMOE4)]
    assert f"here too, by {gaps[0]:.1f} (against {gaps[1]:.1f} below the 4-route LoRAMoE's)" in text
    ops = [100 * v for v in by_order(short[LORAMOE10], "acc").values()]
    assert f"its OP runs from {min(ops):.0f} to {max(ops):.0f})" in text
    assert all(e["scores"]["n_eff_excess"] is not None for e in ok(short[LORAMOE10]) + remade)
    bwt = [by_order(short["mh_moe"], "bwt")[o] - v for o, v in by_order(short[LORAMOE10], "bwt").items()]
    assert f"and at the route space (+{pct(mean(bwt))} ± " in text


def test_every_order_suite_power(boards):
    """The every-order suite's sentences: the orders run, the power they reached for the MH-MoE
    paper's gaps, the spread across orders and the test sets' floor, what all 24 orders would
    detect, and in how many orders N_eff − null is lower."""
    from clbench.leaderboard.pairs import plan
    from clbench.leaderboard.power import PairNoise

    text = doc("language-models.md")
    table = boards.table(ORDERS, "trace-mini", "test")
    found = {row.label: row for row in table.rows}
    bwt, acc = (plan(table, m, "mh_moe", "loramoe", gap=g) for m, g in (("bwt", 0.067), ("acc", 0.089)))
    n = bwt["orders_run"]
    assert bwt["orders_possible"] == 24 and len(table.orders) == n
    assert f"**Results so far: {n} of the 24 orders**" in text
    assert f"these orders detect it with {bwt['power_reached']['planned']:.0%} power, and not even all 24 would" in text
    assert bwt["orders_needed"]["planned"] is None
    assert f"The pair's BWT difference spreads {pct(bwt['sd_orders'])} points from order to order" in text
    alone, both = (PairNoise(bwt["sd_orders"] ** 2, v, 24).detectable(0.05) for v in (0.0, bwt["sd_test"] ** 2))
    assert f"would detect only gaps above {pct(alone, 0)} points with 80% power ({pct(both, 0)} with it)" in text
    assert PairNoise(bwt["sd_orders"] ** 2, bwt["sd_test"] ** 2, 24).power(0.067, 0.05) < 0.8
    assert alone > 0.067 and f"test-set standard error of about {pct(bwt['sd_test'])} points" in text
    assert f"the paper's 8.9-point gap: {acc['power_reached']['planned']:.0%} power; 80% would take " \
           f"{acc['orders_needed']['planned']} orders" in text and acc["orders_needed"]["planned"] > 24
    excess = {label: by_order(found[label], "n_eff_excess") for label in ("mh_moe", "loramoe")}
    lower = sum(v < excess["loramoe"][o] for o, v in excess["mh_moe"].items())
    assert f"N_eff − null is lower for MH-MoE in {lower} of the {n} orders" in text
    assert lower == n and f"and in all {n} of {n} orders of the every-order suite" in text  # the claims table
    tie = mean(by_order(found["mh_moe"], "bwt")[o] - v for o, v in by_order(found["loramoe"], "bwt").items())
    assert f"(+6.3 ± 58.1; over {n} orders {'+' if tie >= 0 else ''}{pct(tie)} ± " in text
    assert f"{bwt['power_reached']['planned']:.0%} power for the paper's gap)" in text


def test_short_suite_constraint_control(boards):
    """LoRAMoE's balancing constraint on SmolLM2: BWT and OP tie with the unconstrained LoRAMoE, N_eff
    is lower in every order at the same 4 routes."""
    text = doc("language-models.md")
    found = verdicts(boards, SHORT, CONSTRAINED, LORAMOE4, ["bwt", "acc", "n_eff"])
    assert found == {"BWT": "holds 0", "OP (TRACE)": "holds 0", "N_eff": "below 0"}
    short = rows(boards, SHORT)
    neff = {label: by_order(short[label], "n_eff") for label in (CONSTRAINED, LORAMOE4)}
    gaps = [neff[LORAMOE4][o] - neff[CONSTRAINED][o] for o in neff[LORAMOE4]]
    assert min(gaps) > 0 and f"it lowers N_eff in every order, by about {mean(gaps):.0f}" in text
    bwt = [by_order(short[CONSTRAINED], "bwt")[o] - v for o, v in by_order(short[LORAMOE4], "bwt").items()]
    assert f"| no: a tie ({pct(mean(bwt)).replace('-', '−')} ± " in text
    made = ok(short[CONSTRAINED])
    assert {e["env"]["git_commit"][:7] for e in made} == {"d0c6c6b"} and len(made) == 4


@pytest.mark.parametrize("a, b, expected, words", [
    ("mh_moe", LORAMOE4, {"BWT": "holds 0", "OP (TRACE)": "holds 0"}, "neither difference is outside the noise"),
    ("moses", "mh_moe", {"BWT": "above 0", "OP (TRACE)": "holds 0"}, "so its OP ties both"),
    ("moses", LORAMOE4, {"BWT": "above 0", "OP (TRACE)": "holds 0"}, "so its OP ties both"),
    ("seq_lora", "seq_ft", {"BWT": "below 0", "OP (TRACE)": "above 0"}, "seq_lora and loramoe forget more than it"),
    (LORAMOE4, "seq_ft", {"BWT": "below 0", "OP (TRACE)": "above 0"}, "seq_lora and loramoe forget more than it"),
    ("mh_moe", "seq_ft", {"BWT": "holds 0", "OP (TRACE)": "above 0"}, "every other method's OP is above its own"),
    ("moses", "seq_ft", {"BWT": "holds 0", "OP (TRACE)": "above 0"}, "every other method's OP is above its own"),
    (LORAMOE4, "seq_lora", {"BWT": "holds 0", "OP (TRACE)": "holds 0"}, "BWT: loramoe and mh_moe tie with it"),
    ("mh_moe", "seq_lora", {"BWT": "holds 0", "OP (TRACE)": "above 0"}, "mh_moe is higher"),
    ("moses", "seq_lora", {"BWT": "above 0", "OP (TRACE)": "holds 0"}, "moses forgets less; OP: loramoe and moses tie"),
])
def test_short_suite_verdicts(boards, a, b, expected, words):
    assert verdicts(boards, SHORT, a, b, ["bwt", "acc"]) == expected
    assert words in doc("language-models.md")


# -- strategies.md ------------------------------------------------------------------------------
def test_trace_mini_moe_sentences(boards):
    text = doc("strategies.md")
    tiny = rows(boards, TINY)
    learned = {label: mean(mean(e["r_matrix"][j][j] - e["r_init"][j] for j in range(len(e["experiences"])))
                           for e in ok(row)) for label, row in tiny.items()}
    named = {"mh_moe": "mh_moe", LORAMOE4: LORAMOE4, LORAMOE10: LORAMOE10, CONSTRAINED: "loramoe with the constraint",
             "seq_lora": "seq_lora", "o_lora": "o_lora", "moses": "moses",
             "moses (protect=false)": "moses (protect=false)"}
    assert set(named) == set(tiny)
    listed = ", ".join(f"{name} {pct(learned[label])}" for label, name in named.items())
    assert f"orders, percent): {listed}." in text
    others = [round(100 * v) for label, v in learned.items() if not label.startswith("moses")]
    assert (f"({pct(learned['moses'])} points with `protect: true`, {pct(learned['moses (protect=false)'])}\nwithout, "
            f"against {min(others)}-{max(others)})").replace("\n", " ") in text
    py150 = mean(task_mean(tiny["moses"], "Py150", lambda e, j: e["r_matrix"][j][j] - e["r_init"][j]))
    assert f"Py150 falls below its untrained score ({pct(py150, 0).replace('-', '−')})" in text
    assert {f"{v:.2f}" for v in by_order(tiny["moses"], "n_eff").values()} == {"10.31"}
    assert "N_eff (10.31, equal for every order)" in text
    for b in (LORAMOE4, LORAMOE10):
        assert verdicts(boards, TINY, "mh_moe", b, ["bwt"]) == {"BWT": "holds 0"}
    assert "MH-MoE's BWT is within the noise of LoRAMoE's against both (the paired intervals hold 0)" in text
    assert verdicts(boards, TINY, "mh_moe", LORAMOE10, ["n_eff_excess"]) == {"N_eff − null": "holds 0"}
    stat = tiny["moses (protect=false)"].stats["bwt"]
    assert f"it forgets (BWT −{pct(-stat.mean)} ± {pct(stat.half)}, below `protect: true`'s in every order)" in text
    assert all(v < 0 for v in by_order(tiny["moses (protect=false)"], "bwt").values())
    stages = [s["accuracy"] for e in ok(tiny["moses"]) for s in e["strategy"]["diagnostics"]["task_identification"]]
    assert set(stages) == {1.0} and len(ok(tiny["moses"])) == 4
    assert "task-identification accuracy 1.00 in all four orders" in text and "(BWT 0.0 in every order)" in text
    standard = next(e for e in ok(tiny["moses"]) if e["order_label"] == "standard")
    identified = [a for s in standard["strategy"]["diagnostics"]["task_identification"] for a in s["per_task"].values()]
    assert set(identified) == {1.0} and "(standard order) it is 1.00 for every task at every stage" in text
    s = standard["scores"]
    assert f"ACC {pct(s['acc'])}, BWT {pct(s['bwt'])}, forgetting {pct(s['forgetting'])})" in text


def test_grow_claim(boards):
    bwt = {label: row.stats["bwt"].mean for label, row in rows(boards, "leaderboards/grow").items()}
    grown = [bwt["grow (variant=freeze)"], bwt["grow (variant=train)"]]
    assert bwt["seq_ft"] < min(grown) and max(grown) < bwt["seq_lora"]
    assert "G-Freeze and G-Train forget less than sequential full fine-tuning (seq_ft) and more than one shared LoRA" \
           in doc("strategies.md")


# -- moe-vit.md -------------------------------------------------------------------------------
ROUTERS = {"MoE (switch)": ("MoE", "blocks.4.mlp", "blocks.5.mlp"), "MoE-many (8 experts, top-2)":
           ("MoE-many", "blocks.4.mlp", "blocks.5.mlp"), "EMA router": ("EMA router", "blocks.4.mlp", "blocks.5.mlp"),
           "Prototype router": ("Prototype router", "router", None)}


def thesis_runs(boards) -> dict[str, list[dict]]:
    """model label -> its runs on leaderboards/thesis, by seed."""
    table = boards.table("leaderboards/thesis", "digits-domains", "test")
    return {ok(row)[0]["config"]["model"]["init_args"]["label"]: sorted(ok(row), key=lambda e: e["seed"])
            for row in table.rows}


def bits(stage: dict, layer: str) -> float:
    """I(D;E) of a stage's layer in bits (entries record it in nats, domains weighted equally)."""
    return stage[layer]["mutual_information"] / math.log(2)


def test_thesis_utilisation_and_specialisation(boards):
    text = (ROOT / "docs" / "moe-vit.md").read_text(encoding="utf-8")
    runs = thesis_runs(boards)
    shown = {name: ROUTERS[name] for name in ("MoE (switch)", "EMA router", "Prototype router")}
    domains = runs["MoE"][0]["experiences"]
    for d, domain in enumerate(domains):  # the final utilisation at the first routing layer, mean over the seeds
        cells = [" ".join(f"{mean(e['expert_utilization'][-1][layer]['utilization'][d][k] for e in runs[label]):.2f}"
                          .lstrip("0") for k in range(4)) for label, layer, _ in shown.values()]
        assert f"| {domain} | {' | '.join(cells)} |" in text, domain
    for name, (label, first, second) in ROUTERS.items():
        cells = []
        for layer in (first, second):
            if layer is None:
                cells.append("—")
                continue
            values = [bits(e["expert_utilization"][-1], layer) for e in runs[label]]
            cells.append(f"{mean(values):.2f} ± {statistics.stdev(values):.2f}"
                         + (f" ({', '.join(f'{v:.2f}' for v in values)})" if name == "Prototype router" else ""))
        assert f"| {name} | {' | '.join(cells)} |" in text, name
    prose = doc("moe-vit.md")
    final = {(label, layer): [bits(e["expert_utilization"][-1], layer) for e in runs[label]]
             for label in ("MoE", "EMA router") for layer in ("blocks.4.mlp", "blocks.5.mlp")}
    ema4, moe4 = final["EMA router", "blocks.4.mlp"], final["MoE", "blocks.4.mlp"]
    assert (f"({mean(ema4):.2f} ± {statistics.stdev(ema4):.2f} against "
            f"{mean(moe4):.2f} ± {statistics.stdev(moe4):.2f} "
            f"at block 4, {mean(final['EMA router', 'blocks.5.mlp']):.2f} against "
            f"{mean(final['MoE', 'blocks.5.mlp']):.2f} at block 5;") in prose
    every = {(label, layer): f"{mean(bits(s, layer) for e in runs[label] for s in e['expert_utilization']):.2f}"
             for label in ("MoE", "EMA router") for layer in ("blocks.4.mlp", "blocks.5.mlp")}
    assert (f"averaged over all five stages {every['EMA router', 'blocks.4.mlp']} against "
            f"{every['MoE', 'blocks.4.mlp']} at block 4, {every['EMA router', 'blocks.5.mlp']} against "
            f"{every['MoE', 'blocks.5.mlp']} at block 5") in prose
    seed1 = bits(runs["Prototype router"][1]["expert_utilization"][-1], "router")
    assert f"Seed 1 stays mixed (I = {seed1:.2f})" in prose


def test_thesis_routing_sentences(boards):
    prose = doc("moe-vit.md")
    runs = thesis_runs(boards)
    final = {label: [e["expert_utilization"][-1] for e in runs[label]] for label in ("MoE", "Prototype router")}
    switch = [[row for row in stage["blocks.4.mlp"]["utilization"]] for stage in final["MoE"]]
    assert max(row[3] for row in switch[0]) <= 0.02 and "seed 0 leaves expert 3 at 2% or less in every domain" in prose
    assert f"seed 1 gives expert 0 {pct(min(r[0] for r in switch[1]), 0)}-{pct(max(r[0] for r in switch[1]), 0)}%" \
           in prose
    domains = runs["MoE"][0]["experiences"]
    turns = [max(final["Prototype router"][seed]["router"]["utilization"][domains.index(d)]) for seed in (0, 2)
             for d in ("rot90", "rot270")]
    assert f"({pct(min(turns), 0)}-{pct(max(turns), 0)}%) to one expert" in prose
    forgetting = {label: mean(x["scores"]["forgetting"] for x in r) for label, r in runs.items()}
    aia = {label: mean(x["scores"]["aia"] for x in r) for label, r in runs.items()}
    others = [label for label in runs if label != "Prototype router"]

    def span(values: dict) -> str:  # the others' range in whole points, outward
        return f"{math.floor(100 * min(values[o] for o in others))}-{math.ceil(100 * max(values[o] for o in others))}"

    least = pct(forgetting["Prototype router"])
    assert f"(forgetting {least} against about {span(forgetting)} for the others)" in prose
    assert f"lags in AIA ({pct(aia['Prototype router'])} against {span(aia)})" in prose


# -- moe-theory.md ----------------------------------------------------------------------------
def test_moe_theory_table_and_claims(boards):
    """F_T and G_T at the last round (the paper's Eqs. 15-16 from each run's R of errors), mean ±
    sample std over the seeds, and the off / on ratios (``examples/moe_theory_leaderboard.py``)."""
    import torch

    from clbench.metrics.theory import forgetting_curve, generalisation_curve

    text = (ROOT / "docs" / "moe-theory.md").read_text(encoding="utf-8")
    finals = {}
    for row in boards.table("leaderboards/moe-theory", "moe-regression", "test").rows:
        cfg = ok(row)[0]["config"]
        r = [torch.tensor(e["r_matrix"], dtype=torch.float64) for e in ok(row)]
        finals[cfg["model"]["init_args"]["num_experts"], cfg["strategy"]["init_args"]["terminate"]] = (
            [float(forgetting_curve(m)[-1]) for m in r], [float(generalisation_curve(m)[-1]) for m in r])

    def stat(values: list[float]) -> str:
        return f"{mean(values):.3f} ± {statistics.stdev(values):.3f}"

    ratio = {m: [mean(finals[m, False][k]) / mean(finals[m, True][k]) for k in (0, 1)] for m in (1, 5, 10, 20)}
    assert finals[1, True] == finals[1, False]
    one = finals[1, True]
    assert f"| 1 | on / off (identical) | {stat(one[0])} | {stat(one[1])} | 1.00 | 1.00 |" in text
    for m in (5, 10, 20):
        on, off = finals[m, True], finals[m, False]
        assert f"| {m} | on | {stat(on[0])} | {stat(on[1])} | {ratio[m][0]:.2f} | {ratio[m][1]:.2f} |" in text, m
        assert f"| {m} | off | {stat(off[0])} | {stat(off[1])} | | |" in text, m
    prose = doc("moe-theory.md")
    assert f"falls {ratio[5][0]:.2f}x (M = 5), {ratio[10][0]:.2f}x (M = 10), {ratio[20][0]:.2f}x (M = 20)" in prose
    g_on = [mean(finals[m, True][1]) for m in (5, 10, 20)]
    g_off = [mean(finals[m, False][1]) for m in (1, 5, 10, 20)]
    assert f"(`G_T` {min(g_on):.2f}-{max(g_on):.2f} against {mean(finals[1, True][1]):.2f})" in prose
    assert f"(`G_T` {min(g_off):.2f}-{max(g_off):.2f})" in prose
    f10, f20 = mean(finals[10, True][0]), mean(finals[20, True][0])
    assert f"`F_T` is {f10:.2f} for M = 10 at round 100" in prose and f"(`F_T` {f20:.2f} against {f10:.2f})" in prose


def test_the_boards_docs_call_unpinned_are_those_with_unpinned_entries():
    """docs/leaderboard.md names the boards whose entries do not all rerun exactly on another CPU
    class (made with unpinned kernels); the entries say which those are."""
    unpinned = {}
    for path in sorted((ROOT / "leaderboards").glob("*/entries/*.json")):
        pin = ((json.loads(path.read_text()).get("env") or {}).get("cpu") or {}).get("pin")
        if pin is None:
            board = path.parent.parent.name
            unpinned[board] = unpinned.get(board, 0) + 1
    text = doc("leaderboard.md")
    assert f"(all but the {unpinned['trace-mini-smollm2-short']} oldest entries of `trace-mini-smollm2-short`)" in text
    assert set(unpinned) == {"trace-mini-smollm2-short"}
