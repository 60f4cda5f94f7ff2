// dllm-generate: decode prompts from an exported artifact with the C++ runtime.
//
//   dllm-generate --artifact DIR --prompt TEXT [--strategy vanilla|threshold|spd] [--json] ...
//   (a self-speculative model's artifact: --strategy ar|linear-spec|tree-spec|fastdiffuser, docs/self_speculation.md;
//    a DiffusionGemma artifact: --gen-length, --steps, --seed, --stop, docs/diffusion_gemma.md)
//   dllm-generate --artifact DIR --prompts-file FILE --json      # one JSON object per line
//   dllm-generate --artifact DIR --prompts-file FILE --batch-size 4 --json   # 4 prompts per batch
//
// --json prints the keys of `dllm-deploy generate --json` (text, token_ids, forwards, tokens, tpf,
// wall_s, tokens_per_s, beam_width_used, accepted_hist, finished, finish_reason,
// time_to_first_token_s, beam_width_requested) plus backend_s (seconds inside ONNX Runtime).
// --stream prints the text as it becomes final (docs/streaming.md), flushed per chunk; with --json,
// one JSON object per chunk (index, delta, token_ids, forwards, tokens, finish_reason), then the
// result's object, per prompt. A prompts file holds one prompt per line: a line that
// starts with a double quote is a JSON string ("upper: air\n" carries its newline; one that is
// not valid JSON text, e.g. not UTF-8 or an unpaired surrogate escape, is refused), any other
// line is taken as is (without its line ending); blank lines are skipped. A prompt holding a NUL
// byte is refused (FILE:LINE); invalid UTF-8 is read as U+FFFD, as `dllm-deploy generate` does.
// A user error prints one line on stderr and exits with 2 (1 for an internal error). The decode
// flags are the declared options' (dllm_option_info): a new option needs no code here.
// --trace FILE writes each decode step's decisions and their margins (masked-diffusion models), one
// JSON object a line, as `dllm-deploy generate --trace` (row: the prompt's index in its batch).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dllm_deploy/dllm.hpp"

namespace {

const char* kUsage =
    "usage: dllm-generate --artifact DIR (--prompt TEXT | --prompts-file FILE) [--max-beam-width W]\n"
    "                     [--precision fp32|int8|int4] [--threads N] [--no-verify] [--json] [--stream]\n"
    "                     [--batch-size N] [--trace FILE]\n"
    "                     [DECODE OPTIONS]\n"
    "decode options:\n";

// The usage line of every declared decode option with a flag.
std::string usage() {
  std::string out = kUsage;
  for (size_t i = 0; i < dllm_option_count(); ++i) {
    const std::string flag = dllm_option_info(i, "flag");
    if (flag.empty()) continue;
    const std::string help = dllm_option_info(i, "help"), fallback = dllm_option_info(i, "default");
    const bool quiet = fallback == "null" || help.find("default") != std::string::npos;  // options.Option.help_text
    out += "  " + flag + " " + dllm_option_info(i, "type") + "  " + help + (quiet ? "" : " (default: " + fallback + ")") + "\n";
  }
  return out;
}

// The decode option whose flag is `flag`, or "" when it is not a decode flag.
std::string option_of(const std::string& flag) {
  for (size_t i = 0; i < dllm_option_count(); ++i)
    if (flag == dllm_option_info(i, "flag")) return dllm_option_info(i, "name");
  return "";
}

struct UsageError {
  std::string message;
};

int to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < -2147483647L || x > 2147483647L)
    throw UsageError{"argument " + flag + ": invalid int value: '" + v + "'"};
  return static_cast<int>(x);
}

int at_least_1(const std::string& flag, const std::string& v) {
  const int x = to_int(flag, v);
  if (x < 1) throw UsageError{"argument " + flag + ": must be >= 1, got " + v};
  return x;
}

// A JSON string literal (the whole line) -> its UTF-8 text; false if the line is not one.
bool json_string(const std::string& line, std::string& out) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_string()) return false;  // a syntax error (discarded) or another JSON value
  out = j.get<std::string>();
  return true;
}

[[noreturn]] void bad_prompts_file(const std::string& where, const std::string& what) {
  throw dllm::Error(DLLM_ERROR_INVALID_ARGUMENT, where + ": " + what);
}

