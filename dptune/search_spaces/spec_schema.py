"""The JSON Schema of a whole sweep spec: its registered sections, the ``trial`` section in full.

Every section is named with its summary (so an editor completes and documents the top-level keys
and flags a misspelt one); the ``trial`` section's options are typed from the trial schema. The
other sections' contents are checked by their parsers when the spec is loaded.
"""
from __future__ import annotations

from ..schema.json_schema import trial_section_schema
from .spec import SECTIONS

SCHEMA_URI = "https://json-schema.org/draft/2020-12/schema"


def spec_json_schema() -> dict:
    """The spec's JSON Schema over the sections registered so far (import the platform's spec
    sections first to include ``experiment``, ``storage``, ``resources``, ``failure``, ``tracking``)."""
    properties = {name: {"description": SECTIONS.get(name).summary} for name in SECTIONS}
    properties["trial"] = {**trial_section_schema(), "description": SECTIONS.get("trial").summary}
    return {"$schema": SCHEMA_URI, "title": "dptune sweep spec", "type": "object",
            "required": [name for name in SECTIONS if SECTIONS.get(name).required],
            "properties": properties, "additionalProperties": False}
