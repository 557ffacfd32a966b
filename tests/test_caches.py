"""Self-healing caches: converted models, OpenVINO exports and retrieval indexes are checked against the
manifest written when they were built (or, for entries older than manifests, by a structural check), a
damaged one is rebuilt with one warning line, a failed build leaves nothing, and two processes building one
entry convert once.

The slow converters are replaced by fakes that write small files, so nothing here converts a real model."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import searchteam.llm.models as models
import searchteam.llm.ov_export as ov_export
from searchteam.cache import MANIFEST, entry_problem, manifest_problem, require_files
from searchteam.llm.models import checkpoint_problem, resolve_model
from searchteam.llm.ov_export import ir_problem, openvino_model_dir
from searchteam.retrieval.bm25 import BM25Retriever
from searchteam.retrieval.cache import COMPLETE_MARKER

REPO = Path(__file__).resolve().parents[1]
PRESET = "smollm2-135m"
CORPUS = [
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "nile", "title": "Nile", "text": "The Nile is a river in Africa."},
    {"id": "jupiter", "title": "Jupiter", "text": "Jupiter is the largest planet."},
    {"id": "mann", "title": "Thomas Mann", "text": "Thomas Mann was a German novelist."},
]


# --- fakes for the slow steps (also used by the subprocesses of tests/e2e/test_kill_resume.py) -------------


def write_fake_checkpoint(preset, workdir: Path, out: Path) -> None:
    """What `models._write_checkpoint` writes, in miniature: a config and a valid safetensors file."""
    from safetensors.numpy import save_file

    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    save_file({"weight": np.arange(4096, dtype=np.float32)}, str(out / "model.safetensors"))


def write_fake_ir(name: str, precision: str, tmp: Path) -> Path:
    """What `ov_export._export_ir` writes, in miniature: IR pairs whose constants point into their .bin."""
    out = tmp / "model"
    out.mkdir()
    for stem in ("openvino_model", "openvino_tokenizer", "openvino_detokenizer"):
        layers = "".join(
            f'<layer id="{i}" type="Const"><data offset="{256 * i}" size="256"/></layer>' for i in range(4)
        )
        (out / f"{stem}.xml").write_text(f'<?xml version="1.0"?><net><layers>{layers}</layers></net>')
        (out / f"{stem}.bin").write_bytes(bytes(range(256)) * 4)
    return out


def write_corpus(path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in CORPUS), encoding="utf-8")
    return path


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count model conversions and OpenVINO exports, done by the fakes."""
    done: list[str] = []

    def checkpoint(preset, workdir: Path, out: Path) -> None:
        done.append("model")
        write_fake_checkpoint(preset, workdir, out)

    def export(name: str, precision: str, tmp: Path) -> Path:
        done.append("openvino")
        return write_fake_ir(name, precision, tmp)

    monkeypatch.setattr(models, "_write_checkpoint", checkpoint)
    monkeypatch.setattr(ov_export, "_export_ir", export)
    return done


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def hidden_leftovers(folder: Path) -> list[str]:
    """Hidden temporary or discarded folders and files."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def overwrite_middle(path: Path) -> None:
    """Same size, different bytes, as a bad copy or a stray write would leave it; the mtime moves on."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(16)
    path.write_bytes(bytes(data))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


# --- converted models -------------------------------------------------------------------------------------


def test_model_is_converted_once_and_recorded_in_a_manifest(cache: Path, conversions: list[str]) -> None:
    path = Path(resolve_model(PRESET))
    assert path == cache / "models" / PRESET and resolve_model(PRESET) == str(path)
    assert conversions == ["model"]
    files = json.loads((path / MANIFEST).read_text())["files"]
    assert set(files) == {"config.json", "model.safetensors"}
    assert manifest_problem(path) is None and checkpoint_problem(path) is None
    assert hidden_leftovers(path.parent) == []


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: truncate(p / "model.safetensors"),
        lambda p: overwrite_middle(p / "model.safetensors"),
        lambda p: (p / "config.json").unlink(),
    ],
    ids=["truncated-weights", "changed-weights", "missing-config"],
)
def test_damaged_model_is_rebuilt_with_one_warning_line(
    cache: Path, conversions: list[str], caplog: pytest.LogCaptureFixture, damage
) -> None:
    path = Path(resolve_model(PRESET))
    damage(path)
    assert resolve_model(PRESET) == str(path)
    assert conversions == ["model", "model"]
    (message,) = warnings_of(caplog)
    assert f"model {PRESET}" in message and "rebuilding it" in message and "\n" not in message
    assert manifest_problem(path) is None and checkpoint_problem(path) is None
    assert hidden_leftovers(path.parent) == []