// The prompts of a --prompts-file (the file's format: the comment at the top). A NUL byte is
// refused (a prompt crosses the C ABI as a NUL-terminated string: it would be cut short);
// invalid UTF-8 is kept and read as U+FFFD by the runtime.
std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad_prompts_file(path, std::string("cannot read the prompts file (") + std::strerror(errno) + ")");
  std::vector<std::string> prompts;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string where = path + ":" + std::to_string(number);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::string text = line;
    if (line[0] == '"' && !json_string(line, text)) bad_prompts_file(where, "not a valid JSON string");
    if (text.find('\0') != std::string::npos) bad_prompts_file(where, "the prompt holds a NUL byte");
    prompts.push_back(std::move(text));
  }
  if (in.bad()) bad_prompts_file(path, std::string("cannot read the prompts file (") + std::strerror(errno) + ")");
  if (prompts.empty()) bad_prompts_file(path, "no prompt in the file");
  return prompts;
}

// An option error names the flag it came from.
void set_option(dllm::Options& options, const std::string& name, const std::string& flag, const std::string& value) {
  try {
    options.set(name, value);
  } catch (const dllm::Error& e) {
    const std::string message = e.what();
    throw dllm::Error(e.code(), message.find(flag) == std::string::npos ? message + " (" + flag + ")" : message,
                      e.key());
  }
}

float to_float(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const float x = std::strtof(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno != 0) throw UsageError{"argument " + flag + ": invalid float value: '" + v + "'"};
  return x;
}

// Whether DIR/manifest.json records a self-speculative model (capabilities.attention "causal"); false
// when it cannot be read (the runtime's load then says why).
bool self_speculative_manifest(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json", std::ios::binary);
  if (!in) return false;
  const nlohmann::json m = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object() || !m.contains("capabilities") || !m["capabilities"].is_object()) return false;
  const nlohmann::json& c = m["capabilities"];
  return c.contains("attention") && c["attention"].is_string() && c["attention"].get<std::string>() == "causal";
}

// The decode flags a self-speculative model reads (docs/self_speculation.md) into its config.
dllm::SelfSpecConfig self_spec_config(const std::vector<std::pair<std::string, std::string>>& flags) {
  dllm::SelfSpecConfig c;
  for (const auto& [flag, v] : flags) {
    if (flag == "--strategy") c.strategy = v;
    else if (flag == "--beam-width") c.beam_width = at_least_1(flag, v);
    else if (flag == "--block-length") c.block_size = at_least_1(flag, v);
    else if (flag == "--gen-length" || flag == "--max-tokens") c.max_new_tokens = at_least_1(flag, v);
    else if (flag == "--temperature") c.temperature = to_float(flag, v);
    else if (flag == "--seed") c.seed = static_cast<uint64_t>(to_int(flag, v));
    else if (flag == "--threshold") c.threshold = to_float(flag, v);
    else if (flag == "--stop") {
      if (v.empty()) throw UsageError{"argument --stop: a stop string is not empty"};
      c.stop.push_back(v);
    } else throw UsageError{flag + " does not apply to a self-speculative model (it reads --strategy, --beam-width, "
                            "--block-length, --gen-length, --max-tokens, --temperature, --seed, --threshold, --stop)"};
  }
  return c;
}

// Whether DIR/manifest.json names the uniform-diffusion format (DiffusionGemma); false when it cannot be read.
bool uniform_manifest(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json", std::ios::binary);
  if (!in) return false;
  const nlohmann::json m = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return m.is_object() && m.contains("format") && m["format"].is_string() &&
         m["format"].get<std::string>() == "diffusion_gemma/1";
}

// The decode flags a uniform-diffusion model reads (docs/diffusion_gemma.md) over its defaults.
dllm::UniformConfig uniform_config(dllm::UniformConfig c, const std::vector<std::pair<std::string, std::string>>& flags) {
  int gen_length = 0, max_tokens = 0;
  for (const auto& [flag, v] : flags) {
    if (flag == "--gen-length") gen_length = at_least_1(flag, v);
    else if (flag == "--max-tokens") max_tokens = at_least_1(flag, v);
    else if (flag == "--steps") c.max_denoising_steps = at_least_1(flag, v);
    else if (flag == "--seed") c.seed = static_cast<uint64_t>(to_int(flag, v));
    else if (flag == "--stop") {
      if (v.empty()) throw UsageError{"argument --stop: a stop string is not empty"};
      c.stop.push_back(v);
    } else throw UsageError{flag + " does not apply to a uniform-diffusion model (it reads --gen-length, --max-tokens, "
                            "--steps, --seed, --stop)"};
  }
  if (gen_length && max_tokens && gen_length != max_tokens)
    throw UsageError{"a uniform-diffusion model takes one budget in C++: give --gen-length or --max-tokens"};
  if (gen_length || max_tokens) c.max_new_tokens = gen_length ? gen_length : max_tokens;
  return c;
}

