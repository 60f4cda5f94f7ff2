"""llama.cpp's convert_hf_to_gguf.py with two changes: the checkpoint's byte-level BPE was trained
here, so the converter does not know its pre-tokenizer's hash; it is declared GPT-2's (the same
byte-level regex) instead of refused. And Dream's converter tries a SentencePiece vocabulary
first, which needs the sentencepiece package just to find there is none (tokenizer.model): it
goes straight to the BPE path it falls back to.

    python convert_llama_cpp.py LLAMA_CPP_DIR CHECKPOINT [convert_hf_to_gguf.py's flags]
"""
import runpy
import sys

llama = sys.argv[1]
sys.path[:0] = [f"{llama}/gguf-py", llama]
from conversion import base, dream  # noqa: E402

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
dream.DreamModel.set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = [f"{llama}/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