def test_model_from_before_manifests_is_adopted_when_sound_else_rebuilt(
    cache: Path, conversions: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = Path(resolve_model(PRESET))
    (path / MANIFEST).unlink()
    resolve_model(PRESET)
    assert conversions == ["model"] and (path / MANIFEST).is_file() and not warnings_of(caplog)

    (path / MANIFEST).unlink()
    truncate(path / "model.safetensors", keep=0.9)  # found by the safetensors header, not by a manifest
    assert "model.safetensors has" in checkpoint_problem(path)
    resolve_model(PRESET)
    assert conversions == ["model", "model"] and "its header lists" in warnings_of(caplog)[0]


def test_a_file_touched_but_unchanged_is_rehashed_once(
    cache: Path, conversions: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import searchteam.cache as cache_module

    path = Path(resolve_model(PRESET))
    os.utime(path / "model.safetensors", ns=(0, 10**18))  # a copy without -p, say
    hashed: list[str] = []
    real_sha = cache_module.file_sha256
    monkeypatch.setattr(cache_module, "file_sha256", lambda p: hashed.append(p.name) or real_sha(p))
    resolve_model(PRESET)
    resolve_model(PRESET)
    assert conversions == ["model"] and hashed == ["model.safetensors"]


@pytest.mark.parametrize("header", [b"\xff" * 8, (40).to_bytes(8, "little") + b"{not json" + b" " * 31])
def test_a_safetensors_header_that_cannot_be_read_is_a_problem(tmp_path: Path, header: bytes) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(header + bytes(64))
    assert "model.safetensors" in checkpoint_problem(tmp_path)


# --- OpenVINO exports -------------------------------------------------------------------------------------


@pytest.mark.parametrize("damaged", ["openvino_model.bin", "openvino_model.xml", "openvino_detokenizer.bin"])
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "legacy"])
def test_truncated_openvino_export_is_rebuilt(
    cache: Path, conversions: list[str], caplog: pytest.LogCaptureFixture, damaged: str, manifest: bool
) -> None:
    path = openvino_model_dir(PRESET, "int8")
    assert conversions == ["openvino"] and manifest_problem(path) is None
    if not manifest:
        (path / MANIFEST).unlink()
    truncate(path / damaged)
    assert openvino_model_dir(PRESET, "int8") == path
    assert conversions == ["openvino", "openvino"]
    (message,) = warnings_of(caplog)
    assert f"OpenVINO model {PRESET}-int8" in message and damaged in message
    assert manifest_problem(path) is None and ir_problem(path) is None


def test_the_ir_check_reads_a_real_openvino_ir(tmp_path: Path) -> None:
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([1, 4], np.float32)
    model = ov.Model([ops.matmul(x, ops.constant(np.ones((4, 4), np.float32)), False, False)], [x])
    for stem in ("openvino_model", "openvino_tokenizer", "openvino_detokenizer"):
        ov.save_model(model, tmp_path / f"{stem}.xml", compress_to_fp16=False)
    assert ir_problem(tmp_path) is None
    truncate(tmp_path / "openvino_model.bin")
    assert ir_problem(tmp_path) == "openvino_model.bin has 32 bytes, openvino_model.xml needs 64"
    (tmp_path / "openvino_model.bin").unlink()
    assert ir_problem(tmp_path) == "openvino_model.bin has 0 bytes, openvino_model.xml needs 64"
    ov.save_model(model, tmp_path / "openvino_model.xml", compress_to_fp16=False)
    truncate(tmp_path / "openvino_tokenizer.xml")
    assert "openvino_tokenizer.xml is unreadable" in ir_problem(tmp_path)


# --- retrieval indexes ------------------------------------------------------------------------------------


def test_bm25_index_is_built_once_with_a_manifest(cache: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    first = BM25Retriever(corpus)
    again = BM25Retriever(corpus)
    assert first.built_index and not again.built_index
    assert manifest_problem(first.index_path) is None
    assert "passages.json" in json.loads((first.index_path / MANIFEST).read_text())["files"]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: truncate(p / "data.csc.index.npy"), "data.csc.index.npy has"),
        (lambda p: overwrite_middle(p / "passages.json"), "passages.json is not the file that was built"),
        (lambda p: [(p / MANIFEST).unlink(), truncate(p / "passages.json")], "cannot be loaded"),
        (lambda p: [(p / MANIFEST).unlink(), (p / COMPLETE_MARKER).unlink()], "COMPLETE missing"),
    ],
    ids=["truncated", "changed", "legacy-unloadable", "legacy-incomplete"],
)
def test_damaged_bm25_index_is_rebuilt_with_one_warning_line(
    cache: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage, expected: str
) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    fresh = BM25Retriever(corpus)
    queries = ["capital of France", "largest planet"]
    want = [[p.id for p in hits] for hits in fresh.search(queries, k=2)]
    damage(fresh.index_path)
    healed = BM25Retriever(corpus)
    assert healed.built_index
    (message,) = warnings_of(caplog)
    assert "BM25 index" in message and expected in message and "\n" not in message
    assert [[p.id for p in hits] for hits in healed.search(queries, k=2)] == want
    assert manifest_problem(healed.index_path) is None
    assert hidden_leftovers(healed.index_path.parent) == []


