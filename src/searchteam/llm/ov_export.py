"""Conversion of an embedded model preset into an OpenVINO IR directory for the `ov` backend.

OpenVINO GenAI builds a llama/qwen2 graph (paged attention, KV cache as state) from a GGUF file. Its reader
of the shipped Q4_1 weights gives a different model from the one transformers dequantizes (last-token
logits off by up to 15 on SmolLM2-135M), so the GGUF serves only to carry the architecture: we rewrite it
with F16 weights, let GenAI build the graph, then

- put the transformers checkpoint's fp32 tensors in place of the F16 ones: the same numbers the `hf`
  backend and the trainer compute with;
- name each projection MatMul after its transformers module (`model.layers.3.self_attn.q_proj`), which is
  how GenAI finds where a peft LoRA adapter applies (its own names, `MatMul_30`, match no adapter);
- compress the weights to int8 with NNCF (per output channel, asymmetric; the default) or store them as
  fp16 or fp32.

The result is cached once per preset and precision, written to a temporary folder with its manifest and
renamed into place; a truncated or changed file is detected and the export rebuilt (`searchteam.cache`).
"""

from __future__ import annotations

import os
import re
import shutil
from functools import partial
from pathlib import Path
from xml.etree import ElementTree

import numpy as np

from searchteam.cache import cache_dir, ensure_cache, write_manifest
from searchteam.errors import LLMError
from searchteam.extras import require
from searchteam.files import temp_entry
from searchteam.llm.models import PRESETS, _gguf_source, resolve_model

OV_PRECISIONS = ("int8", "fp16", "fp32")
OV_EXTRA, OV_WHAT = "cpu", "the OpenVINO engine (--backend ov)"
MODEL_XML = "openvino_model.xml"
_TOKENIZER_FILES = (
    "openvino_tokenizer.xml",
    "openvino_tokenizer.bin",
    "openvino_detokenizer.xml",
    "openvino_detokenizer.bin",
)
_LAYER_WEIGHT = re.compile(r"^model\.layers\[(\d+)\]\.(.+)\.weight$")


def openvino_model_dir(name: str, precision: str = "int8") -> Path:
    """The IR directory of preset `name` at `precision` (int8 weights by default), converted on first use."""
    if precision not in OV_PRECISIONS:
        raise LLMError(f"unknown OpenVINO precision '{precision}'; choose one of {', '.join(OV_PRECISIONS)}")
    if name not in PRESETS:
        raise LLMError(
            f"the ov backend converts the embedded presets ({', '.join(PRESETS)}), not '{name}'; "
            "use --backend hf, or an OpenAI-compatible server with --backend openai"
        )
    target = cache_dir("openvino") / f"{name}-{precision}"
    ensure_cache(
        target, partial(_convert, name, precision, target), f"OpenVINO model {target.name}", ir_problem
    )
    return target


def ir_problem(folder: Path) -> str | None:
    """What keeps `folder` from being a whole IR directory: an `.xml` missing or unreadable, or a `.bin`
    shorter than the constants its `.xml` points into."""
    for xml in (MODEL_XML, *(f for f in _TOKENIZER_FILES if f.endswith(".xml"))):
        if problem := _ir_file_problem(folder / xml):
            return problem
    return None


def _ir_file_problem(xml: Path) -> str | None:
    if not xml.is_file():
        return f"{xml.name} is missing"
    try:
        constants = ElementTree.parse(xml).getroot().iter("data")
        needed = max((int(d.get("offset", 0)) + int(d.get("size", 0)) for d in constants), default=0)
    except (ElementTree.ParseError, ValueError) as exc:
        return f"{xml.name} is unreadable ({exc})"
    weights = xml.with_suffix(".bin")
    size = weights.stat().st_size if weights.is_file() else 0
    return None if size >= needed else f"{weights.name} has {size:,} bytes, {xml.name} needs {needed:,}"


