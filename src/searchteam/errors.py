"""Every error searchteam raises on purpose. A `SearchTeamError` is a problem the user can fix, and its
message says what and where: the CLI shows it as one line without a traceback (`cli.app.user_errors`). Each
also keeps the builtin base its callers catch: ValueError for input that cannot be used, RuntimeError for a
backend or retriever that cannot serve, KeyError for an unknown name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class SearchTeamError(Exception):
    """A problem the user can fix; the message says what and where."""


class ConfigError(SearchTeamError, ValueError):
    """A config file or flag that cannot be used; the message names the file and field."""


class OpenServerRefused(ConfigError):
    """A server bound beyond the loopback interface without an API key."""


class ExportError(ConfigError):
    """A run folder that cannot be exported; the message says what is missing and what to do."""


class UnknownMethodError(SearchTeamError, KeyError):
    """A method name that no registered method has."""


class DataError(SearchTeamError, ValueError):
    """A question file or dataset name that cannot be used; the message says where and what to do."""


class JsonlError(SearchTeamError, ValueError):
    """A JSONL line before the last is not JSON: the file is damaged, not torn by a killed writer."""


class CompareError(SearchTeamError, ValueError):
    """Runs that cannot be paired; the message says why."""


class ViewerError(SearchTeamError, ValueError):
    """A run directory the viewer cannot read; the message says which file and why."""


class ShipError(SearchTeamError, ValueError):
    """A checkpoint or adapter name that cannot be shipped; the message says which and why."""


class ExperienceError(SearchTeamError, ValueError):
    """A turn that cannot become a training sample as recorded; the message says what to record."""


class LLMError(SearchTeamError, RuntimeError):
    """A backend that cannot serve: missing weights, unreachable server, bad model name."""


class EngineStalled(LLMError):
    """The engine stopped making progress; its thread cannot be interrupted, so the backend is unusable."""


class FrameworkFault(LLMError):
    """Another RL framework's server failed a request (a dead actor, a dropped connection, a prompt past its
    context): the rollout is aborted as the framework's own agent loops abort one, never trained as an
    episode."""


class RetrievalError(SearchTeamError, RuntimeError):
    """A retriever that cannot serve (missing corpus, unreachable server, bad configuration)."""


class MissingExtra(LLMError, RetrievalError):
    """An optional package is not installed (`searchteam.extras`). Both an LLMError and a RetrievalError,
    so that code catching either around a backend or retriever it builds catches this one too."""


class TeamBug(SearchTeamError, RuntimeError):
    """The team's own code raised the same exception at the same place in several episodes: the run stops
    with the traceback and the count (`runtime.failures.TeamBugs`) instead of scoring every episode 0."""

    @property
    def headline(self) -> str:
        """The message without its traceback."""
        return str(self.args[0]).partition("\n")[0] if self.args else ""


class RequestRejected(RuntimeError):
    """The engine refused one request for what it asked (a prompt longer than its context): that episode
    fails and is counted, the run goes on. Not a SearchTeamError: the backend still serves the others."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`; did you mean 'X'?` for the closest of `choices` to a misspelled `name`, else nothing."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
