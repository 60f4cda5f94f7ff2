"""Generate the C++ decode-option header from dllm_deploy/decode_options.json (run by CMake at build
time; the header lands in the build folder and is never committed):

    python gen_decode_options.py DECLARATION.json OUT.hpp

It holds DecodeOptionFields (a typed field with its default per option the C++ runtime takes), the
option table kDecodeOptions (type, default, range or choices, help, flag) that cpp/src/options.cpp
checks and parses by, the two switches that read and write a field by its table index,
kCacheMessages (why a cache mode is refused; decoder.cpp::resolve_cache) and kOptionRules (the
rules between two options; options.cpp::check_rules).

An option declared ``"multiple": true`` (``stop``) is a ``std::vector`` of its type: in the table it
has its type (the check applies to each value), setting it appends one value and an empty text
clears it (the C ABI's dllm_options_set(opts, "stop", s)); reading it back gives its last value.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

CXX = {"int": "int", "float": "double", "str": "std::string", "bool": "bool"}
KIND = {"int": "OptionType::kInt", "float": "OptionType::kFloat", "str": "OptionType::kStr", "bool": "OptionType::kBool"}


INT32_MAX = 2**31 - 1


def cxx_type(o: dict) -> str:
    """An int declared with a maximum beyond int32 (the sampler's 64-bit seed) is a uint64_t."""
    if o["type"] == "int" and o.get("max", 0) > INT32_MAX:
        return "uint64_t"
    return CXX[o["type"]]


def literal(o: dict, v) -> str:
    """The C++ initializer of option o's value v."""
    if o["type"] == "str":
        return json.dumps(v)
    if o["type"] == "bool":
        return "true" if v else "false"
    return repr(float(v)) if o["type"] == "float" else str(int(v))


def text(v) -> str:
    """The default as the text dllm_options_set takes back."""
    if v is None:
        return "null"
    if isinstance(v, list):
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def field(o: dict) -> str:
    t = cxx_type(o)
    if o.get("multiple"):
        return f"  std::vector<{t}> {o['name']};  // {o['help']}"
    if o.get("nullable"):
        init = "" if o["default"] is None else "{" + literal(o, o["default"]) + "}"
        return f"  std::optional<{t}> {o['name']}{init};  // {o['help']}"
    return f"  {t} {o['name']} = {literal(o, o['default'])};  // {o['help']}"


def spec(o: dict) -> str:
    label = o.get("label") or o["name"].replace("_", " ")
    num = lambda k: repr(float(o[k])) if k in o else "0.0"  # noqa: E731
    parts = [json.dumps(o["name"]), json.dumps(label), json.dumps(o.get("flag") or ""), KIND[o["type"]],
             "true" if o.get("nullable") else "false", json.dumps(text(o["default"])),
             "true" if "min" in o else "false", num("min"), "true" if o.get("min_exclusive") else "false",
             "true" if "max" in o else "false", num("max"), "true" if o.get("max_exclusive") else "false",
             json.dumps("|".join(o.get("choices", []))), json.dumps(o["help"]),
             "false" if o.get("implemented") is False else "true"]
    return "    {" + ", ".join(parts) + "},"


# a "multiple" option's value: set appends (an empty text clears), get reads the last value back
LIST_HELPERS = [
    "template <class T>",
    "OptionValue option_value(const std::vector<T>& v) {",
    "  return v.empty() ? OptionValue{} : option_value(v.back());",
    "}",
    "template <class T>",
    "void assign(std::vector<T>& x, const OptionValue& v) {",
    "  if (v.s.empty() && std::is_same_v<T, std::string>) return x.clear();",
    "  T t{};",
    "  assign(t, v);",
    "  x.push_back(t);",
    "}", ""]


def render_messages(messages: dict) -> list[str]:
    """kCacheMessages: why a cache mode is refused, by key ("unknown", "<mode>.unavailable",
    "<mode>.one_branch"; {mode} and {modes} filled in by the caller), as Python's resolve_cache reads them."""
    out = ["// why a cache mode is refused (decode_options.json \"cache_messages\")",
           "inline constexpr std::pair<const char*, const char*> kCacheMessages[] = {"]
    out += [f"    {{{json.dumps(k)}, {json.dumps(v)}}}," for k, v in messages.items()]
    return out + ["};", ""]


def render_rules(rules: list[dict], names: set) -> list[str]:
    """kOptionRules: the declared rules between two options both in the C++ table (options.cpp::check_rules)."""
    out = ["// rules between two options (decode_options.json \"rules\"; those of options this runtime takes)",
           "inline constexpr OptionRule kOptionRules[] = {"]
    out += [f"    {{{json.dumps(r['option'])}, {json.dumps(r['op'])}, {json.dumps(r['than'])}, {json.dumps(r['message'])}}},"
            for r in rules if r["option"] in names and r["than"] in names]
    return out + ["};", ""]


def render(options: list[dict], messages: dict | None = None, rules: list | None = None) -> str:
    names = [o["name"] for o in options]
    out = ["// Generated by cpp/scripts/gen_decode_options.py from dllm_deploy/decode_options.json: do not edit.",
           "#pragma once", "", "#include <cstddef>", "#include <cstdint>", "#include <optional>", "#include <string>",
           "#include <type_traits>", "#include <utility>", "#include <vector>", "",
           '#include "options.hpp"', "", "namespace dllm::detail {", ""]
    if any(o.get("multiple") for o in options):
        out += LIST_HELPERS
    out += ["// every decode option the C++ runtime takes, at its default", "struct DecodeOptionFields {"]
    out += [field(o) for o in options]
    out += ["};", "", "inline constexpr OptionSpec kDecodeOptions[] = {"]
    out += [spec(o) for o in options]
    out += ["};", f"inline constexpr size_t kDecodeOptionCount = {len(options)};", "",
            "inline OptionValue get_field(const DecodeOptionFields& o, size_t index) {", "  switch (index) {"]
    out += [f"    case {i}: return option_value(o.{n});" for i, n in enumerate(names)]
    out += ["  }", "  return OptionValue{};", "}", "",
            "inline void set_field(DecodeOptionFields& o, size_t index, const OptionValue& v) {", "  switch (index) {"]
    out += [f"    case {i}: assign(o.{n}, v); break;" for i, n in enumerate(names)]
    out += ["  }", "}", ""]
    out += render_messages(messages or {})
    out += render_rules(rules or [], set(names))
    out += ["}  // namespace dllm::detail", ""]
    return "\n".join(out)


def main(src: str, dst: str) -> None:
    declared = json.loads(Path(src).read_text(encoding="utf-8"))
    options = [o for o in declared["options"] if o.get("cpp")]
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    Path(dst).write_text(render(options, declared.get("cache_messages"), declared.get("rules")), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
