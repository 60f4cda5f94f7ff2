"""Hugging Face tokenizers in the C++ runtime (docs/cpp.md, "Hugging Face tokenizers"): a byte-level
BPE tokenizer.json trained here beside random LLaDA- and Dream-layout checkpoints, exported; the C++
tokenizer (onnxruntime-extensions' C API, through build/cpp/dllm-tokenize) gives Python's ids on
every eval prompt and a fuzzed set, the same round trips, and dllm-generate Python's tokens."""
from __future__ import annotations

import json
import random
import subprocess

import pytest

from tests.conftest import write_checkpoint
from tests.fuzz_corpus import fuzz_texts

from .conftest import run_generate

pytest.importorskip("onnxruntime_extensions", reason="onnxruntime-extensions is in the dev extra")
EOS = "<|eos|>"
VOCAB = 600             # the BPE's; the model's vocabulary adds the mask token after it
LAYOUTS = ("llada", "dream")


def _train_bpe(folder):
    """A byte-level BPE tokenizer.json (EOS is id 1: the runtime wants positive special ids), trained on the fuzz set and eval-like text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|pad|>", EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(fuzz_texts(random.Random(1), 300) + ["upper: hello world", "count: from 100 by 5"] * 20,
                            trainer)
    tok.save(str(folder / "tokenizer.json"))
    return tok


@pytest.fixture(scope="module", params=LAYOUTS)
def hf_artifact(request, tmp_path_factory):
    """(artifact folder, Python HFTokenizer) of a layout's checkpoint with the trained tokenizer."""
    from dllm_deploy.export.exporter import export
    from dllm_deploy.models.tokenizer import HFTokenizer
    root = tmp_path_factory.mktemp(f"hf-{request.param}")
    src = root / "model"
    src.mkdir()
    bpe = _train_bpe(src)
    eos = bpe.token_to_id(EOS)
    write_checkpoint(src, request.param, config={"vocab_size": VOCAB + 8, "embedding_size": VOCAB + 8,
                                                 "mask_token_id": VOCAB + 7, "eos_token_id": eos,
                                                 "pad_token_id": VOCAB + 6})
    export(model=str(src), out=root / "artifact", block_length=8, max_beam_width=2)
    return root / "artifact", HFTokenizer(root / "artifact" / "tokenizer.json", eos)


def _cpp(build, artifact, lines) -> list[dict]:
    r = subprocess.run([str(build / "dllm-tokenize"), str(artifact)], input="".join(json.dumps(x) + "\n" for x in lines),
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_manifest_names_the_files_for_cpp(hf_artifact):
    folder, _ = hf_artifact
    m = json.loads((folder / "manifest.json").read_text())
    assert m["tokenizer"] == {"kind": "hf", "file": "tokenizer.json", "config": "tokenizer_config.json",
                              "cpp": "onnxruntime-extensions"}
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(m["files"])
    assert json.loads((folder / "tokenizer_config.json").read_text())["eos_token"] == EOS


def test_same_ids_on_eval_prompts_and_fuzz_set(cpp_build, hf_artifact):
    from dllm_deploy.evals.tasks import eval_split
    folder, tok = hf_artifact
    texts = [ex.prompt for split in ("core", "general") for ex in eval_split(split=split)]
    texts += fuzz_texts(random.Random(0), 400)
    # the extensions' own matcher loses these tails; the C++ runtime splits added tokens itself
    texts += ["<x", "< ", "a<\t", "<|eos", "<<|eos|>", "<|eo<|eos|>x", f"a{EOS}b<", f"{EOS}{EOS}"]
    got = _cpp(cpp_build, folder, texts)
    assert len(got) == len(texts)
    mismatched = [t for t, g in zip(texts, got) if g["ids"] != tok.encode(t)]
    assert mismatched == []
    # round trips: decode(encode(text)) as Python's (text up to the first EOS)
    assert [g["text"] for g in got] == [tok.decode(tok.encode(t)) for t in texts]


def test_decode_of_id_lists(cpp_build, hf_artifact):
    """Random ids, unknown and special ones included: Python's text, invalid UTF-8 replaced
    sequence by sequence as Python does (one U+FFFD each, the text going on after it)."""
    folder, tok = hf_artifact
    rng = random.Random(5)
    lists = [[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))] for _ in range(300)]
    lists += [[], [0], [5, 0, 7], [VOCAB + 7, 40], [40, 10**6]]
    got = _cpp(cpp_build, folder, lists)
    assert [g["text"] for g in got] == [tok.decode(ids) for ids in lists]
    assert sum("\ufffd" in tok.decode(ids) for ids in lists) > 30          # many lists hold invalid UTF-8


def test_generate_matches_python(cpp_build, hf_artifact):
    from dllm_deploy import Runtime
    from dllm_deploy.runtime.api import decode_config
    folder, _ = hf_artifact
    prompt = "upper: hello world"
    want = Runtime.load(artifact=str(folder)).decoder.generate([prompt], decode_config(gen_length=16))[0].to_dict()
    r = run_generate(cpp_build, "--artifact", str(folder), "--prompt", prompt, "--gen-length", "16", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["token_ids"], got["forwards"]) == (want["token_ids"], want["forwards"])
    if "\ufffd" not in want["text"]:
        assert got["text"] == want["text"]


def test_missing_library_is_one_clear_error(cpp_build, hf_artifact, tmp_path):
    folder, _ = hf_artifact
    r = run_generate(cpp_build, "--artifact", str(folder), "--prompt", "hi", "--gen-length", "8",
                     env={"DLLM_ORTX_LIBRARY": str(tmp_path / "none.so")})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "onnxruntime-extensions" in lines[0] and "DLLM_ORTX_LIBRARY" in lines[0]
