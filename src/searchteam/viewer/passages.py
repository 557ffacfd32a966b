"""Passage texts for the ids a run's searches returned, read from the run's corpus on first use.

Result rows keep passage ids only. The corpus the run searched is named by its `config.yaml` (`corpus`, or
the shipped one for `bm25`/`dense`); a run that searched a retrieval server names no corpus, so its
passages stay ids unless the user passes one. Only the wanted ids are kept, so even a large corpus costs
one pass over the file in a background thread, not its size in memory.
"""

from __future__ import annotations

import threading
from pathlib import Path

from searchteam.errors import RetrievalError
from searchteam.retrieval.corpus import find_passages

FIRST_WAIT_S = 3.0  # an episode request waits this long for a small corpus to finish loading


class PassageStore:
    """The wanted passages of one corpus file, loaded once in a daemon thread on the first lookup."""

    def __init__(self, corpus: Path | None, wanted: set[str], unavailable: str = "") -> None:
        self.corpus = corpus
        self.wanted = set(wanted)
        self.found: dict[str, dict[str, str]] = {}
        self.status = "none" if not wanted else f"unavailable: {unavailable}" if unavailable else "idle"
        self._lock = threading.Lock()
        self._done = threading.Event()
        if self.status != "idle":
            self._done.set()

    def lookup(self, ids: list[str], wait: float = FIRST_WAIT_S) -> tuple[dict[str, dict[str, str]], str]:
        """The known passages among `ids` and the store's status (loading, ready, none, unavailable: why)."""
        self._start()
        self._done.wait(wait)
        return {i: self.found[i] for i in ids if i in self.found}, self.status

    def _start(self) -> None:
        with self._lock:
            if self.status != "idle":
                return
            self.status = "loading"
        threading.Thread(target=self._load, name="viewer-corpus", daemon=True).start()

    def _load(self) -> None:
        assert self.corpus is not None
        try:
            found = find_passages(self.corpus, self.wanted)
            self.found = {i: {"title": p.title, "text": p.text} for i, p in found.items()}
            missing = len(self.wanted) - len(self.found)
            self.status = "ready" if not missing else f"ready ({missing} ids not in {self.corpus})"
        except (OSError, EOFError, UnicodeDecodeError, RetrievalError) as exc:
            self.status = f"unavailable: cannot read corpus {self.corpus}: {exc}"
        finally:
            self._done.set()
