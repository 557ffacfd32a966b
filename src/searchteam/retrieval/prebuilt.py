"""A FAISS index built elsewhere, searched with the embedder that built it: Search-R1's wiki-18 setting
(`e5_Flat.index`, `wiki-18.jsonl`, `intfloat/e5-base-v2`) or any FlashRAG dense index.

Row i of the index is passage i of the corpus (its i-th non-empty line), as in FlashRAG and Search-R1.
A plain `.jsonl` corpus is not loaded into memory: the byte offset of every line is found once (cached with
the other indexes, keyed by path, size and modification time) and only hit passages are read. A
`.jsonl.gz` corpus is loaded whole. Queries are embedded L2-normalized, as both projects do for E5 and BGE.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import weakref
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from searchteam.errors import RetrievalError
from searchteam.extras import require
from searchteam.retrieval.cache import build_atomically, index_dir, is_complete
from searchteam.retrieval.corpus import PassageTable, load_corpus, parse_passage_line
from searchteam.retrieval.dense import DEFAULT_MODEL_NAME, DENSE_EXTRA, Embedder, encode, load_embedder
from searchteam.types import Passage

if TYPE_CHECKING:
    import faiss

log = logging.getLogger(__name__)

OFFSETS_FILE = "offsets.npy"
E5_QUERY_PREFIX = "query: "
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "


class PassageRows(Protocol):
    def __len__(self) -> int: ...

    def passage(self, row: int, score: float | None = None) -> Passage: ...


def default_query_prefix(model: str) -> str:
    """The query instruction FlashRAG and Search-R1 add for E5 and BGE embedders, matched by model name."""
    name = Path(model).name.lower()
    if "e5" in name:
        return E5_QUERY_PREFIX
    return BGE_QUERY_PREFIX if "bge" in name else ""


class JsonlRows:
    """The passages of a plain JSONL corpus, read from the file by row number on demand."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise RetrievalError(f"corpus file not found: {path} (want the JSONL the index was built from)")
        self.path = path
        self._offsets = _cached_offsets(path)
        self._fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def passage(self, row: int, score: float | None = None) -> Passage:
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        where = f"{self.path}: passage {row} (byte {start})"
        try:
            line = os.pread(self._fd, end - start, start).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RetrievalError(f"{where}: not UTF-8 text ({exc})") from None
        passage = parse_passage_line(line, where)
        passage.score = score
        return passage


def line_offsets(path: Path) -> np.ndarray:
    """Byte offset of every non-empty line, then the file size (so row i spans offsets[i]:offsets[i+1])."""
    starts, pos = array("q"), 0
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                starts.append(pos)
            pos += len(line)
    starts.append(pos)
    return np.array(starts, dtype=np.int64)


def _cached_offsets(path: Path) -> np.ndarray:
    stat = path.stat()
    key = json.dumps([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
    folder = index_dir(f"offsets-{hashlib.sha256(key.encode()).hexdigest()[:16]}")
    if not is_complete(folder):
        log.info("indexing the lines of %s (once)", path)
        build_atomically(folder, lambda out: np.save(out / OFFSETS_FILE, line_offsets(path)))
    return np.load(folder / OFFSETS_FILE)


def open_corpus(path: str | Path) -> PassageRows:
    """Row-addressable passages: read on demand from a `.jsonl`, or loaded from a `.jsonl.gz`."""
    path = Path(path)
    if path.suffix == ".gz":
        return PassageTable.from_passages(load_corpus(path))
    return JsonlRows(path)


def read_index(path: Path) -> faiss.Index:
    if not path.is_file():
        raise RetrievalError(f"FAISS index file not found: {path}")
    faiss = require("faiss", DENSE_EXTRA, "a prebuilt FAISS index")
    try:
        return faiss.read_index(str(path))
    except RuntimeError as exc:
        raise RetrievalError(f"{path}: not a FAISS index ({str(exc).splitlines()[0]})") from None


class PrebuiltDenseRetriever:
    """Top-k search in a prebuilt FAISS index; `query_prefix=None` picks the embedder's usual prefix."""

    name = "dense"

    def __init__(
        self,
        index_path: str | Path,
        corpus_path: str | Path,
        model: str | None = None,
        query_prefix: str | None = None,
        batch_size: int = 64,
        device: str | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.index_path, self.corpus_path = Path(index_path), Path(corpus_path)
        self.model_name = model or DEFAULT_MODEL_NAME
        self.query_prefix = default_query_prefix(self.model_name) if query_prefix is None else query_prefix
        self.batch_size = batch_size
        self._index = read_index(self.index_path)
        self._rows = open_corpus(self.corpus_path)
        self._embedder = embedder or load_embedder(model, device)
        self._check_fit()

    def _check_fit(self) -> None:
        """The corpus has one passage per index row and the embedder gives vectors of the index's size."""
        if len(self._rows) != self._index.ntotal:
            raise RetrievalError(
                f"{self.index_path} holds {self._index.ntotal} vectors but {self.corpus_path} has "
                f"{len(self._rows)} passages: pass the corpus the index was built from (row i = line i)"
            )
        dim = encode(self._embedder, ["dimension check"], self.batch_size).shape[1]
        if dim != self._index.d:
            raise RetrievalError(
                f"{self.index_path} holds {self._index.d}-dimensional vectors but embedder "
                f"'{self.model_name}' makes {dim}-dimensional ones: pass the embedder that built the index "
                "(Search-R1's e5_Flat.index: intfloat/e5-base-v2)"
            )

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-`k` passages per query by the index's similarity, best first."""
        k = min(k, self._index.ntotal)
        if not queries or k < 1:
            return [[] for _ in queries]
        vectors = encode(self._embedder, [self.query_prefix + q for q in queries], self.batch_size)
        scores, rows = self._index.search(vectors, k)
        return [
            [self._rows.passage(r, float(s)) for r, s in zip(row_ids, row_scores, strict=True) if r >= 0]
            for row_ids, row_scores in zip(rows.tolist(), scores.tolist(), strict=True)
        ]
