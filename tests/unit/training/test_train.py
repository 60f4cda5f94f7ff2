"""The training objective's pure parts: rows, the vectorised block-diffusion mask, the warm-up batch."""
import json
import math
import random

import pytest
import torch

from dllm_deploy.evals import tasks
from dllm_deploy.training import train
from dllm_deploy.models.tokenizer import ByteTokenizer

P, C, N, D = train.KIND_PROMPT, train.KIND_CLEAN, train.KIND_NOISY, train.KIND_PAD


def test_training_mask_hand_drawn():
    # prompt of 2 | clean block 0 (2 tokens) | noisy blocks 0 and 1 (2 tokens each) | 1 pad
    kind = torch.tensor([[P, P, C, C, N, N, N, N, D]])
    blk = torch.tensor([[-1, -1, 0, 0, 0, 0, 1, 1, -2]])
    want = [
        # keys: p p c c n0 n0 n1 n1 pad
        [1, 1, 0, 0, 0, 0, 0, 0, 0],  # prompt: the prompt
        [1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],  # clean block 0: prompt + clean blocks <= 0
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 0, 0, 0],  # noisy block 0: prompt + itself (no clean block before it)
        [1, 1, 0, 0, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 1, 1, 0],  # noisy block 1: prompt + clean block 0 + itself
        [1, 1, 1, 1, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1],  # pad: itself only
    ]
    assert train.training_mask(kind, blk)[0, 0].int().tolist() == want


def test_noisy_copies_do_not_see_each_other():
    kind = torch.tensor([[P, N, N]])
    blk = torch.tensor([[-1, 0, 0]])
    rep = torch.tensor([[0, 0, 1]])
    m = train.training_mask(kind, blk, rep)[0, 0].int().tolist()
    assert m == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]


def test_rows_and_warmup_batch():
    tok, rng = ByteTokenizer(), random.Random(0)
    ex = tasks.Example("upper", "upper: ab\n", "AB" * 20)                 # 40 bytes + EOS -> 2 blocks
    ids, pos, kind, blk, rep, tgt, lf, seq, n_prompt = train.build_row(ex, tok, rng, copies=2)
    p = len(tok.encode(ex.prompt))
    assert n_prompt == p and kind.count(P) == p and kind.count(C) == 32 and kind.count(N) == 128
    assert pos[p:p + 32] == list(range(p, p + 32))                       # clean block 0
    assert pos[p + 32:p + 96] == pos[p + 96:] == list(range(p, p + 64))   # each noisy copy
    assert all(ids[i] == tok.MASK for i in range(len(ids)) if lf[i])       # loss only where masked
    assert seq == tok.encode(ex.prompt) + tok.encode(ex.answer) + [tok.EOS]
    a_ids, a_pos, a_mask, a_tgt, a_lf = train.make_ar_batch([train.build_row(ex, tok, rng)], tok)
    assert a_ids[0].tolist() == seq and a_mask[0, 0].tril().equal(a_mask[0, 0])
    # next-token targets on the answer and EOS only: position i predicts token i+1
    assert a_lf[0].nonzero().flatten().tolist() == list(range(p - 1, len(seq) - 1))
    assert a_tgt[0, p - 1].item() == tok.encode("A")[0] and a_tgt[0, len(seq) - 2].item() == tok.EOS


def test_time_limit_saves_and_stops(tmp_path):
    out = tmp_path / "m"
    train.main(["--out", str(out), "--steps", "50", "--batch", "2", "--pool", "1", "--hidden", "32", "--layers", "1",
                "--heads", "2", "--kv-heads", "1", "--ffn", "64", "--time-limit", "0.001", "--ar-steps", "1"])
    meta = json.loads((out / "training.json").read_text())
    assert meta["steps"] == 1 and meta["stopped_by_time_limit"] is True and meta["target_steps"] == 50
    assert (out / "model.safetensors").stat().st_size > 0


def test_anneal_by_time_ends_the_schedule_at_the_time_limit(tmp_path, monkeypatch):
    """--anneal-by-time: the cosine schedule runs over --time-limit when that comes before
    --steps, so a run stopped by its clock ends near the floor lr (a tenth), not mid-schedule."""
    clock = iter(range(0, 10 ** 6, 10))           # every time.time() call: 10 s later
    monkeypatch.setattr(train.time, "time", lambda: float(next(clock)))
    small = ["--batch", "2", "--pool", "1", "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
             "--ffn", "64", "--threads", "1", "--steps", "100000", "--warmup", "1", "--lr", "1e-3", "--time-limit", "600"]
    last = {}
    for flag in ([], ["--anneal-by-time"]):
        out = tmp_path / ("a" if flag else "b")
        train.main(["--out", str(out), *small, *flag])
        meta = json.loads((out / "training.json").read_text())
        assert meta["stopped_by_time_limit"] is True and meta["anneal_by_time"] is bool(flag)
        last[bool(flag)] = meta["lr_last"]
    assert last[False] > 0.99e-3                  # 100000 steps: the schedule has barely started
    assert last[True] < 0.15e-3                   # the time limit: near the floor of 1e-4


