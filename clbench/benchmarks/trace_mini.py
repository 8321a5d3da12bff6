"""``trace-mini``: eight small generated tasks in TRACE's format, so a language-model run needs no
download.

Each task has the name, answer form and metric of its TRACE counterpart, and its answers follow
a rule a tiny model can learn from a few hundred examples:

* C-STANCE: stance of a sentence toward a target, A (favor) / B (against) / C (neutral), set by
  the verb (TRACE's C-STANCE is Chinese; this one is English to keep the vocabulary small).
* FOMC: hawkish/dovish/neutral policy sentence, A (dovish) / B (hawkish) / C (neutral).
* MeetingBank: a meeting transcript; the summary is its decision sentence(s), copied.
* Py150: Python in Py150's token form (``<EOL>``, ``<NUM_LIT:..>``, ``<STR_LIT>``); the answer is
  the next line, which the code's pattern determines (getter, setter, accumulator, ...).
* ScienceQA: which of three or four options belongs to a category; the answer is its letter.
* NumGLUE-cm: commonsense fact times a count ("How many legs do 3 spiders have?").
* NumGLUE-ds: domain word problems with one addition or subtraction.
* 20Minuten: German sentences simplified by rule: intensifiers and time phrases dropped,
  hard words replaced from a fixed lexicon.

Generation is deterministic (``random.Random`` seeded per task and split). Prompts are unique
within a task across train, eval and test, so the test set checks more than recall.

``template: shared`` writes every task's prompt in one form, ``Input: <content>\nOutput:``,
without its instruction or field names (the same draws, so the same answers): which task a
prompt belongs to must then be told from its content, as a method that identifies tasks at
test time (MoSEs' keys) must do on real data, where formats are not a giveaway.

    python -m clbench.benchmarks.trace_mini OUTDIR [--n-train 500 --n-eval 50 --n-test 100 --seed 0] [--template shared]

writes the set in TRACE's on-disk layout (``OUTDIR/<Task>/{train,eval,test}.json``), readable by
the ``trace`` benchmark.

Its tokenizer (``tokenizer: trace-mini`` in a model config) is a byte-level BPE trained offline
on the default set's texts and shipped in ``clbench/benchmarks/assets/trace-mini-tokenizer``; it loads
through ``AutoTokenizer.from_pretrained`` like any saved tokenizer. :func:`write_tokenizer`
trains it again, bit for bit.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Annotated, Callable, Literal

from pydantic import Field

from clbench.benchmarks.trace import SPLITS, TASKS, ScenarioType, Scoring, Tasks, in_order, scenario_from_records, write_trace
from clbench.errors import UserError
from clbench.config.validation import ArgumentError

Record = dict[str, str]


def _pick(rng: random.Random, items):
    return items[rng.randrange(len(items))]


SUBJECTS = ["I", "My neighbour", "Our teacher", "The mayor", "Everyone here", "My sister", "The reporter",
            "Our coach"]
STANCE_VERBS = {
    "A": ["strongly supports", "really likes", "is happy about", "welcomes", "praises"],
    "B": ["strongly opposes", "really dislikes", "is angry about", "rejects", "criticises"],
    "C": ["heard about", "read a report on", "asked a question about", "wrote a note on", "talked about"],
}
STANCE_TARGETS = ["the new park", "the tax plan", "the school reform", "the bike lanes", "the football club",
                  "the night market", "the housing law", "the city museum", "the bus line", "the water project"]
TAILS = ["this week.", "yesterday.", "at the meeting.", "on the radio.", "online.", "again."]


def c_stance(rng: random.Random) -> Record:
    label = _pick(rng, "ABC")
    target = _pick(rng, STANCE_TARGETS)
    text = f"{_pick(rng, SUBJECTS)} {_pick(rng, STANCE_VERBS[label])} {target} {_pick(rng, TAILS)}"
    prompt = ("Decide the stance of the text toward the target. A: favor, B: against, C: neutral.\n"
              f"Text: {text}\nTarget: {target}\nStance:")
    return {"prompt": prompt, "answer": label, "content": f"{text} ({target})"}


FOMC_ACTORS = ["The Committee", "Participants", "Members", "Several officials", "The Board", "Most policymakers"]
FOMC_ACTIONS = {
    "A": ["decided to lower", "agreed to ease", "saw a need to cut", "favored reducing"],
    "B": ["decided to raise", "agreed to tighten", "saw a need to increase", "favored lifting"],
    "C": ["decided to keep", "agreed to maintain", "saw no need to change", "favored holding"],
}
FOMC_OBJECTS = ["the target range for the federal funds rate", "the policy rate", "interest rates",
                "the discount rate"]
FOMC_REASONS = ["given inflation data.", "in light of labor market conditions.", "as growth moderated.",
                "after reviewing the outlook.", "given financial conditions."]


def fomc(rng: random.Random) -> Record:
    label = _pick(rng, "ABC")
    text = f"{_pick(rng, FOMC_ACTORS)} {_pick(rng, FOMC_ACTIONS[label])} {_pick(rng, FOMC_OBJECTS)} " \
           f"{_pick(rng, FOMC_REASONS)}"
    prompt = ("What is the monetary policy stance of the text? A: dovish, B: hawkish, C: neutral. "
              f"Answer with A, B or C.\nText: {text}\nAnswer:")
    return {"prompt": prompt, "answer": label, "content": text}


DECISION_VERBS = ["approve", "reject", "delay", "amend", "fund"]
DECISION_ITEMS = ["the budget for the new library", "a contract for street repairs", "the zoning change on Main Street",
                  "a grant for youth programs", "the parking plan downtown", "new rules for food trucks",
                  "the overtime request", "a park renovation", "the water rate increase", "a bike share pilot"]
TOPICS = ["parking", "snow removal", "the harbor", "bus service", "noise", "the budget", "housing", "trees"]
FILLERS = ["Speaker {k} thanked the staff for the report.", "Public comment was heard on {topic}.",
           "A member asked about {topic}.", "The clerk read the agenda.", "Staff presented an update on {topic}.",
           "Speaker {k} raised a concern about {topic}."]


def meetingbank(rng: random.Random) -> Record:
    items = rng.sample(DECISION_ITEMS, rng.choice((1, 1, 2)))
    decisions = [f"The council voted to {_pick(rng, DECISION_VERBS)} {item}." for item in items]
    fillers = [_pick(rng, FILLERS).format(k=rng.randrange(1, 9), topic=_pick(rng, TOPICS))
               for _ in range(rng.randrange(2, 4))]
    turns = fillers + decisions
    rng.shuffle(turns)
    summary = " ".join(t for t in turns if t in decisions)
    prompt = f"Write a summary of the following meeting transcript.\nTranscript: {' '.join(turns)}\nSummary:"
    return {"prompt": prompt, "answer": summary, "content": " ".join(turns)}


NAMES = ["count", "name", "size", "value", "total", "label", "speed", "owner", "color", "score", "price", "level"]
CLASSES = ["Account", "Player", "Config", "Item", "Node", "Record", "Sensor", "Task"]
COLLECTIONS = ["items", "values", "rows", "numbers", "prices", "scores"]


def py150(rng: random.Random) -> Record:
    cls, (a, b) = _pick(rng, CLASSES), rng.sample(NAMES, 2)
    num, v, coll = rng.randrange(0, 100), _pick(rng, ["x", "v", "item", "n"]), _pick(rng, COLLECTIONS)
    head = (f"class {cls} ( object ) : <EOL> def __init__ ( self ) : <EOL> self . {a} = <NUM_LIT:{num}> <EOL> "
            f"self . {b} = <STR_LIT> <EOL> ")
    kind = rng.randrange(4)
    if kind == 0:
        code, answer = head + f"def get_{a} ( self ) : <EOL>", f"return self . {a} <EOL>"
    elif kind == 1:
        code, answer = head + f"def set_{b} ( self , value ) : <EOL>", f"self . {b} = value <EOL>"
    elif kind == 2:
        code = f"def sum_{coll} ( {coll} ) : <EOL> total = <NUM_LIT:0> <EOL> for {v} in {coll} : <EOL>"
        answer = f"total += {v} <EOL>"
    else:
        code = (f"def show_{a} ( {a} ) : <EOL> print ( <STR_LIT:{a}> , {a} ) <EOL> "
                f"if __name__ == <STR_LIT:__main__> : <EOL>")
        answer = f"show_{a} ( <NUM_LIT:{num}> ) <EOL>"
    return {"prompt": f"Complete the next line of the Python code.\n<s> {code}\nNext line:", "answer": answer,
            "content": f"<s> {code}"}


CATEGORIES = {
    "mammal": ["dog", "cat", "horse", "whale", "bat", "cow", "goat", "rabbit"],
    "bird": ["eagle", "robin", "owl", "penguin", "parrot", "duck"],
    "fish": ["trout", "salmon", "shark", "tuna", "cod"],
    "metal": ["iron", "copper", "silver", "gold", "zinc"],
    "planet": ["Mars", "Venus", "Jupiter", "Saturn", "Mercury"],
}


def scienceqa(rng: random.Random) -> Record:
    cats = list(CATEGORIES)
    cat = _pick(rng, cats)
    n = rng.choice((3, 4))
    others = [c for c in cats if c != cat]
    options = [_pick(rng, CATEGORIES[cat])] + [_pick(rng, CATEGORIES[c]) for c in rng.sample(others, n - 1)]
    rng.shuffle(options)
    correct = next(i for i, o in enumerate(options) if o in CATEGORIES[cat])
    letters = "ABCD"
    listing = " ".join(f"({letters[i]}) {o}" for i, o in enumerate(options))
    prompt = f"Question: Which of these is a {cat}?\nOptions: {listing}\nAnswer:"
    return {"prompt": prompt, "answer": letters[correct], "content": f"Which of these is a {cat}? {listing}"}


FACTS = [("spider", "spiders", "legs", 8), ("dog", "dogs", "legs", 4), ("bird", "birds", "legs", 2),
         ("car", "cars", "wheels", 4), ("bicycle", "bicycles", "wheels", 2), ("tricycle", "tricycles", "wheels", 3),
         ("hand", "hands", "fingers", 5), ("triangle", "triangles", "sides", 3), ("square", "squares", "sides", 4),
         ("hexagon", "hexagons", "sides", 6), ("octopus", "octopuses", "arms", 8), ("week", "weeks", "days", 7)]
PEOPLE = ["Anna", "Ben", "Carla", "David", "Eva", "Felix", "Gina", "Hugo", "Ines", "Jonas"]


def numglue_cm(rng: random.Random) -> Record:
    _, plural, part, per = _pick(rng, FACTS)
    k = rng.randrange(1, 10)
    question = f"{_pick(rng, PEOPLE)} counts {k} {plural}. How many {part} do they have in total?"
    return {"prompt": f"Solve the problem. Give only the number.\nQuestion: {question}\nAnswer:",
            "answer": str(per * k), "content": question}


UNITS = [("grams of salt", "a solution"), ("liters of water", "a tank"), ("moles of gas", "a flask"),
         ("kilograms of sand", "a truck"), ("milliliters of acid", "a beaker")]


def numglue_ds(rng: random.Random) -> Record:
    unit, container = _pick(rng, UNITS)
    a, b = rng.randrange(10, 31), rng.randrange(1, 10)
    if rng.random() < 0.5:
        question = f"{container.capitalize()} holds {a} {unit}. {b} more are added. How many {unit} does it hold now?"
        answer = a + b
    else:
        question = f"{container.capitalize()} holds {a} {unit}. {b} are removed. How many {unit} does it hold now?"
        answer = a - b
    return {"prompt": f"Solve the problem. Give only the number.\nQuestion: {question}\nAnswer:",
            "answer": str(answer), "content": question}


NOUN_PHRASES = [("Der Mediziner", "Der Arzt"), ("Das Automobil", "Das Auto"), ("Der Hund", "Der Hund"),
                ("Die Lehrerin", "Die Lehrerin"), ("Der Velofahrer", "Der Velofahrer"),
                ("Die Bevölkerung", "Das Volk"), ("Der Nachwuchs", "Das Kind"), ("Die Polizei", "Die Polizei")]
VERBS = ["arbeitet", "spricht", "fährt", "lacht", "wartet", "singt"]
TIMES = ["am Abend", "am Montag", "in der Nacht", "seit Jahren", "heute Morgen"]
INTENSIFIERS = ["sehr", "äusserst", "ausgesprochen", "überaus"]
ADVERBS = ["schnell", "laut", "ruhig", "gern", "viel", "leise"]


def minuten20(rng: random.Random) -> Record:
    sources, targets = [], []
    for _ in range(rng.choice((1, 2))):
        hard, easy = _pick(rng, NOUN_PHRASES)
        verb, adv = _pick(rng, VERBS), _pick(rng, ADVERBS)
        sources.append(f"{hard} {verb} {_pick(rng, TIMES)} {_pick(rng, INTENSIFIERS)} {adv}.")
        targets.append(f"{easy} {verb} {adv}.")
    prompt = f"Provide a simplified version of the following paragraph in German.\n\n{' '.join(sources)}"
    return {"prompt": prompt, "answer": " ".join(targets), "content": " ".join(sources)}


# ``template: shared``: every task's prompt in one form, so that which task a prompt belongs to is
# told by its content alone (a method that must identify the task, as MoSEs' keys do, cannot
# read it off the instruction).
SHARED_TEMPLATE = "Input: {content}\nOutput:"
Template = Literal["own", "shared"]

GENERATORS: dict[str, Callable[[random.Random], Record]] = {
    "C-STANCE": c_stance, "FOMC": fomc, "MeetingBank": meetingbank, "Py150": py150, "ScienceQA": scienceqa,
    "NumGLUE-cm": numglue_cm, "NumGLUE-ds": numglue_ds, "20Minuten": minuten20,
}


def generate(tasks: list[str] | None = None, n_train: int = 200, n_eval: int = 20, n_test: int = 50,
             seed: int = 0, template: Template = "own") -> dict[str, dict[str, list[Record]]]:
    """``{task: {split: records}}``. Test is drawn first, then eval, then train, each with its
    own generator, and no prompt repeats within a task; a split's records therefore stay the
    same when a later split's size changes. ``template: shared`` gives every task's prompt the
    one form of :data:`SHARED_TEMPLATE` around its content (instruction and field names left
    out), from the same draws: the answers are those of ``own``."""
    sizes = {"test": n_test, "eval": n_eval, "train": n_train}
    out = {}
    for task in in_order(tasks):
        seen: set[str] = set()
        splits: dict[str, list[Record]] = {}
        for split in ("test", "eval", "train"):
            rng = random.Random(f"trace-mini/{seed}/{task}/{split}")
            records: list[Record] = []
            attempts = 0
            while len(records) < sizes[split]:
                attempts += 1
                if attempts > 200 * sizes[split] + 100:
                    raise ArgumentError("benchmark", f"n_{split}", f"cannot draw {sizes[split]} distinct {split} "
                                        f"prompts for {task}", fix="ask for fewer records")
                drawn = GENERATORS[task](rng)
                content = drawn.pop("content")
                record = drawn if template == "own" else {**drawn, "prompt": SHARED_TEMPLATE.format(content=content)}
                if record["prompt"] not in seen:
                    seen.add(record["prompt"])
                    records.append(record)
            splits[split] = records
        out[task] = {s: splits[s] for s in SPLITS}
    return out


def trace_mini(tasks: Tasks | None = None, n_train: Annotated[int, Field(ge=1)] = 200,
               n_test: Annotated[int, Field(ge=1)] = 50, seed: int = 0, scenario_type: ScenarioType = "domain-il",
               scoring: Scoring = "trace", template: Template = "own",
               n_validation: Annotated[int, Field(ge=0)] = 0):
    """The generated TRACE look-alike as a stream (built in memory; same orders, metrics,
    scorings and item format as ``trace``); with ``template: shared`` every task's prompt
    has one form, so that only its content tells the task.

    ``n_validation`` > 0 holds that many prompts per task out of training (the ``eval`` split,
    drawn after test and before train, so none is a test or training prompt) and scores the run
    on them in the test set's place: settings such as a learning rate are chosen there, never on
    the test set. The training prompts then differ from a test-scored run's (they skip the
    validation prompts), so a validation run chooses settings and is no leaderboard result."""
    data = generate(tasks, n_train=n_train, n_eval=n_validation, n_test=n_test, seed=seed, template=template)
    scored = "eval" if n_validation else "test"
    return scenario_from_records("trace-mini", {t: (d["train"], d[scored]) for t, d in data.items()},
                                 scenario_type=scenario_type, scoring=scoring, synthetic=True)


trace_mini.objective = "causal_lm"  # the stream's objective, known before it is built (preflight)


TOKENIZER_VOCAB = 1024


def write_tokenizer(out_dir, vocab_size: int = TOKENIZER_VOCAB):
    """Train the trace-mini tokenizer on the default set (seed 0, every split) and save it."""
    from clbench.data.tokenizer import train_tiny_tokenizer

    data = generate(n_train=500, n_eval=50, n_test=100, seed=0)
    texts = [text for splits in data.values() for records in splits.values() for r in records
             for text in (r["prompt"], r["answer"])]
    return train_tiny_tokenizer(texts, out_dir, vocab_size=vocab_size, added_tokens=["<EOL>", "<STR_LIT>"])


def _count(text: str) -> int:
    """A record count on the command line (>= 0)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clbench.benchmarks.trace_mini",
                                     description="Write trace-mini in TRACE's on-disk layout.")
    parser.add_argument("outdir")
    parser.add_argument("--n-train", type=_count, default=500)
    parser.add_argument("--n-eval", type=_count, default=50)
    parser.add_argument("--n-test", type=_count, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--template", choices=["own", "shared"], default="own",
                        help="shared: one prompt form for every task (the task told by content alone)")
    args = parser.parse_args(argv)
    try:
        root = write_trace(args.outdir, generate(n_train=args.n_train, n_eval=args.n_eval, n_test=args.n_test,
                                                 seed=args.seed, template=args.template))
    except UserError as err:
        print(f"error: {err.one_line()}", file=sys.stderr)
        return err.exit_code
    print(f"wrote {len(TASKS)} tasks under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
