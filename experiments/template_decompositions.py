"""2WikiMultihopQA questions with the decomposition a perfect decomposer would write, and what a team does
with it. 2WikiMultihopQA asks most of its questions from a few templates. Comparisons ("Which film came out
first, A or B?", "Who died later, A or B?", "Which film has the director born earlier, A or B?") are
decided by two dates; chains ("Who is the paternal grandfather of P?", "What is the place of birth of the
director of film F?") are two serial hops. `write` keeps the questions of a split that match a template of
the kinds asked for and adds their sub-questions (question-file fields `subquestions`, `subquestion_mode`;
comparisons also `options` and `wants`: the two named answers and whether the earlier or the later date
wins), for JADE's option `decomposition: given`:

    python experiments/template_decompositions.py write --split dev --out runs/cmp/dev.jsonl [--kinds chain]
    searchteam eval --config CONFIG --questions runs/cmp/dev.jsonl --out runs/cmp/jade
    python experiments/template_decompositions.py report runs/cmp/jade --questions runs/cmp/dev.jsonl

with CONFIG `{method: jade, model: qwen2.5-coder-0.5b, max_turns: 6, top_k: 3, options: {workflow: "R, AG",
decomposition: given}}`. `report` (comparisons) reads each episode's last trace: where the two halves of
the sub-answers carry two different years, comparing them gives an answer ("the facts decide"); it counts
how often that answer is the gold one (the facts were right) and how often the team's final answer agrees
with it (the summarizer compared them). docs/training.md ("Decomposed right") has the measurements.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from searchteam.data import load_benchmark
from searchteam.data.benchmark import load_questions, normalize_answer
from searchteam.eval.runner import read_results

OPTIONS = r",?\s*(?P<a>.+?) or (?P<b>.+?)\?*$"
DIRECTOR = r"^Which film (?:has the director|whose director was|has the director who was|whose director) "
WHEN = r"(?P<wants>first|earlier|later|more recently)"
# 2WikiMultihopQA's comparisons: the option whose date is earlier (or later) is the answer.
TEMPLATES: dict[str, tuple[str, str, list[str]]] = {
    "film released": (
        r"^Which film (?:was released|came out) " + WHEN + OPTIONS,
        "parallel",
        ["When was the film {a} released?", "When was the film {b} released?"],
    ),
    "person born": (
        r"^Who was born " + WHEN + OPTIONS,
        "parallel",
        ["When was {a} born?", "When was {b} born?"],
    ),
    "person died": (r"^Who died " + WHEN + OPTIONS, "parallel", ["When did {a} die?", "When did {b} die?"]),
    "director born": (
        DIRECTOR + "born " + WHEN + OPTIONS,
        "serial",
        ["Who directed the film {a}?", "When was this director born?"]
        + ["Who directed the film {b}?", "When was this director born?"],
    ),
    "director died": (
        DIRECTOR + "died " + WHEN + OPTIONS,
        "serial",
        ["Who directed the film {a}?", "When did this director die?"]
        + ["Who directed the film {b}?", "When did this director die?"],
    ),
}
# 2WikiMultihopQA's compositional questions, two serial hops each: a relative, or a fact about the
# director/performer/composer of a work.
KIN = {
    "paternal grandfather": ("father", "father"),
    "paternal grandmother": ("father", "mother"),
    "maternal grandfather": ("mother", "father"),
    "maternal grandmother": ("mother", "mother"),
    "father-in-law": ("spouse", "father"),
    "mother-in-law": ("spouse", "mother"),
    "stepmother": ("father", "spouse"),
}
RELATIVE = r"^Who is the (?P<kin>" + "|".join(KIN) + r") of (?P<x>.+?)\?$"
MAKER = r"^(?P<ask>.+?) (?:the )?(?P<maker>director|performer|composer) of (?P<work>film|song) (?P<x>.+?)\?$"
YEAR = re.compile(r"\b(1\d{3}|20\d{2})\b")


def comparison(question: str) -> dict | None:
    for name, (pattern, mode, subquestions) in TEMPLATES.items():
        if match := re.match(pattern, question):
            a, b = match["a"].strip(), match["b"].strip()
            return {
                "template": name,
                "subquestions": [s.format(a=a, b=b) for s in subquestions],
                "subquestion_mode": mode,
                "options": [a, b],
                "wants": "earlier" if match["wants"] in ("first", "earlier") else "later",
            }
    return None


def chain(question: str) -> dict | None:
    if match := re.match(RELATIVE, question):
        first, second = KIN[match["kin"]]
        subquestions = [f"Who is the {first} of {match['x']}?", f"Who is the {second} of this person?"]
        return {"template": "relative", "subquestions": subquestions, "subquestion_mode": "serial"}
    if match := re.match(MAKER, question):
        maker, work = match["maker"], match["work"]
        subquestions = [f"Who is the {maker} of the {work} {match['x']}?", f"{match['ask']} this {maker}?"]
        return {"template": f"{maker}'s fact", "subquestions": subquestions, "subquestion_mode": "serial"}
    return None


KINDS = {"comparison": comparison, "chain": chain}


def decomposition(question: str, kinds: tuple[str, ...] = ("comparison",)) -> dict | None:
    """The question-file fields for a question that matches a template of those kinds, else None."""
    return next((fields for kind in kinds if (fields := KINDS[kind](question))), None)


def write(split: str, datasets: list[str], kinds: tuple[str, ...], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    counts: Counter[str] = Counter()
    with out.open("w") as fh:
        for q in load_benchmark(datasets, split):
            if fields := decomposition(q.question, kinds):
                counts[fields["template"]] += 1
                row = {
                    "id": q.id,
                    "dataset": q.dataset,
                    "question": q.question,
                    "golden_answers": q.golden_answers,
                }
                fh.write(json.dumps(row | fields) + "\n")
    print(f"{out}: {sum(counts.values())} questions " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def decided_by_facts(row: dict, fields: dict) -> str | None:
    """The option the sub-answers' years pick (the last answer of each half of the sub-questions), if they
    carry two different years."""
    solved = [n for n in row["states"][-1]["trace"][1:] if n["status"] == "solved"] if row["states"] else []
    half = len(fields["subquestions"]) // 2
    if len(solved) != 2 * half:
        return None
    years = [YEAR.findall(solved[i]["answer"] or "") for i in (half - 1, 2 * half - 1)]
    if not all(years) or years[0][0] == years[1][0]:
        return None
    a_earlier = int(years[0][0]) < int(years[1][0])
    a, b = fields["options"]
    return a if a_earlier == (fields["wants"] == "earlier") else b


def report(run: Path, question_file: Path) -> None:
    """Counts over the run's comparison questions (chains have no options to follow)."""
    questions = {q.id: q.meta for q in load_questions(question_file)}
    rows = [row for row in read_results(run / "results.jsonl") if "options" in questions.get(row["id"], {})]
    norm = normalize_answer
    names_option = decided = facts_right = agrees = 0
    for row in rows:
        fields = questions[row["id"]]
        names_option += norm(row["prediction"]) in {norm(o) for o in fields["options"]}
        if (pick := decided_by_facts(row, fields)) is None:
            continue
        decided += 1
        if norm(pick) in {norm(g) for g in row["golden_answers"]}:
            facts_right += 1
            agrees += norm(row["prediction"]) == norm(pick)
    em = sum(r["em"] for r in rows) / max(1, len(rows))
    print(
        f"{run}: n {len(rows)}, EM {em:.3f}, answer names an option {names_option}, the facts decide "
        f"{decided}, rightly {facts_right}, and the answer follows them on {agrees} of those {facts_right}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writer = commands.add_parser("write", help="a question file with the template decompositions")
    writer.add_argument("--split", default="dev")
    writer.add_argument("--datasets", default="2wikimultihopqa,hotpotqa")
    writer.add_argument("--kinds", default="comparison", help="comparison, chain, or both (comma-separated)")
    writer.add_argument("--out", type=Path, required=True)
    reader = commands.add_parser("report", help="what eval runs on such a file did with the decompositions")
    reader.add_argument("runs", type=Path, nargs="+")
    reader.add_argument("--questions", type=Path, required=True, help="the file the runs answered")
    args = parser.parse_args()
    if args.command == "write":
        kinds = tuple(args.kinds.split(","))
        if unknown := set(kinds) - set(KINDS):
            parser.error(f"unknown --kinds {', '.join(sorted(unknown))}; choose from {', '.join(KINDS)}")
        write(args.split, args.datasets.split(","), kinds, args.out)
    else:
        for run in args.runs:
            report(run, args.questions)


if __name__ == "__main__":
    main()