def test_bf16_autocast_trains(tmp_path):
    """--autocast bf16: the forward under bfloat16 autocast, the loss in fp32; weights stay fp32."""
    out = tmp_path / "m"
    train.main(["--out", str(out), "--steps", "30", "--batch", "2", "--pool", "1", "--hidden", "32", "--layers", "1",
                "--heads", "2", "--kv-heads", "1", "--ffn", "64", "--ar-steps", "10", "--autocast", "bf16"])
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in log) and log[-1]["loss_ema"] < log[0]["loss_ema"]
    assert json.loads((out / "training.json").read_text())["autocast"] == "bf16"
    from safetensors.torch import load_file
    assert {t.dtype for t in load_file(str(out / "model.safetensors")).values()} == {torch.float32}


def test_cpu_bf16_native_reads_the_flags():
    assert train.cpu_bf16_native("processor: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n") is True
    assert train.cpu_bf16_native("flags : fpu avx512f avx512_bf16\n") is True
    assert train.cpu_bf16_native("flags : fpu avx2 avx512f avx512_vnni\n") is False   # Ice Lake: emulated
    assert train.cpu_bf16_native("processor : 0\n") is None


def test_bf16_autocast_warns_where_the_cpu_emulates_it(tmp_path, monkeypatch, capsys):
    args = ["--out", str(tmp_path / "m"), "--steps", "4", "--batch", "2", "--pool", "1", "--hidden", "32",
            "--layers", "1", "--heads", "2", "--kv-heads", "1", "--ffn", "64", "--time-steps", "2", "--autocast", "bf16"]
    monkeypatch.setattr(train, "cpu_bf16_native", lambda: False)
    train.main(args)
    assert "without AMX or AVX512-BF16" in capsys.readouterr().err
    monkeypatch.setattr(train, "cpu_bf16_native", lambda: True)
    train.main(args)
    assert "warning" not in capsys.readouterr().err


def test_warmup_ends_once_its_loss_average_is_low(tmp_path):
    """--ar-until-loss: the warm-up stops at the first step (from AR_MIN_STEPS on) whose loss
    average is at most the bound (plus --ar-margin steps), and training.json records where;
    --ar-steps stays the cap."""
    out = tmp_path / "m"
    small = ["--batch", "2", "--pool", "1", "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
             "--ffn", "64", "--save-every", "1000"]
    n = train.AR_MIN_STEPS + 30
    train.main(["--out", str(out), "--steps", str(n), "--ar-steps", str(n), "--ar-until-loss", "50", *small])
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    objective = {r["step"]: r["objective"] for r in log}
    assert objective[train.AR_MIN_STEPS] == "ar" and objective[train.AR_MIN_STEPS + 25] == "mdm"
    assert json.loads((out / "training.json").read_text())["ar_steps_used"] == train.AR_MIN_STEPS
    train.main(["--out", str(out), "--steps", str(n), "--ar-steps", str(n), "--ar-until-loss", "50", "--ar-margin", "10",
                *small])
    assert json.loads((out / "training.json").read_text())["ar_steps_used"] == train.AR_MIN_STEPS + 10
    train.main(["--out", str(out), "--steps", str(n), "--ar-steps", str(n), "--ar-until-loss", "0.001", *small])
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert {r["objective"] for r in log} == {"ar"}       # a bound never reached: the whole cap
    assert json.loads((out / "training.json").read_text())["ar_steps_used"] == n


def test_dist_train_draws_broad_inputs_but_never_the_generalization_split(monkeypatch):
    """--dist train: about half the inputs are broad (words outside the 149-word list), and no
    drawn word is one the generalization split holds out; --dist core stays in the list."""
    words = {}
    for dist in ("core", "train"):
        monkeypatch.setattr(train, "DIST", dist)
        monkeypatch.setattr(train, "MIX", {"upper": 1.0})
        rng = random.Random(0)
        words[dist] = [w for _ in range(200)
                       for w in train.sample_example(rng, set()).prompt[len("upper: "):].split()]
    assert set(words["core"]) <= set(tasks.WORDS)
    broad = [w for w in words["train"] if w not in tasks.WORDS]
    assert len(broad) > 0.2 * len(words["train"])
    assert not [w for w in words["train"] if tasks.held_out(w)]


def test_ar_mix_is_the_warmup_mix_only(tmp_path, monkeypatch):
    """--ar-mix: warm-up batches draw from its weights, diffusion batches from --mix; a bad
    item is a one-line error."""
    drawn = []
    real = train.sample_example
    monkeypatch.setattr(train, "sample_example", lambda rng, held, mix=None: drawn.append(mix) or real(rng, held, mix))
    only = {f: float(f == "upper") for f in train.MIX}
    monkeypatch.setattr(train, "MIX", dict(train.MIX))
    train.main(["--out", str(tmp_path / "m"), "--steps", "4", "--ar-steps", "2", "--batch", "2", "--pool", "1",
                "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--ffn", "64",
                "--ar-mix", ",".join(f"{f}={w:g}" for f, w in only.items())])
    assert drawn[:4] == [only] * 4 and all(m != only for m in drawn[4:]) and len(drawn) == 8
    with pytest.raises(SystemExit, match="error: --ar-mix: 'upper' is not family=weight"):
        train.main(["--out", str(tmp_path / "e"), "--ar-mix", "upper"])
