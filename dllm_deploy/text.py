r"""User text: prompts as typed, and chat messages rendered with a model's template.

Prompt text as the user typed it: backslash escapes (``generate --escapes``) and text that is
not valid Unicode.

    decode_escapes(r"a\tb\u00e9")   'a\tbé' -- non-ASCII text stays as typed; a bad escape is a UserError
    valid_text("ab\udcffcd")        'ab\ufffdcd' -- bytes that were not UTF-8 become U+FFFD

Pure functions with no dependencies, so the CLI, the tokenizers and the fuzz tests share them.

Chat templates: a model's ``chat_template`` rendered as transformers renders it.

    template = load_chat_template(folder)          # chat_template.jinja, else tokenizer_config.json's
    render(template, [{"role": "user", "content": "upper: dog"}], add_generation_prompt=True)

Rendering follows transformers' ``apply_chat_template`` (utils/chat_template_utils.py): a sandboxed
Jinja environment (``ImmutableSandboxedEnvironment``, trim_blocks, lstrip_blocks, loop controls),
its ``tojson`` (no HTML escaping), ``raise_exception``, ``strftime_now``, and the variables
``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token`` plus any extra ones. A
template is code from the checkpoint: the sandbox refuses attribute access to Python internals.
``{% generation %}`` blocks (assistant masks in training) render their body. The C++ runtime
takes prompts already rendered (docs/serving.md).
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from .errors import UserError

#: single-character escapes and what they stand for
SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}
#: escapes followed by a fixed number of hex digits: \xHH, \uHHHH, \UHHHHHHHH
HEX = {"x": 2, "u": 4, "U": 8}
KNOWN = r"""known: \n \t \r \0 \\ \" \' \xHH \uHHHH \UHHHHHHHH"""
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD. Python keeps command-line bytes that
    are not UTF-8 as such surrogates (surrogateescape); they cannot be encoded, so a prompt with
    bad bytes is decoded with one replacement character per bad byte instead of failing."""
    return _SURROGATE.sub("\ufffd", text)


def decode_escapes(text: str, flag: str = "--escapes") -> str:
    r"""Interpret \n \t \r \0 \\ \" \' \xHH \uHHHH \UHHHHHHHH in ``text``; every other character,
    ASCII or not, is kept as it is. An unknown or incomplete escape, a trailing backslash or a
    code point that is not a character is a UserError naming ``flag``."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 == len(text):
            raise UserError(f"{flag}: the prompt ends with a lone backslash (write \\\\ for one backslash)")
        e = text[i + 1]
        if e in SIMPLE:
            out.append(SIMPLE[e])
            i += 2
            continue
        if e not in HEX:
            raise UserError(f"{flag}: unknown escape, a backslash then {e!r} at offset {i} ({KNOWN})")
        digits = text[i + 2:i + 2 + HEX[e]]
        if len(digits) != HEX[e] or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise UserError(f"{flag}: incomplete escape \\{e} at offset {i} (it takes {HEX[e]} hex digits)")
        code = int(digits, 16)
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise UserError(f"{flag}: escape \\{e}{digits} at offset {i} is not a Unicode character")
        out.append(chr(code))
        i += 2 + HEX[e]
    return "".join(out)


TEMPLATE_FILE = "chat_template.jinja"


def load_chat_template(folder: str | Path, override: str | Path | None = None) -> str | None:
    """The chat template of a Hugging Face folder: ``override`` (a file), else the folder's
    chat_template.jinja, else tokenizer_config.json's ``chat_template`` (a string, or a list of
    named ones: "default"); None if it has none."""
    if override is not None:
        try:
            return Path(override).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{override}: cannot read the chat template ({getattr(e, 'strerror', None) or e})") from None
    folder = Path(folder)
    if (folder / TEMPLATE_FILE).is_file():
        return (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
    t = _tokenizer_config(folder).get("chat_template")
    if isinstance(t, list):
        named = {x.get("name"): x.get("template") for x in t if isinstance(x, dict)}
        t = named.get("default")
    return t if isinstance(t, str) else None


def special_tokens(folder: str | Path) -> dict:
    """``bos_token`` / ``eos_token`` strings of tokenizer_config.json (a string or {"content": ...})."""
    cfg, out = _tokenizer_config(Path(folder)), {}
    for key in ("bos_token", "eos_token"):
        v = cfg.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            out[key] = v
    return out


def _tokenizer_config(folder: Path) -> dict:
    """The folder's tokenizer_config.json ({} when it has none or it is not a JSON object)."""
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: the body, as rendered without assistant masks."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def check_template(template: str) -> str:
    """``template`` if it parses, else a one-line UserError (a server checks it before it starts)."""
    import jinja2
    try:
        _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"the chat template does not parse (line {e.lineno}: {e.message})") from None
    return template


def check_messages(messages) -> list[dict]:
    """``messages`` as a list of {"role": str, "content": ...}; a UserError naming the first bad one."""
    if not isinstance(messages, list) or not messages:
        raise UserError("chat messages must be a non-empty list of {\"role\": ..., \"content\": ...} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise UserError(f"chat message {i}: needs a string 'role' and a 'content'")
    return messages


def render(template: str | None, messages, add_generation_prompt: bool = True, **variables) -> str:
    """The prompt text of ``messages`` under ``template``; one-line UserErrors for no template,
    a template that does not parse, or one that raises (``raise_exception``) on these messages."""
    import jinja2
    if template is None:
        raise UserError("this model has no chat template (export with --chat-template FILE, or give a prompt)")
    messages = check_messages(messages)
    try:
        compiled = _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"the chat template does not parse (line {e.lineno}: {e.message})") from None
    try:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as e:
        raise UserError(f"the chat template refused these messages: {e}") from None