def _convert(name: str, precision: str, target: Path) -> None:
    """Export into a temporary folder, write its manifest and rename it into place."""
    tmp = temp_entry(target)
    try:
        out = _export_ir(name, precision, tmp)
        write_manifest(out)
        os.replace(out, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _export_ir(name: str, precision: str, tmp: Path) -> Path:
    """The slow step: build the IR of preset `name` under `tmp`; returns the finished folder `tmp/model`."""
    ov = require("openvino", OV_EXTRA, OV_WHAT)
    openvino_genai = require("openvino_genai", OV_EXTRA, OV_WHAT)

    hf_dir = Path(resolve_model(name))
    carrier = tmp / "carrier" / "model.gguf"
    carrier.parent.mkdir()
    _write_carrier_gguf(_gguf_source(PRESETS[name], tmp), carrier)
    # builds the graph from the GGUF and saves it (with the tokenizer) next to it
    openvino_genai.LLMPipeline(str(carrier), "CPU", enable_save_ov_model=True)
    model = ov.Core().read_model(carrier.parent / MODEL_XML)
    if name_projections(model) == 0:
        raise LLMError(f"{name}: no projection of the OpenVINO graph could be named; cannot apply LoRA")
    load_checkpoint_weights(model, _fp32_weights(hf_dir))
    if precision == "int8":
        nncf = require("nncf", OV_EXTRA, "int8 OpenVINO weights")
        model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    out = tmp / "model"
    out.mkdir()
    ov.save_model(model, out / MODEL_XML, compress_to_fp16=precision == "fp16")
    for file in _TOKENIZER_FILES:
        shutil.copy2(carrier.parent / file, out / file)
    return out


def _write_carrier_gguf(source: Path, dest: Path) -> None:
    """A copy of `source` (same metadata and tokenizer) whose matrices are its dequantized weights in F16."""
    import gguf

    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(dest, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type":
            writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub_type)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, data if data.ndim < 2 else data.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _fp32_weights(hf_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    weights: dict[str, np.ndarray] = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        weights.update(load_file(file))
    return weights


def name_projections(model) -> int:
    """Give each layer's projection MatMul its transformers module name, which LoRA adapters are keyed by.
    Returns how many it named."""
    named = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul":
            continue
        weight = node.input(1).get_source_output().get_node()
        if weight.get_type_name() == "Convert":
            weight = weight.input(0).get_source_output().get_node()
        if weight.get_type_name() == "Constant" and (module := _checkpoint_name(weight.get_friendly_name())):
            node.set_friendly_name(module.removesuffix(".weight"))
            named += 1
    return named


def load_checkpoint_weights(model, weights: dict[str, np.ndarray]) -> None:
    """Replace each F16 matrix the graph converts to f32 by the checkpoint's own fp32 tensor (same shape and
    layout: GenAI undoes llama.cpp's q/k row permutation when it reads the GGUF)."""
    import openvino as ov

    for node in model.get_ordered_ops():
        name = _checkpoint_name(node.get_friendly_name()) if node.get_type_name() == "Constant" else None
        if name is None or name not in weights or len(node.get_output_shape(0)) < 2:
            continue
        exact = weights[name].astype(np.float32)
        if tuple(node.get_output_shape(0)) != exact.shape:
            raise LLMError(f"{name}: checkpoint shape {exact.shape} differs from the graph's")
        replacement = ov.op.Constant(exact)
        replacement.set_friendly_name(node.get_friendly_name())
        for consumer in list(node.output(0).get_target_inputs()):
            convert = consumer.get_node()
            if convert.get_type_name() == "Convert":
                convert.output(0).replace(replacement.output(0))


def _checkpoint_name(graph_name: str) -> str | None:
    """`model.layers[3].mlp.up_proj.weight` -> `model.layers.3.mlp.up_proj.weight`; embeddings as they are."""
    if match := _LAYER_WEIGHT.match(graph_name):
        return f"model.layers.{match.group(1)}.{match.group(2)}.weight"
    return graph_name if graph_name in ("model.embed_tokens.weight", "lm_head.weight") else None