def test_bm25_index_from_before_manifests_is_adopted(cache: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    path = BM25Retriever(corpus).index_path
    (path / MANIFEST).unlink()
    assert not BM25Retriever(corpus).built_index and manifest_problem(path) is None


class FakeEncoder:
    """Stands in for a sentence-transformers model: a fixed unit vector per text."""

    def encode(self, texts: list[str], **_: object) -> np.ndarray:
        rows = [np.random.default_rng(sum(map(ord, t))).normal(size=8) for t in texts]
        return np.array([r / np.linalg.norm(r) for r in rows], dtype=np.float32)


def test_truncated_dense_embeddings_are_rebuilt(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import searchteam.retrieval.dense as dense

    monkeypatch.setattr(dense, "load_embedder", lambda model, device: dense.Embedder(FakeEncoder()))
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    fresh = dense.DenseRetriever(corpus)
    want = [p.id for p in fresh.search(["Paris"], k=4)[0]]
    truncate(fresh.index_path / dense.EMBEDDINGS_FILE)
    healed = dense.DenseRetriever(corpus)
    assert healed.built_index and [p.id for p in healed.search(["Paris"], k=4)[0]] == want
    (message,) = warnings_of(caplog)
    assert "dense index" in message and "embeddings.npy has" in message


# --- a build that fails half-way leaves nothing that a later run trusts ------------------------------------


def test_a_failed_model_conversion_leaves_no_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_then_crash(preset, workdir: Path, out: Path) -> None:
        write_fake_checkpoint(preset, workdir, out)
        truncate(out / "model.safetensors")
        raise RuntimeError("crashed half-way")

    monkeypatch.setattr(models, "_write_checkpoint", half_then_crash)
    with pytest.raises(RuntimeError, match="crashed half-way"):
        resolve_model(PRESET)
    models_dir = cache / "models"
    assert not (models_dir / PRESET).exists() and hidden_leftovers(models_dir) == []
    monkeypatch.setattr(models, "_write_checkpoint", write_fake_checkpoint)
    assert checkpoint_problem(Path(resolve_model(PRESET))) is None


def test_a_failed_openvino_export_leaves_no_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_then_crash(name: str, precision: str, tmp: Path) -> Path:
        truncate(write_fake_ir(name, precision, tmp) / "openvino_model.bin")
        raise RuntimeError("export failed")

    monkeypatch.setattr(ov_export, "_export_ir", half_then_crash)
    with pytest.raises(RuntimeError):
        openvino_model_dir(PRESET, "fp16")
    folder = cache / "openvino"
    assert not (folder / f"{PRESET}-fp16").exists() and hidden_leftovers(folder) == []
    monkeypatch.setattr(ov_export, "_export_ir", write_fake_ir)
    assert ir_problem(openvino_model_dir(PRESET, "fp16")) is None


def test_a_failed_index_build_leaves_no_index(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import searchteam.retrieval.bm25 as bm25

    def crash(table, path: Path) -> None:
        path.write_text('{"ids": ["pa')
        raise OSError(28, "No space left on device")

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    with monkeypatch.context() as patch:
        patch.setattr(bm25.PassageTable, "save", crash)
        with pytest.raises(OSError, match="No space left"):
            BM25Retriever(corpus)
    indexes = cache / "indexes"
    assert list(indexes.iterdir()) == []
    assert BM25Retriever(corpus).built_index


# --- two builders at once -------------------------------------------------------------------------------

CONVERT_SCRIPT = """
import os, sys, time
from pathlib import Path
import searchteam.llm.models as models
from tests.test_caches import write_fake_checkpoint

log, release = Path(sys.argv[1]), Path(sys.argv[2])

def slow(preset, workdir, out):
    with log.open("a") as fh:
        fh.write(f"{os.getpid()}\\n")
    while not release.exists():
        time.sleep(0.02)
    write_fake_checkpoint(preset, workdir, out)

models._write_checkpoint = slow
print(models.resolve_model("smollm2-135m"))
"""


def test_two_processes_converting_at_once_end_with_one_valid_cache(cache: Path, tmp_path: Path) -> None:
    """The second process waits on the lock (and says so) while the first converts, then uses its result."""
    log, release = tmp_path / "conversions.log", tmp_path / "release"
    env = {**os.environ, "SEARCHTEAM_CACHE": str(cache)}
    stderr = [tmp_path / "a.err", tmp_path / "b.err"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONVERT_SCRIPT, str(log), str(release)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err.open("w"),
            text=True,
        )
        for err in stderr
    ]
    try:
        deadline = time.monotonic() + 60
        while not any("waiting for another process" in e.read_text() for e in stderr if e.exists()):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no one waited"
            time.sleep(0.02)
        release.touch()
        outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    finally:
        for p in procs:
            p.kill()
    target = cache / "models" / PRESET
    assert outputs == [str(target)] * 2 and all(p.returncode == 0 for p in procs)
    assert len(log.read_text().splitlines()) == 1
    assert entry_problem(target, require_files("config.json")) is None and checkpoint_problem(target) is None
    assert hidden_leftovers(target.parent) == []


def test_two_threads_building_one_index_build_it_once(cache: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    built: list[bool] = []
    threads = [threading.Thread(target=lambda: built.append(BM25Retriever(corpus).built_index)) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(built) == [False, True]
