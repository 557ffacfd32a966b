"""Fuzzing every parser of model output, the judge's verdict parser and the config loader.

The guarantees are listed in docs/reliability.md.

For any text (arbitrary unicode, soups of the parser's own tags, inputs past the cap) each parser returns its
value and its format flag and never raises; it reads only the first `MAX_PARSE_CHARS` characters; its work,
counted as Python lines run plus characters handed to the regex engine (never timed), grows linearly; and
the linear tag scanner finds exactly what the backtracking regexes it replaced found.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import searchteam
from searchteam.config import RunConfig, load_config
from searchteam.errors import ConfigError
from searchteam.methods.dac import team as dac
from searchteam.methods.decor import team as decor
from searchteam.methods.ircot import team as ircot
from searchteam.methods.jade import team as jade
from searchteam.methods.mask import team as mask
from searchteam.methods.qagent import team as qagent
from searchteam.methods.search_r1 import team as search_r1
from searchteam.rewards import judge
from searchteam.teams import base, parsing, selectors, transcript
from searchteam.teams.parsing import MAX_PARSE_CHARS, Parsed
from searchteam.types import Turn
from tests.support.contracts import FUZZ_QUESTION, FuzzTarget, check_flag, fuzz_targets

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPECIAL = ["İ", "ı", "ſ", "K", "\u2028", "\x85", "\r\n", "\u00a0", "١٢", "１", "\u200d", "é", "🙂", "\x00"]
PUNCTUATION = ["<", ">", "</", "/>", "< ", "\n", " ", ".", ". ", ":", ",", "→", "-"]
WORDS = ["Answer:", "So the answer is:", "The answer is: X.", "YES", "no", "None", "unknown"]
CODES = ["R", "AG", "QDS", "t1", "t9", "0", "2", "12", "Doc 3"]
FILLER = PUNCTUATION + WORDS + CODES


def _answer_from(text: str) -> tuple[str, bool, str | None]:
    turn = Turn(role="answer", completion=text)
    return base.Team.answer_from(turn, prefill="<answer>"), turn.parsed_ok, turn.parse_error


def _queries_from(text: str) -> tuple[list[str], bool, str | None]:
    turn = Turn(role="qr", completion=text)
    return selectors.queries_from(turn, FUZZ_QUESTION, 4), turn.parsed_ok, turn.parse_error


def check_parsed(r: Parsed) -> None:
    assert isinstance(r.value, str)
    check_flag(r.ok, r.error)
    assert r.ok or len(r.value.split()) <= 20


def check_answer_from(r: tuple[str, bool, str | None]) -> None:
    assert isinstance(r[0], str)
    check_flag(r[1], r[2])


def check_selection(r: selectors.Selection) -> None:
    check_flag(r.ok, r.error)
    assert r.ids and len(set(r.ids)) == len(r.ids) and all(0 <= i < 3 for i in r.ids)


def check_queries(r: tuple[list[str], bool, str | None]) -> None:
    queries, ok, error = r
    check_flag(ok, error)
    assert 1 <= len(queries) <= 4 and all(queries)


def check_verdict(r: bool | None) -> None:
    assert r in (True, False, None)


TARGETS = [
    FuzzTarget("parse_answer", parsing.parse_answer, ("answer",), check_parsed),
    FuzzTarget("answer_from", _answer_from, ("answer",), check_answer_from),
    FuzzTarget(
        "selectors.parse_selection",
        lambda t: selectors.parse_selection(t, 3),
        ("id",),
        check_selection,
    ),
    FuzzTarget("selectors.queries_from", _queries_from, ("query",), check_queries),
    FuzzTarget("judge.parse_verdict", judge.parse_verdict, ("verdict",), check_verdict),
    *fuzz_targets(),  # each method's, from its tests/contract.py
]
BY_NAME = pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])


def tag_tokens(tags: tuple[str, ...]) -> list[str]:
    """Opening and closing tags in three cases, and broken variants of them."""
    tokens = []
    for tag in tags:
        for t in (tag, tag.upper(), tag.capitalize()):
            tokens += [f"<{t}>", f"</{t}>"]
        tokens += [f"<{tag}", f"{tag}>", f"< {tag} >", f"<{tag}/>"]
    return tokens


def soup(tags: tuple[str, ...], filler: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[str]:
    """Texts of the parser's own tags, punctuation, answer phrases, special characters and random text."""
    piece = st.one_of(
        st.sampled_from(tag_tokens(tags) or ["<"]),
        st.sampled_from(FILLER + SPECIAL),
        filler if filler is not None else st.text(max_size=8),
    )
    return st.lists(piece, max_size=40).map("".join)


