"""llama.cpp's convert_hf_to_gguf.py with one change: the checkpoint's byte-level BPE was trained
here, so the converter does not know its pre-tokenizer's hash; it is declared GPT-2's (the same
byte-level regex) instead of refused.

    python convert_llama_cpp.py LLAMA_CPP_DIR CHECKPOINT [convert_hf_to_gguf.py's flags]
"""
import runpy
import sys

llama = sys.argv[1]
sys.path[:0] = [f"{llama}/gguf-py", llama]
from conversion import base  # noqa: E402

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = [f"{llama}/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