// One result: its JSON (stdout), or its text (unless streamed) and a line of stats naming `what`
// (stderr); its warnings first.
void print_result(const dllm::Result& r, bool json, bool streamed, const std::string& what) {
  const std::string warnings = r.warnings();
  if (!warnings.empty()) std::cerr << "dllm-generate: warning: " << warnings << "\n";
  if (json) {
    std::cout << r.json() << "\n" << std::flush;
    return;
  }
  const dllm::Stats s = r.stats();
  std::cout << (streamed ? "" : r.text()) << "\n" << std::flush;
  std::fprintf(stderr, "[%lld tokens, %lld forwards, TPF %.2f, %.1f tok/s, %s, backend ort-cpp, %s]\n",
               static_cast<long long>(s.tokens), static_cast<long long>(s.forwards), s.tpf, s.tokens_per_s,
               what.c_str(), r.finish_reason().c_str());
}

// The prompts batch after batch (--batch-size of them decoded together, one batch as Python's
// generate), every result printed; decode(batch) gives the batch's results, what(result) its stats' label.
template <class Decode, class What>
int run_batches(const std::vector<std::string>& prompts, size_t batch_size, bool json, bool streamed, Decode decode,
                What what) {
  for (size_t first = 0; first < prompts.size(); first += batch_size) {
    const std::vector<std::string> batch(prompts.begin() + static_cast<long>(first),
                                         prompts.begin() + static_cast<long>(std::min(first + batch_size, prompts.size())));
    for (const dllm::Result& r : decode(batch)) print_result(r, json, streamed, what(r));
  }
  return 0;
}

// --trace: the records written whole, then renamed into place.
void write_trace(const std::string& path, const std::string& records) {
  const std::filesystem::path target(path);
  const std::filesystem::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp");
  {
    std::ofstream f(tmp, std::ios::binary);
    f << records;
    if (!f.flush()) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw UsageError{"--trace: cannot write " + path};
    }
  }
  std::error_code err;
  std::filesystem::rename(tmp, target, err);
  if (err) {
    std::filesystem::remove(tmp, err);
    throw UsageError{"--trace: cannot write " + path};
  }
  size_t n = 0;
  for (char c : records) n += c == '\n';
  std::cerr << "trace: " << n << " decision records in " << path << "\n";
}

