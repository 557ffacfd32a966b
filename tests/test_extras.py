"""A missing optional dependency is a one-line error naming its pip extra (`searchteam.extras`). Packages are
hidden by putting None in `sys.modules` (an import then fails as if the package were not installed), so
nothing is uninstalled."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from searchteam import extras
from searchteam.errors import LLMError, MissingExtra, RetrievalError
from searchteam.extras import require


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def assert_names_extra(exc: pytest.ExceptionInfo[MissingExtra], extra: str) -> None:
    message = str(exc.value)
    assert f"needs the [{extra}] extra: pip install 'searchteam[{extra}]'" in message
    assert "\n" not in message


def test_require_names_the_extra_and_is_shown_as_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "faiss")
    with pytest.raises(MissingExtra) as exc:
        require("faiss", "dense", "dense retrieval")
    assert str(exc.value) == (
        "searchteam: dense retrieval needs the [dense] extra: pip install 'searchteam[dense]'"
    )
    # the CLI shows LLMError and RetrievalError as one line without a traceback
    assert isinstance(exc.value, LLMError) and isinstance(exc.value, RetrievalError)
    assert not extras.has("faiss") and extras.has("numpy") and not extras.has("no_such_parent.child")
    assert require("numpy", "dense", "x") is np


def test_require_keeps_the_error_of_an_installed_module_whose_dependency_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "half_installed.py").write_text("import no_such_dependency_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_here"):
        require("half_installed", "dense", "x")


def test_ov_backend_without_openvino(monkeypatch: pytest.MonkeyPatch) -> None:
    from searchteam.llm import build_llm, resolve_backend
    from searchteam.llm.ov_export import _export_ir

    hide(monkeypatch, "openvino_genai", "openvino", "nncf")
    with pytest.raises(MissingExtra) as exc:
        build_llm("smollm2-135m", backend="ov")
    assert_names_extra(exc, "cpu")
    with pytest.raises(MissingExtra) as exc:
        _export_ir("smollm2-135m", "int8", Path("unused"))
    assert_names_extra(exc, "cpu")
    assert resolve_backend("auto", "smollm2-135m", "cpu") == "hf"  # auto does not pick what is missing


def test_cli_ask_with_ov_missing_prints_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from searchteam.cli import app

    hide(monkeypatch, "openvino_genai")
    result = CliRunner().invoke(app, ["ask", "--backend", "ov", "Who wrote Dune?"])
    assert result.exit_code == 2
    assert "needs the [cpu] extra: pip install 'searchteam[cpu]'" in result.output
    assert "Traceback" not in result.output


def test_vllm_backend_without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    from searchteam.llm.vllm import _start_vllm

    hide(monkeypatch, "vllm")
    with pytest.raises(MissingExtra) as exc:
        _start_vllm({"model": "m"})
    assert_names_extra(exc, "gpu")


def test_dense_retrieval_and_reranking_without_their_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from searchteam.retrieval.dense import _flat_index, load_embedder
    from searchteam.retrieval.prebuilt import read_index
    from searchteam.retrieval.rerank import CrossEncoderScorer

    hide(monkeypatch, "faiss", "sentence_transformers")
    with pytest.raises(MissingExtra) as exc:
        load_embedder("a-model-no-test-loaded", None)
    assert_names_extra(exc, "dense")
    with pytest.raises(MissingExtra) as exc:
        _flat_index(np.ones((2, 3), dtype=np.float32))
    assert_names_extra(exc, "dense")
    index = tmp_path / "x.index"
    index.write_bytes(b"")
    with pytest.raises(MissingExtra) as exc:
        read_index(index)
    assert_names_extra(exc, "dense")
    with pytest.raises(MissingExtra) as exc:
        CrossEncoderScorer("cross-encoder/x")
    assert_names_extra(exc, "dense")


def test_training_curves_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from searchteam.rl.config import LOG_NAME
    from searchteam.train.plot import curves_after_training, plot_run

    (tmp_path / LOG_NAME).write_text('{"step": 1, "reward/mean": 0.5}\n')
    hide(monkeypatch, "matplotlib", "matplotlib.pyplot")
    with pytest.raises(MissingExtra) as exc:
        plot_run(tmp_path)
    assert_names_extra(exc, "train")
    # `searchteam train` ends with a note, not an error: the trained run is kept
    note = curves_after_training(tmp_path)
    assert note == f"none: pip install 'searchteam[train]', then searchteam plot {tmp_path}"


def test_tensorboard_missing_names_the_train_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from searchteam import tracking
    from searchteam.errors import ConfigError

    monkeypatch.setattr(tracking, "is_installed", lambda name: False)
    with pytest.raises(ConfigError, match=r"pip install 'searchteam\[train\]'"):
        tracking.check_installed(["tensorboard"])
    with pytest.warns(UserWarning, match=r"pip install 'searchteam\[train\]'"):
        assert tracking.default_trackers() == []


def test_a_trained_adapter_missing_from_the_install_says_where_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    import searchteam.methods  # noqa: F401  (registers the shipped adapters)
    from searchteam.llm import models

    name = "qwen2.5-coder-0.5b-jade"  # a wheel install: the card, not the weights
    monkeypatch.setitem(models.TRAINED, name, replace(models.TRAINED[name], path=tmp_path / name))
    with pytest.raises(LLMError, match=r"not in this install .*\(pip install -e \.\)"):
        models.checkpoint_of("qwen2.5-coder-0.5b-jade")
    assert models.checkpoint_of("smollm2-135m") == "smollm2-135m"
