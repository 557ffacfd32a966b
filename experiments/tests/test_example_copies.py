"""experiments/example_copies.py: copies of an example answer or entity, and which the withdrawal takes."""

import importlib.util
import json
from pathlib import Path

import yaml

SCRIPT = Path(__file__).resolve().parent.parent / "example_copies.py"
spec = importlib.util.spec_from_file_location("example_copies", SCRIPT)
example_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example_copies)


def test_a_copy_no_retrieved_passage_holds_would_be_withdrawn(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    passages = [{"id": "1", "title": "Motihari", "text": "Motihari is a city in India."}]
    corpus.write_text("".join(json.dumps(p) + "\n" for p in passages))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"method": "search_r1", "corpus": str(corpus)}))
    rows = [  # the example's answer with a passage holding it; its first hop with none; a real answer
        {"question": "Q1", "prediction": "India", "f1": 1.0, "searches": [{"ids": ["1"]}]},
        {"question": "Q2", "prediction": "George Orwell", "f1": 0.5, "searches": [{"ids": ["1"]}]},
        {"question": "Q3", "prediction": "Thomas Mann", "f1": 1.0, "searches": []},
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    counted = example_copies.report(tmp_path)
    assert (counted["copies"], counted["would_withdraw"], counted["already_withdrawn"]) == (2, 1, 0)
    assert (counted["f1"], counted["f1_after"]) == (0.8333, 0.6667)