int run(int argc, char** argv) {
  std::string artifact, prompt, prompts_file, trace_file;
  bool have_prompt = false, json = false, stream = false;
  size_t batch_size = 1;
  dllm::RuntimeOptions ropt;
  ropt.warnings_to_stderr = false;  // printed below with this program's prefix
  std::vector<std::pair<std::string, std::string>> decode_flags;  // checked once the model's kind is known
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::cout << usage();
      return 0;
    }
    if (flag == "--json") {
      json = true;
      continue;
    }
    if (flag == "--stream") {
      stream = true;
      continue;
    }
    if (flag == "--no-verify") {
      ropt.verify_hashes = false;
      continue;
    }
    if (i + 1 >= argc) throw UsageError{"argument " + flag + ": expected one argument"};
    const std::string v = argv[++i];
    if (flag == "--artifact") artifact = v;
    else if (flag == "--prompt") prompt = v, have_prompt = true;
    else if (flag == "--prompts-file") prompts_file = v;
    else if (flag == "--trace") trace_file = v;
    else if (flag == "--max-beam-width") ropt.max_beam_width = at_least_1(flag, v);
    else if (flag == "--batch-size") batch_size = static_cast<size_t>(at_least_1(flag, v));
    else if (!option_of(flag).empty()) decode_flags.emplace_back(flag, v);
    else if (flag == "--precision") ropt.precision = v;
    else if (flag == "--threads") ropt.intra_op_threads = to_int(flag, v);
    else throw UsageError{"unrecognized argument: " + flag};
  }
  if (artifact.empty()) throw UsageError{"the following argument is required: --artifact"};
  if (have_prompt == !prompts_file.empty()) throw UsageError{"give exactly one of --prompt and --prompts-file"};
  if (ropt.intra_op_threads < 0) throw UsageError{"argument --threads: must be >= 0"};
  if (stream && !json && batch_size > 1)
    throw UsageError{"--stream prints one prompt's text as it comes: use --batch-size 1, or add --json"};

  // the decode flags are checked before the artifact loads: a self-speculative or uniform-diffusion
  // model's own, or the options'
  const bool uniform = uniform_manifest(artifact);
  if (!trace_file.empty() && (uniform || self_speculative_manifest(artifact)))
    throw UsageError{"--trace records the decisions of masked-diffusion models; " + artifact + " is a " +
                     (uniform ? "uniform-diffusion" : "self-speculative") + " one"};
  if (uniform) {
    (void)uniform_config(dllm::UniformConfig(), decode_flags);   // flag errors first, as for the others
    std::vector<std::string> prompts = have_prompt ? std::vector<std::string>{prompt} : read_prompts(prompts_file);
    dllm::Runtime rt(artifact, ropt);
    const dllm::UniformConfig c = uniform_config(rt.uniform_config(), decode_flags);
    const dllm::ChunkCallback print_chunk = [json](const dllm::Chunk& ch) {
      std::cout << (json ? ch.json + "\n" : ch.delta) << std::flush;
      return true;
    };
    return run_batches(
        prompts, batch_size, json, stream,
        [&](const std::vector<std::string>& b) { return rt.uniform_generate(b, c, stream ? print_chunk : dllm::ChunkCallback()); },
        [&](const dllm::Result&) { return "uniform-diffusion " + std::to_string(c.max_denoising_steps) + " steps"; });
  }
  const bool self_spec = self_speculative_manifest(artifact);
  dllm::Options cfg;
  dllm::SelfSpecConfig spec_cfg;
  if (self_spec) spec_cfg = self_spec_config(decode_flags);
  else
    for (const auto& [flag, v] : decode_flags) set_option(cfg, option_of(flag), flag, v);
  std::vector<std::string> prompts = have_prompt ? std::vector<std::string>{prompt} : read_prompts(prompts_file);
  dllm::Runtime rt(artifact, ropt);
  if (rt.self_speculative() != self_spec) throw dllm::Error(DLLM_ERROR_INVALID_ARGUMENT, artifact + ": the manifest changed while loading");
  // --stream: each chunk as it comes (its JSON line, or its delta)
  const dllm::ChunkCallback print_chunk = [json](const dllm::Chunk& c) {
    std::cout << (json ? c.json + "\n" : c.delta) << std::flush;
    return true;
  };
  const dllm::ChunkCallback on_chunk = stream ? print_chunk : dllm::ChunkCallback();
  if (self_spec)   // its own strategies: ar, linear-spec, tree-spec, fastdiffuser
    return run_batches(
        prompts, batch_size, json, stream,
        [&](const std::vector<std::string>& b) { return rt.self_spec_generate(b, spec_cfg, on_chunk); },
        [&](const dllm::Result& r) { return spec_cfg.strategy + " W " + std::to_string(r.stats().beam_width_used); });
  std::string trace;
  if (!trace_file.empty()) rt.set_trace([&trace](const std::string& line) { trace += line + "\n"; });
  const int rc = run_batches(
      prompts, batch_size, json, stream,
      [&](const std::vector<std::string>& b) { return rt.generate_batch(b, cfg, on_chunk); },
      [&](const dllm::Result& r) { return "beam_width " + std::to_string(r.stats().beam_width_used); });
  if (!trace_file.empty()) write_trace(trace_file, trace);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "dllm-generate: error: " << e.message << " (see --help)\n";
    return 2;
  } catch (const dllm::Error& e) {
    const char* hint = e.code() == DLLM_ERROR_OUT_OF_MEMORY ? ": lower --max-beam-width (or --gen-length)" : "";
    std::cerr << "dllm-generate: error: " << e.what() << hint << "\n";
    return e.code() == DLLM_ERROR_INTERNAL ? 1 : 2;
  } catch (const std::exception& e) {
    std::cerr << "dllm-generate: internal error: " << e.what() << "\n";
    return 1;
  }
}
