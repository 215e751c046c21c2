"""The stand-in engine's toy tokenizer: ids always decode to exactly the text it returns."""

from __future__ import annotations

from clawr1.demo.standin.toy import EOS, TOOL_CLOSE, decode, encode, make_reply, render_prompt


def test_reply_ids_spell_the_text_and_end_with_eos() -> None:
    reply = make_reply(["m", [{"role": "user", "content": "hi"}]], 0, (), False, None)
    assert reply == make_reply(["m", [{"role": "user", "content": "hi"}]], 0, (), False, None)
    assert reply != make_reply(["m", [{"role": "user", "content": "hi"}]], 1, (), False, None)
    ids = reply.token_ids()
    assert ids[-1] == EOS and decode(ids) == reply.text and reply.finish_reason == "stop"


def test_tool_call_ids_spell_the_rendered_call() -> None:
    reply = make_reply("conv", 0, ["lookup"], True, None)
    (call,) = reply.tool_calls
    assert reply.text == "" and reply.finish_reason == "tool_calls"
    assert decode(reply.token_ids()) == f"{call.opening()}{call.arguments}{TOOL_CLOSE}"


def test_max_tokens_truncates_at_the_budget() -> None:
    reply = make_reply("conv", 0, (), False, 5)
    assert reply.finish_reason == "length" and len(reply.token_ids()) == 5
    assert encode(reply.text) == reply.token_ids()


def test_prompt_template_marks_roles_and_turns() -> None:
    ids = render_prompt(
        [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "u"}]}]
    )
    assert ids == [256, 259, ord("s"), 258, 260, ord("u"), 258, 261]