@BY_NAME
@FUZZ
@given(data=st.data())
def test_any_text_gives_a_value_and_a_flag(target: FuzzTarget, data: st.DataObject) -> None:
    text = data.draw(st.one_of(st.text(), soup(target.tags)))
    target.check(target.parse(text))


@BY_NAME
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_input_past_the_cap_reads_as_its_capped_prefix(target: FuzzTarget, data: st.DataObject) -> None:
    chunk = data.draw(soup(target.tags).filter(bool))
    huge = chunk * (MAX_PARSE_CHARS // len(chunk) + 2)
    result = target.parse(huge)
    target.check(result)
    assert result == target.parse(huge[:MAX_PARSE_CHARS])


# --- the linear tag scanner against the backtracking regexes it replaced (ASCII case-folding only) --------

PLAIN = st.text(st.characters(exclude_characters="İıſK"), max_size=6)
OLD_END = re.compile(r"<\s*/?\s*end\s*/?\s*>", re.IGNORECASE)


@FUZZ
@given(text=soup(("search", "answer", "think"), PLAIN))
def test_tag_pairs_match_the_backreference_regex(text: str) -> None:
    old = re.finditer(r"<(search|answer)>(.*?)</\1>", text, re.IGNORECASE | re.DOTALL)
    new = parsing.tag_pairs(text, ("search", "answer"))
    assert [(p.name, p.start, p.end, p.content) for p in new] == [
        (m.group(1).lower(), m.start(), m.end(), m.group(2)) for m in old
    ]
    assert parsing.tag_contents(text, "think") == [
        m.strip() for m in re.findall(r"<think>(.*?)</think>", text, re.IGNORECASE | re.DOTALL)
    ]
    assert parsing.without_pairs(text, "think") == re.sub(
        r"<think>.*?</think>", " ", text, flags=re.IGNORECASE | re.DOTALL
    )


@FUZZ
@given(text=soup(("q1", "q2", "q12", "a1", "a2"), PLAIN))
def test_numbered_tag_pairs_match_the_backreference_regex(text: str) -> None:
    old = re.findall(r"<q(\d+)>(.*?)</q\1>", text, re.IGNORECASE | re.DOTALL)
    assert [(p.number, p.content) for p in parsing.tag_pairs(text, ("q",), numbered=True)] == old


@FUZZ
@given(text=soup(("answer", "end", "/end", "stop", "search"), PLAIN))
def test_untagged_opened_tail_and_end_match_the_old_regexes(text: str) -> None:
    assert parsing.untagged(text) == re.sub(r"<[^>]+>", " ", text)
    opened = re.search(r"<answer>(.*)", text, re.IGNORECASE | re.DOTALL)
    assert parsing.opened_tail(text, "answer") == (opened.group(1) if opened else None)
    assert bool(mask.END.search(text)) == bool(OLD_END.search(text))
    assert dac.parse_searcher(text).kind == old_searcher_kind(text)


def old_searcher_kind(text: str) -> str:
    old = re.search(r"<search>(.*?)</search>|<stop>", text, re.IGNORECASE | re.DOTALL)
    if old is None:
        return "invalid"
    if old.group(1) is None:
        return "stop"
    return "search" if old.group(1).strip() else "invalid"


# --- work counted, not timed ------------------------------------------------------------------------------

SOURCE = str(Path(searchteam.__file__).parent)
PARSER_MODULES = (
    parsing,
    base,
    transcript,
    mask,
    qagent,
    decor,
    dac,
    jade,
    search_r1,
    ircot,
    selectors,
    judge,
)
# Constructs that make Python's backtracking regex engine superlinear: a quantified wildcard or negated class
# (scans to the end from every start), a lazy quantifier, a backreference, two `\s*` around an optional item.
BACKTRACKING = re.compile(r"\.[*+]|[*+?}]\?|\\[1-9]|\[\^[^\]]*\][*+{]|\\s[*+].\?\\s[*+]")


@dataclass
class Meter:
    """Work done while parsing: Python lines run in searchteam code, characters handed to the regex engine,
    and the patterns used."""

    lines: int = 0
    regex_chars: int = 0
    patterns: set[str] = field(default_factory=set)

    @property
    def work(self) -> int:
        return self.lines + self.regex_chars


class CountingPattern:
    """A compiled pattern that adds the length of every text it scans to the meter."""

    SCANS = ("search", "match", "fullmatch", "findall", "finditer", "split", "sub", "subn")

    def __init__(self, pattern: re.Pattern[str], meter: Meter) -> None:
        self.pattern, self.meter = pattern, meter

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.pattern, name)
        if name not in self.SCANS:
            return method

        def scan(*args: Any, **kwargs: Any) -> Any:
            self.meter.regex_chars += len(args[1] if name in ("sub", "subn") else args[0])
            self.meter.patterns.add(self.pattern.pattern)
            return method(*args, **kwargs)

        return scan


