"""Optional dependencies, installed as pip extras: a missing one is a one-line error that names its extra.

| extra   | packages                                 | needed by                                  |
| ------- | ---------------------------------------- | ------------------------------------------ |
| `cpu`   | openvino-genai, nncf                     | the `ov` backend (CPU generation)          |
| `gpu`   | vllm (alias: `vllm`)                     | the `vllm` backend                         |
| `dense` | faiss-cpu, sentence-transformers         | dense and prebuilt-index retrieval, rerank |
| `train` | matplotlib, tensorboard                  | training curves (PNG and TensorBoard)      |
| `verl`  | verl 0.9.1, transferqueue, cachetools... | `searchteam.integrations.verl`, `verl_trainer` |
| `skyrl` | skyrl 0.3.0                              | `searchteam.integrations.skyrl`            |
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from searchteam.errors import MissingExtra


def install_hint(extra: str) -> str:
    """The pip command that installs `extra`."""
    return f"pip install 'searchteam[{extra}]'"


def missing_extra(extra: str, what: str) -> MissingExtra:
    """The error for `what` (e.g. "the OpenVINO engine") when the packages of `extra` are missing."""
    return MissingExtra(f"searchteam: {what} needs the [{extra}] extra: {install_hint(extra)}")


def has(module: str) -> bool:
    """Whether `module` can be imported here (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or a module without a spec
        return False


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import `module`, or raise `MissingExtra` naming `extra` when it is not installed. An installed
    module that fails to import for another reason keeps its own error."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module != exc.name and not module.startswith(f"{exc.name}."):
            raise  # the module is there; one of its own dependencies is missing
        raise missing_extra(extra, what) from exc
