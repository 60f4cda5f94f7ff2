"""Chat templates (dllm_deploy/text.py): rendered exactly as transformers renders them (templates in
the formats real checkpoints ship, as test data), carried by the artifact, used by Runtime.chat
and `generate --chat`; a broken or hostile template is one line, never a traceback."""
from __future__ import annotations

import json

import pytest

from dllm_deploy.text import load_chat_template, render
from dllm_deploy.cli import main
from dllm_deploy.errors import UserError

# LLaDA-8B-Instruct's format (Llama-3 headers, bos on the first turn)
LLADA = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
         "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"
         "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
# Gemma's format (alternating turns enforced with raise_exception, assistant -> model)
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")
# a template with the block and filter forms transformers' environment adds
TOOLS = ("{%- for m in messages %}{% generation %}{{ m.role }}: {{ m.content | tojson }}{% endgeneration %}\n"
         "{%- if loop.index > 5 %}{% break %}{% endif %}{% endfor %}")
CHATS = [
    [{"role": "user", "content": "  Hello <b>there</b> \n"}],
    [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}, {"role": "user", "content": "é ü 你好"}],
]
SPECIAL = {"bos_token": "<bos>", "eos_token": "<eos>"}


@pytest.mark.parametrize("template", [LLADA, GEMMA, TOOLS], ids=["llada", "gemma", "tojson-generation"])
@pytest.mark.parametrize("add", [True, False])
def test_rendered_as_transformers_renders(template, add):
    from transformers.utils.chat_template_utils import render_jinja_template
    for messages in CHATS:
        want, _ = render_jinja_template([messages], chat_template=template, add_generation_prompt=add, **SPECIAL)
        assert render(template, messages, add, **SPECIAL) == want[0]


def test_template_errors_are_one_line():
    with pytest.raises(UserError, match="refused these messages: System role not supported"):
        render(GEMMA, [{"role": "system", "content": "x"}], **SPECIAL)
    with pytest.raises(UserError, match=r"does not parse \(line 1"):
        render("{% for m in messages %}", CHATS[0])
    with pytest.raises(UserError, match="refused these messages"):          # the sandbox
        render("{{ messages.__class__.__mro__ }}", CHATS[0])
    with pytest.raises(UserError, match="no chat template"):
        render(None, CHATS[0])
    with pytest.raises(UserError, match="chat message 0: needs a string 'role'"):
        render(LLADA, [{"content": "x"}])


def test_the_template_is_found_where_checkpoints_keep_it(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default", "template": "A"},
                                                                                    {"name": "tool_use", "template": "B"}]}))
    assert load_chat_template(tmp_path) == "A"
    (tmp_path / "chat_template.jinja").write_text("C")
    assert load_chat_template(tmp_path) == "C"
    (tmp_path / "mine.jinja").write_text("D")
    assert load_chat_template(tmp_path, tmp_path / "mine.jinja") == "D"
    with pytest.raises(UserError, match="cannot read the chat template"):
        load_chat_template(tmp_path, tmp_path / "absent.jinja")


def test_the_artifact_carries_the_template_and_chat_answers(tiny_artifact, capsys):
    from dllm_deploy import Runtime
    art, _ = tiny_artifact
    m = json.loads((art / "manifest.json").read_text())
    assert m["chat"]["template"] == "chat_template.jinja" and "chat_template.jinja" in m["files"]
    rt = Runtime.load(artifact=str(art))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "upper: quiet river"}]
    assert rt.chat_prompt(messages) == "upper: quiet river\n"
    assert rt.chat(messages).text == "QUIET RIVER"
    assert main(["generate", "--artifact", str(art), "--chat", json.dumps(messages), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "QUIET RIVER"
    assert main(["generate", "--artifact", str(art), "--chat", "[]"]) == 2
    assert main(["generate", "--artifact", str(art), "--chat", json.dumps(messages), "--prompt", "x"]) == 2