class CountingRe:
    """Stands in for the `re` module inside the parser modules."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def __getattr__(self, name: str) -> Any:
        if name not in CountingPattern.SCANS:
            return getattr(re, name)

        def call(pattern: str, *args: Any, flags: int = 0, **kwargs: Any) -> Any:
            return getattr(self.compile(pattern, flags), name)(*args, **kwargs)

        return call

    def compile(self, pattern: str, flags: int = 0) -> CountingPattern:
        return CountingPattern(re.compile(pattern, flags), self.meter)


@contextmanager
def metered(monkeypatch: pytest.MonkeyPatch) -> Iterator[Meter]:
    meter = Meter()
    for module in PARSER_MODULES:
        _instrument(module, meter, monkeypatch)

    def count_lines(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            meter.lines += 1
        return count_lines

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        return count_lines if frame.f_code.co_filename.startswith(SOURCE) else None

    sys.settrace(on_call)
    try:
        yield meter
    finally:
        sys.settrace(None)
        monkeypatch.undo()


def _instrument(module: ModuleType, meter: Meter, monkeypatch: pytest.MonkeyPatch) -> None:
    if getattr(module, "re", None) is re:
        monkeypatch.setattr(module, "re", CountingRe(meter))
    for name, value in vars(module).items():
        if isinstance(value, re.Pattern):
            monkeypatch.setattr(module, name, CountingPattern(value, meter))


def bombs(tags: tuple[str, ...]) -> dict[str, str]:
    """Repeating units whose naive parsing is superlinear: opening tags never closed, closing tags never
    opened, many small pairs next to one long one, runs of `<`, spaces after `<`, digit runs, a tag soup."""
    tags = tags or ("answer",)
    rng = random.Random(0)
    pieces = tag_tokens(tags) + FILLER + SPECIAL
    return {
        "opened": "".join(f"<{t}>" for t in tags),
        "closed": "".join(f"</{t}>" for t in tags),
        "pairs": "".join(f"<{t}>x 1.</{t}>" for t in tags),
        "unclosed_pairs": "".join(f"<{t}>x</{t}><{t}>" for t in tags),
        "lt": "<",
        "lt_spaces": "< " + " " * 40,
        "digits": "1" * 50,
        "soup": "".join(rng.choice(pieces) for _ in range(60)),
    }


def inputs(tags: tuple[str, ...], n: int) -> dict[str, str]:
    """Each bomb repeated to n characters, bare and inside one long pair of each of the parser's tags."""
    found = {}
    for kind, unit in bombs(tags).items():
        body = (unit * (n // len(unit) + 1))[:n]
        found[kind] = body
        found[f"{kind} in tags"] = (
            "".join(f"<{t}>" for t in tags) + body + "".join(f"</{t}>" for t in tags[::-1])
        )
    return found


@BY_NAME
def test_work_grows_linearly_with_the_input(target: FuzzTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    work: dict[str, list[int]] = {}
    for n in (4_000, 8_000):
        for kind, text in inputs(target.tags, n).items():
            with metered(monkeypatch) as meter:
                target.parse(text)
            work.setdefault(kind, []).append(meter.work)
            assert meter.regex_chars <= 12 * len(text) + 1_000, (kind, n, meter)
    for kind, (small, double) in work.items():
        assert double <= 2.2 * small + 500, (kind, small, double)


@BY_NAME
def test_parsers_use_only_patterns_that_cannot_backtrack(
    target: FuzzTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    with metered(monkeypatch) as meter:
        for text in inputs(target.tags, 200).values():
            target.parse(text)
    assert meter.regex_chars > 0
    assert [p for p in meter.patterns if BACKTRACKING.search(p)] == []


def test_the_old_patterns_are_caught_by_the_backtracking_check() -> None:
    old = [
        r"<q(\d+)>(.*?)</q\1>",
        r"<[^>]+>",
        r"<\s*/?\s*end\s*/?\s*>",
        r"<think>.*?</think>",
        r"<answer>(.*)",
    ]
    assert all(BACKTRACKING.search(p) for p in old)


# --- the config loader ------------------------------------------------------------------------------------

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
YAML_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
FIELDS = st.sampled_from([*RunConfig.model_fields, "unknown_field", "top_k ", "Method"])
BAD_YAML = [
    "seed: 2001-13-01\n",
    "seed: " + "1" * 5000 + "\n",
    "[" * 3000 + "]" * 3000,
    "options: " + "{a: " * 2000 + "1" + "}" * 2000,
    "options: &a {x: *a}\n",
    "datasets: &a [*a]\n",
    "a: \x00",
    "\tmethod: mask",
    "method: [unclosed",
    "? [a, b]\n: 1",
    "<<: {method: mask}",
    "!!python/object:os.system {}",
    "top_k: 0x10\nmax_turns: 0o7",
]
CONFIG_DOCS = st.one_of(
    st.text(),
    st.binary(),
    YAML_VALUES.map(yaml.safe_dump),
    st.dictionaries(FIELDS, YAML_VALUES, max_size=5).map(yaml.safe_dump),
)


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("configs")


def check_config_file(path: Path, doc: str | bytes) -> None:
    """Loading `doc` gives a RunConfig or a ConfigError that names the file, nothing else."""
    path.write_bytes(doc if isinstance(doc, bytes) else doc.encode("utf-8", "surrogatepass"))
    try:
        config = load_config(path, {})
    except ConfigError as error:
        assert str(error) and str(path) in str(error)
    else:
        assert isinstance(config, RunConfig)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=CONFIG_DOCS)
def test_config_loader_gives_a_config_or_a_config_error(config_dir: Path, doc: str | bytes) -> None:
    check_config_file(config_dir / "run.yaml", doc)


@pytest.mark.parametrize("doc", BAD_YAML, ids=range(len(BAD_YAML)))
def test_config_loader_on_yaml_that_pyyaml_cannot_build(tmp_path: Path, doc: str) -> None:
    check_config_file(tmp_path / "run.yaml", doc)
