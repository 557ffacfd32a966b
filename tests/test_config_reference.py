"""docs/config.md is the generated reference of every config field: it must match what the config models
say now (`searchteam.config_reference.render`)."""

from pathlib import Path

from searchteam import config_reference

ROOT = Path(__file__).resolve().parents[1]


def test_docs_config_md_is_the_generated_reference():
    written = (ROOT / config_reference.DOC).read_text(encoding="utf-8")
    assert written == config_reference.render(), (
        f"{config_reference.DOC} is out of date with the config models; regenerate it with "
        f"`{config_reference.COMMAND}` (from the repository root)"
    )


def test_every_field_has_a_type_a_default_and_a_description():
    for section in config_reference.sections():
        for row in section.rows:
            assert row.type and row.default and row.description, f"{row.name} lacks a description"


def test_types_and_defaults_read_as_a_config_writer_writes_them():
    from typing import Literal

    assert config_reference.type_name(int | None) == "int | None"
    assert config_reference.type_name(list[str]) == "list[str]"
    assert config_reference.type_name(Literal["a", "b"] | None) == "a | b | None"
    assert config_reference.type_name(dict[str, int]) == "dict[str, int]"
    assert config_reference.yaml_value(None) == "null"
    assert config_reference.yaml_value(True) == "true"
    assert config_reference.yaml_value((0.9, 0.999)) == "[0.9, 0.999]"
    assert config_reference.yaml_value("bm25") == "bm25"
