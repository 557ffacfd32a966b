"""Routing one backend's requests over replica servers of one model, each episode kept on one server."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

MAX_SESSIONS = 100_000  # episodes whose server is remembered (the oldest are forgotten)


class Replicas:
    """Servers of the same model: a request goes to the one with the fewest of this backend's requests in
    flight, the requests of one episode (`session`) to the server of its first (its prefix cache holds the
    prompt)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self._in_flight = dict.fromkeys(self.urls, 0)  # this backend's requests per server
        self._sessions: OrderedDict[str, str] = OrderedDict()  # episode -> its server
        self._lock = threading.Lock()

    def route(self, session: str) -> str:
        """The server of a request of episode `session` (counted in flight until `done`): the one of its
        first request, else the least busy."""
        with self._lock:
            url = self._sessions.get(session) if session else None
            if url is None:
                url = min(self.urls, key=self._in_flight.__getitem__)
                if session:
                    self._remember(session, url)
            self._in_flight[url] += 1
            return url

    def done(self, url: str) -> None:
        """A request `route` sent to `url` has its answer."""
        with self._lock:
            self._in_flight[url] -= 1

    def _remember(self, session: str, url: str) -> None:
        self._sessions[session] = url
        if len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
