"""Passage corpora: JSONL (optionally gzipped) with `id,title,text`, or FlashRAG's `id,contents`."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import IO, Any

from searchteam.data import CORPUS_PATH
from searchteam.errors import RetrievalError
from searchteam.types import Passage


def read_corpus_bytes(path: str | Path) -> bytes:
    """The raw bytes of a corpus file; a missing file is a RetrievalError that says so."""
    path = Path(path)
    if not path.is_file():
        raise RetrievalError(f"corpus file not found: {path} (want .jsonl or .jsonl.gz with id,title,text)")
    return path.read_bytes()


def corpus_fingerprint(path: str | Path) -> str:
    """sha256 of the corpus file's bytes: a cache key that changes whenever the corpus does."""
    return hashlib.sha256(read_corpus_bytes(path)).hexdigest()


def load_corpus(path: str | Path) -> list[Passage]:
    """Load every passage of a corpus file; errors name `file:line` and the field that is wrong."""
    path = Path(path)
    raw = read_corpus_bytes(path)
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise RetrievalError(f"{path}: not a valid gzip file ({exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RetrievalError(f"{path}: not UTF-8 text ({exc})") from None
    lines = enumerate(text.splitlines(), 1)
    passages = [parse_passage_line(line, f"{path}:{n}") for n, line in lines if line.strip()]
    if not passages:
        raise RetrievalError(f"{path}: the corpus has no passages")
    return passages


def corpus_of_run(config: dict[str, Any], override: Path | None = None) -> tuple[Path | None, str]:
    """The corpus file a run searched (from its `config.yaml`: `corpus`, or the shipped one for `bm25` and
    `dense`), or None with the reason it is unknown (a run that searched a retrieval server)."""
    if override is not None:
        return override, ""
    if config.get("corpus"):
        return Path(config["corpus"]), ""
    retriever = str(config.get("retriever") or "bm25")
    if retriever.startswith(("http://", "https://")):
        return None, f"the run searched a retrieval server ({retriever}); pass --corpus to show its passages"
    return CORPUS_PATH, ""


def find_passages(path: Path, wanted: set[str]) -> dict[str, Passage]:
    """The passages of a corpus file whose ids are in `wanted`, read in one pass that stops when all are
    found: a large corpus costs a scan, not its size in memory. Unreadable lines are skipped."""
    found: dict[str, Passage] = {}
    if not wanted:
        return found
    with _open_text(path) as fh:
        for n, line in enumerate(fh, 1):
            try:
                row_id = json.loads(line).get("id")
            except (json.JSONDecodeError, AttributeError):
                continue
            if row_id is not None and str(row_id) in wanted:
                passage = parse_passage_line(line, f"{path}:{n}")
                found[passage.id] = passage
                if len(found) == len(wanted):
                    break
    return found


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def passage_text(p: Passage) -> str:
    """What retrievers index and embed: title and body, so title words count."""
    return f"{p.title}\n{p.text}" if p.title else p.text


def parse_passage_line(line: str, where: str) -> Passage:
    """One corpus line as a Passage; errors start with `where` (file and line)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RetrievalError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise RetrievalError(f"{where}: each line must be a JSON object with id, title, text")
    if "id" not in row or row["id"] is None or isinstance(row["id"], dict | list):
        raise RetrievalError(f"{where}: missing field 'id' (a string or number)")
    title, text = _title_and_text(row, where)
    return Passage(id=str(row["id"]), title=title, text=text)


def _title_and_text(row: dict[str, Any], where: str) -> tuple[str, str]:
    """`title`+`text`, or FlashRAG `contents` = '"title"\\ntext'."""
    if "text" in row:
        title, text = row.get("title") or "", row["text"]
    elif "contents" in row:
        title, text = _contents_field(row["contents"], where)
    else:
        raise RetrievalError(f"{where}: missing field 'text' (or FlashRAG 'contents')")
    if not isinstance(text, str) or not isinstance(title, str):
        raise RetrievalError(f"{where}: 'title' and 'text' must be strings")
    if not text.strip():
        raise RetrievalError(f"{where}: field 'text' is empty")
    return title, text


def _contents_field(contents: Any, where: str) -> tuple[str, str]:
    if not isinstance(contents, str):
        raise RetrievalError(f"{where}: 'contents' must be a string")
    return split_contents(contents)


def split_contents(contents: str) -> tuple[str, str]:
    """Split FlashRAG/Search-R1 `contents` ('"title"\\ntext') into title and text."""
    head, sep, rest = contents.partition("\n")
    if sep and len(head) >= 2 and head.startswith('"') and head.endswith('"'):
        return head[1:-1], rest
    return "", contents


class PassageTable:
    """Passages stored column-wise beside an index; `Passage` objects are made only for hits."""

    def __init__(self, ids: list[str], titles: list[str], texts: list[str]) -> None:
        if not len(ids) == len(titles) == len(texts):
            raise RetrievalError("passage table columns differ in length (corrupt index: delete it)")
        self.ids, self.titles, self.texts = ids, titles, texts

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_passages(cls, passages: list[Passage]) -> PassageTable:
        return cls([p.id for p in passages], [p.title for p in passages], [p.text for p in passages])

    @classmethod
    def load(cls, path: Path) -> PassageTable:
        columns = json.loads(path.read_text(encoding="utf-8"))
        return cls(columns["ids"], columns["titles"], columns["texts"])

    def save(self, path: Path) -> None:
        columns = {"ids": self.ids, "titles": self.titles, "texts": self.texts}
        path.write_text(json.dumps(columns, ensure_ascii=False), encoding="utf-8")

    def passage(self, row: int, score: float | None = None) -> Passage:
        return Passage(id=self.ids[row], title=self.titles[row], text=self.texts[row], score=score)
