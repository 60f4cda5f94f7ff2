"""A random LLaDA- or Dream-layout checkpoint with a byte-level BPE tokenizer, for the peer
comparisons (lab/peers/): the same folder is exported by dllm-deploy and converted by each peer.

    python lab/peers/checkpoint.py OUT [--layout llada|dream] [--size 30m|300m] [--seed 0]

The tokenizer is trained here (``tokenizers``, byte-level BPE, 8192 ids) on the Python standard
library's sources: a real BPE with merges, so both engines tokenize with their own BPE code. Ids
8189-8191 are <|startoftext|>, <|endoftext|> (EOS) and <|mdm_mask|> (LLaDA's mask token name).
"""
from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lab.big_export import write_sharded  # noqa: E402

VOCAB = 8192
SPECIAL = ["<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>"]          # ids 8189, 8190, 8191
NAMES = {"llada": "LLaDA", "dream": "Dream"}                      # layout -> how the docs name it
SIZES = {  # hidden, layers, heads, KV heads, MLP width
    "30m": (512, 8, 8, 8, 1536),
    "300m": (1024, 20, 16, 16, 4096),
}


def config(layout: str, size: str) -> dict:
    """config.json in the layout's own keys: LLaDA's (model_type llada) or Dream's (Qwen2 keys, q/k/v
    bias, logits shifted one position; Dream-7B's GQA is kept out so both layouts have the same
    matrices but the biases)."""
    hidden, layers, heads, kv, mlp = SIZES[size]
    ids = {"vocab_size": VOCAB, "mask_token_id": VOCAB - 1, "eos_token_id": VOCAB - 2, "bos_token_id": VOCAB - 3}
    if layout == "llada":
        return {"model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": hidden, "n_layers": layers,
                "n_heads": heads, "n_kv_heads": kv, "mlp_hidden_size": mlp, "embedding_size": VOCAB, **ids,
                "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_sequence_length": 4096, "weight_tying": False}
    return {"model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": mlp, **ids,
            "pad_token_id": VOCAB - 2, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
            "tie_word_embeddings": False, "hidden_act": "silu"}


def corpus(limit_bytes: int = 8_000_000):
    """Python standard library sources, as text lines, up to ``limit_bytes``."""
    seen = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        seen += len(text)
        yield text
        if seen > limit_bytes:
            return


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIAL), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    if tok.get_vocab_size() != VOCAB - len(SPECIAL):
        raise SystemExit(f"the BPE trained {tok.get_vocab_size()} ids, not {VOCAB - len(SPECIAL)}")
    tok.add_special_tokens(SPECIAL)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0], "eos_token": SPECIAL[1],
        "mask_token": SPECIAL[2], "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        # the prompt as is: llama-diffusion-cli always applies a chat template (ChatML when the
        # model has none), so the checkpoint ships one that adds nothing
        "chat_template": "{{ messages[-1]['content'] }}"}, indent=2) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layout", choices=["llada", "dream"], default="llada")
    ap.add_argument("--size", choices=sorted(SIZES), default="30m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=0.1,
                    help="standard deviation of the random matrices (larger: more peaked predictions, decisions "
                         "with margins that survive two engines' rounding)")
    a = ap.parse_args()
    total = write_sharded(a.out, config(a.layout, a.size), seed=a.seed, scale=a.scale)
    write_tokenizer(a.out)
    print(f"{a.out}: random {NAMES[a.layout]}-layout checkpoint, {total / 4 / 1e6:.1f}M parameters, byte-level BPE of {VOCAB} ids")
    return 0


if __name__ == "__main__":
    sys.exit(main())
