"""A request's script (``pipeline/script.py``) on instructions at the API's bounds: every field the
schema admits is read, and what only a caller past the schema can send is a 400 naming the
field, never a 500. No Ray: the script is built in-process over a memory voice store."""

from __future__ import annotations

import pytest

from serve_app.engine.errors import InvalidInstructionsError
from serve_app.engine.styles import MAX_INSTRUCTIONS_CHARS, resolve_instructions
from serve_app.errors import as_api_error
from serve_app.http.security import Caller
from serve_app.pipeline.script import dialogue_script, styled
from serve_app.protocol import DialogueRequest, SpeechRequest
from serve_app.settings import VoiceStoreConfig
from serve_app.storage.voices import ANONYMOUS, MemoryVoiceStore, VoiceCatalog

CALLER = Caller(id="ip:127.0.0.1", owner=ANONYMOUS, max_priority=0, max_streams=0, max_voices=None)


def _longest(words: str) -> str:
    return (words * (MAX_INSTRUCTIONS_CHARS // len(words) + 1))[:MAX_INSTRUCTIONS_CHARS]


async def test_a_dialogue_with_both_instructions_at_their_limit_is_read():
    """The request's and a turn's instructions, each at the schema's 4096 characters: before,
    they were joined and the style reader refused the 8193-character join (ValueError: a 500)."""
    req = DialogueRequest(
        instructions=_longest("slow "),
        turns=[
            {"voice": "alloy", "input": "你好。", "instructions": _longest("fast ")},
            {"voice": "echo", "input": "Hello.", "instructions": "calm"},
        ],
    )
    script = await dialogue_script(req, VoiceCatalog(MemoryVoiceStore(VoiceStoreConfig())), CALLER, 4096)
    assert [p.turn for p in script.parts] == [0, 1]
    # The turn's instructions are read after the request's: the later "fast" wins the speed.
    assert script.parts[0].speed == pytest.approx(styled(req.to_options(), "fast")[0].speed)
    assert script.parts[0].speed > req.speed > script.parts[1].speed  # turn 1: the request's "slow"


def test_two_texts_read_as_one_with_a_clause_between():
    assert resolve_instructions("slow", "fast").speed == resolve_instructions("slow. fast").speed
    # The first text's last clause does not run into the second's first ("very" + "fast").
    assert resolve_instructions("very", "fast").applied == ("fast",)
    assert resolve_instructions(None, "", "calm") == resolve_instructions("calm")
    assert resolve_instructions(None, "") == resolve_instructions()


@pytest.mark.parametrize("texts", [("a" * (MAX_INSTRUCTIONS_CHARS + 1),), ("calm", "a" * (MAX_INSTRUCTIONS_CHARS + 1))])
def test_instructions_past_the_bound_are_a_400_naming_the_field(texts):
    """Only a caller that skips the schema gets here (the handle API validates too); the answer
    is the schema's own 400, not the 500 an untyped ValueError was."""
    with pytest.raises(InvalidInstructionsError, match=f"at most {MAX_INSTRUCTIONS_CHARS}") as exc:
        resolve_instructions(*texts)
    err = as_api_error(exc.value)
    assert (err.status, err.code, err.param) == (400, "invalid_value", "instructions")


def test_the_schema_bounds_each_instructions_field():
    too_long = "a" * (MAX_INSTRUCTIONS_CHARS + 1)
    for make in (
        lambda: SpeechRequest(input="x", instructions=too_long),
        lambda: DialogueRequest(turns=[{"input": "x", "instructions": too_long}]),
    ):
        with pytest.raises(Exception) as exc:
            make()
        err = as_api_error(exc.value)
        assert (err.status, err.code) == (400, "invalid_value") and err.param.endswith("instructions")
