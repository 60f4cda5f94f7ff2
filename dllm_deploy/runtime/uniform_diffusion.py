"""Uniform-noise block diffusion (DiffusionGemma): the decode rule and its loop.

The canvas starts as random token ids. Each denoising step runs the decoder over it (conditioned
on the previous step's tempered logits) and then, with z = logits / T at T = t_min + (t_max - t_min)
* s / N for the steps s = N .. 1 left:
- every position draws a token from softmax(z) (``sampled``);
- positions are sorted by the entropy of softmax(z); the lowest-entropy ones are **accepted**
  while the entropies summed before each stay within ``entropy_bound`` (the lowest is always
  accepted); accepted positions take the sampled token, every other position a new random one
  (a position accepted at an earlier step is re-randomised unless accepted again);
- a row stops when its argmax canvas equals the one of the previous ``stability_threshold``
  steps and the mean entropy is below ``confidence_threshold``; its canvas is then the argmax.
After N steps or the stop, the canvas (its argmax) joins the sequence: the encoder writes it into
the KV cache and the next canvas starts. A row ends with the canvas holding an EOS; every token
after the EOS, and every canvas after, is the pad token. Options and defaults are transformers
5.23's (``DiffusionGemmaGenerationConfig``); the temperature is computed in fp32 as there.

All randomness is counter-based (runtime/noise.py), a pure function of (seed, request, absolute
position, step, use), so a row's tokens never depend on the batch around it: ``use`` INIT (the
canvas's first ids, step 0), SAMPLE (the uniform of a position's draw at step s) and RENOISE (the
ids that replace the positions not accepted at step s).

The backend is anything with ``empty(batch)``, ``encode(ids, positions, keep, past)`` and
``denoise(canvas, positions, keep, past, state, temperature, u, frozen)`` (models/diffusion_gemma_decode.py's
TorchDenoiser; the exported graphs behind the same calls).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import noise

INIT, SAMPLE, RENOISE = 1, 2, 3


@dataclass(frozen=True)
class UniformDiffusionOptions:
    max_new_tokens: int = 256
    max_denoising_steps: int = 48
    entropy_bound: float = 0.1
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005
    seed: int = 0


@dataclass
class UniformDiffusionResult:
    sequences: np.ndarray            # (B, P + canvases * L): the left-padded prompts, then the canvases
    new_tokens: np.ndarray           # (B, canvases * L)
    forwards: np.ndarray             # (B,) decoder forwards the row took part in (transformers' count)
    encoder_forwards: int            # encoder calls (one per canvas, the prompt's included)
    valid: np.ndarray                # (B,) new tokens that are not the pad token

    @property
    def tokens_per_forward(self) -> np.ndarray:
        """Non-pad new tokens per decoder forward, per row (transformers' ``tokens_per_forward``)."""
        return self.valid / np.maximum(self.forwards, 1)


def temperature(step: int, steps: int, t_min: float, t_max: float) -> np.float32:
    """T at step ``step`` of ``steps`` (counting down), in fp32 arithmetic as transformers does."""
    frac = np.float32(step) / np.float32(steps)
    return np.float32(np.float32(t_min) + np.float32(np.float32(t_max - t_min) * frac))


def accept(entropy: np.ndarray, bound: float) -> np.ndarray:
    """(B,T) bool: per row, the lowest-entropy positions whose entropies summed before them are
    within ``bound`` (stable order among equal entropies)."""
    order = np.argsort(entropy, axis=-1, kind="stable")
    ranked = np.take_along_axis(entropy, order, axis=-1)
    chosen = np.cumsum(ranked, axis=-1, dtype=ranked.dtype) - ranked <= np.asarray(bound, dtype=ranked.dtype)
    out = np.zeros_like(chosen)
    np.put_along_axis(out, order, chosen, axis=-1)
    return out


def finalize_canvas(new: np.ndarray, finished: np.ndarray, ending: np.ndarray, eos_ids, pad: int) -> np.ndarray:
    """The canvas ``new`` (B,L) as it joins the sequence: all pad in rows that ``finished`` before
    it; where some row ends with it (``ending``), every token after a row's first EOS is pad."""
    out = new.copy()
    out[finished] = pad
    if ending.any():
        is_eos = np.isin(out, eos_ids)
        seen = np.cumsum(is_eos, axis=-1)
        out[(seen > 0) & ~((seen == 1) & is_eos)] = pad
    return out


class UniformRun:
    """One decode of ``prompts`` (token ids) in one batch, left-padded with ``pad_id``: every row's
    positions count from the first column (as transformers' generate() gives a padded batch).
    ``eos_ids``: the ids that end a row (Gemma has two: <eos> and <end_of_turn>); ``seeds``: each
    row's noise key (default ``opts.seed`` for every row); ``request_ids``: each row's request
    word (default the row index). Iterating it runs the forwards: after every decoder step it
    yields None, after every canvas (result rows (B,), the canvas as it joins their sequences
    (B,L)); ``end(rows)`` between two yields ends result rows now (their canvas so far and every
    later one become pad). Finished rows leave the batch at canvas boundaries.
    ``own_positions``: each row's positions count from its own first token, so a row decodes in a
    batch what it decodes alone (a server's rows); False: from the batch's first column, as
    transformers' generate() numbers a left-padded batch. ``join`` (continuous batching; own
    positions only): called at every canvas boundary, [(prompt ids, seed, request word)] of rows
    that join the batch there, numbered after the rows so far."""

    def __init__(self, backend, prompts: list[list[int]], opts: UniformDiffusionOptions, *, vocab_size: int,
                 canvas_length: int, eos_ids, pad_id: int, request_ids=None, seeds=None, own_positions: bool = False,
                 join=None):
        if join is not None and not own_positions:
            raise ValueError("rows join a batch whose rows count positions from their own first token only")
        self.backend, self.opts, self.vocab, self.length, self.pad = backend, opts, vocab_size, canvas_length, pad_id
        self.eos_ids = np.asarray(list(eos_ids) if np.ndim(eos_ids) else [eos_ids], dtype=np.int64)
        self.join = join
        b = len(prompts)
        self.ids, self.keep, offset = _left_padded(prompts, pad_id)
        self.offset = (offset if own_positions else np.zeros(b, dtype=np.int64))[:, None]   # per batch row
        self.req = np.arange(b, dtype=np.int64) if request_ids is None else np.asarray(request_ids, dtype=np.int64)
        self.seed = np.full(b, opts.seed, dtype=np.uint64) if seeds is None else np.asarray(seeds, dtype=np.uint64)
        self.rows = np.arange(b)                             # batch row -> result row
        self.finished = np.zeros(b, dtype=bool)              # per result row
        self.forwards = np.zeros(b, dtype=np.int64)          # decoder forwards per result row
        self.encoder_rows = np.zeros(b, dtype=np.int64)      # encoder forwards per result row
        self.out: list[list[np.ndarray]] = [[] for _ in range(b)]    # per result row: its canvases

    def end(self, rows) -> None:
        self.finished[np.asarray(list(rows), dtype=np.int64)] = True

    def __iter__(self):
        opts, big_l = self.opts, self.length
        steps = opts.max_denoising_steps
        per_row = math.ceil(opts.max_new_tokens / big_l)     # canvases a row may take (the length limit)
        past = self.backend.empty(len(self.rows))
        keep, pending, start = self.keep, self.ids, 0
        made = np.zeros(len(self.rows), dtype=np.int64)
        while len(self.rows):
            cur = keep.shape[1]
            past = self.backend.encode(pending, np.maximum(np.arange(start, cur)[None] - self.offset, 0), keep, past)
            self.encoder_rows[self.rows] += 1
            if self.join is not None and (new_rows := self.join()):
                keep, past, made = self._add(new_rows, keep, past, made)
                cur = keep.shape[1]
            b = len(self.rows)
            seed, req = self.seed[:, None], self.req[:, None]
            pos = np.arange(cur, cur + big_l)[None] - self.offset
            canvas = noise.token_ids(seed, req, pos, 0, INIT, self.vocab)
            argmax, state = canvas, None
            done = np.zeros(b, dtype=bool)
            history = np.full((max(opts.stability_threshold, 0), b, big_l), -1, dtype=np.int64)
            for s in range(steps, 0, -1):
                fin = self.finished[self.rows]
                self.forwards[self.rows] += ~(done | fin)
                t = np.full(b, temperature(s, steps, opts.t_min, opts.t_max), dtype=np.float32)
                u = noise.uniforms(seed, req, pos, s, SAMPLE)
                am, sampled, entropy, state = self._denoise(canvas, pos, keep, past, state, t, u, done, fin)
                chosen = accept(entropy, opts.entropy_bound)
                fresh = noise.token_ids(seed, req, pos, s, RENOISE, self.vocab)
                nxt = np.where(chosen, sampled, fresh)
                am = np.where(done[:, None], argmax, am)
                nxt = np.where(done[:, None], canvas, nxt)
                if opts.stability_threshold:
                    stable = (history == am[None]).all(axis=-1).all(axis=0)
                    history = np.roll(history, -1, axis=0)
                    history[-1] = am
                else:
                    stable = np.ones(b, dtype=bool)
                done |= stable & (entropy.mean(axis=-1) < np.float32(opts.confidence_threshold))
                argmax, canvas = am, nxt
                yield None
                if (done | self.finished[self.rows]).all():     # a finished row's canvas becomes pad whatever it holds
                    break
            made += 1
            ending = (made >= per_row) | np.isin(argmax, self.eos_ids).any(axis=-1)
            new = finalize_canvas(argmax, self.finished[self.rows], ending, self.eos_ids, self.pad)
            for j, r in enumerate(self.rows):
                self.out[r].append(new[j])
            self.finished[self.rows] |= ending
            yield self.rows.copy(), new
            pending, start = new, cur
            keep = np.concatenate([keep, np.ones((b, big_l), dtype=bool)], axis=1)
            alive = np.flatnonzero(~self.finished[self.rows])        # end() during the yield counts
            if len(alive) < b:                                       # finished rows leave the batch
                keep, pending, made = keep[alive], pending[alive], made[alive]
                past = [tuple(x[alive] for x in kv) for kv in past]
                self.rows, self.seed, self.req, self.offset = (self.rows[alive], self.seed[alive], self.req[alive],
                                                                self.offset[alive])

    def _add(self, new_rows: list, keep, past, made):
        """Rows that join at a canvas boundary: their prompts' encoder forward (their own batch),
        then their cache, keep mask and positions stacked under the batch's, the narrower side
        padded on the left with columns nobody attends (each row's positions stay its own)."""
        prompts = [list(p) for p, _, _ in new_rows]
        n = len(prompts)
        ids, keep_n, offset_n = _left_padded(prompts, self.pad)
        past_n = self.backend.encode(ids, np.maximum(np.arange(ids.shape[1])[None] - offset_n[:, None], 0), keep_n,
                                     self.backend.empty(n))
        width = max(keep.shape[1], keep_n.shape[1])
        keep_o, keep_n = _pad_left(keep, width - keep.shape[1]), _pad_left(keep_n, width - keep_n.shape[1])
        self.offset = self.offset + (width - keep.shape[1])
        offset_n = offset_n + (width - ids.shape[1])
        merged = []
        for (k, v), (kn, vn) in zip(past, past_n):
            w = max(k.shape[2], kn.shape[2])
            merged.append(tuple(np.concatenate([_pad_kv(a, w), _pad_kv(c, w)]) for a, c in ((k, kn), (v, vn))))
        first = len(self.finished)
        self.rows = np.concatenate([self.rows, np.arange(first, first + n)])
        self.finished = np.concatenate([self.finished, np.zeros(n, dtype=bool)])
        self.forwards = np.concatenate([self.forwards, np.zeros(n, dtype=np.int64)])
        self.encoder_rows = np.concatenate([self.encoder_rows, np.ones(n, dtype=np.int64)])
        self.out += [[] for _ in range(n)]
        self.seed = np.concatenate([self.seed, np.array([s for _, s, _ in new_rows], dtype=np.uint64)])
        self.req = np.concatenate([self.req, np.array([r for _, _, r in new_rows], dtype=np.int64)])
        self.offset = np.concatenate([self.offset, offset_n[:, None]])
        return np.concatenate([keep_o, keep_n]), merged, np.concatenate([made, np.zeros(n, dtype=np.int64)])

    def _denoise(self, canvas, pos, keep, past, state, t, u, done, fin):
        """One step over the live rows only (neither done nor finished): a row that stopped costs
        nothing more while the others go on. Rows left out keep their state and argmax-to-be (the
        caller ignores the rest of what they would have returned)."""
        live = ~(done | fin)
        if live.all() or not live.any():
            return self.backend.denoise(canvas, pos, keep, past, state, t, u, done)
        idx = np.flatnonzero(live)
        sub_past = [tuple(x[idx] for x in kv) for kv in past]
        am_s, sampled_s, entropy_s, state_s = self.backend.denoise(
            canvas[idx], pos[idx], keep[idx], sub_past, None if state is None else state[idx], t[idx], u[idx],
            np.zeros(len(idx), dtype=bool))
        am, sampled = canvas.copy(), canvas.copy()
        entropy = np.zeros(canvas.shape, dtype=np.float32)
        am[idx], sampled[idx], entropy[idx] = am_s, sampled_s, entropy_s
        if state is None:             # the first step: the others' state is never read (they stopped)
            shape = (len(canvas), *state_s.shape[1:])
            state = state_s.new_zeros(shape) if hasattr(state_s, "new_zeros") else np.zeros(shape, state_s.dtype)
        else:
            state = state.clone() if hasattr(state, "clone") else state.copy()
        state[idx] = state_s
        return am, sampled, entropy, state

    def result(self) -> UniformDiffusionResult:
        """The whole batch's result (a row that finished early: pad canvases after its last)."""
        n = max(len(o) for o in self.out)
        pad = np.full(self.length, self.pad, dtype=np.int64)
        new_tokens = np.stack([np.concatenate(o + [pad] * (n - len(o))) for o in self.out])
        return UniformDiffusionResult(np.concatenate([self.ids, new_tokens[:len(self.ids)]], axis=1), new_tokens,
                                      self.forwards, n, (new_tokens != self.pad).sum(axis=-1))


def _left_padded(prompts: list[list[int]], pad_id: int):
    """(ids (B,P), keep (B,P), offset (B,)): the prompts left-padded to the longest, and each row's padding."""
    p0 = max(len(x) for x in prompts)
    ids = np.full((len(prompts), p0), pad_id, dtype=np.int64)
    keep = np.zeros((len(prompts), p0), dtype=bool)
    for i, x in enumerate(prompts):
        ids[i, p0 - len(x):], keep[i, p0 - len(x):] = x, True
    return ids, keep, p0 - np.array([len(x) for x in prompts], dtype=np.int64)


def _pad_left(keep: np.ndarray, n: int) -> np.ndarray:
    return np.concatenate([np.zeros((len(keep), n), dtype=bool), keep], axis=1) if n else keep


def _pad_kv(x: np.ndarray, width: int) -> np.ndarray:
    """(B,H,P,D) KV padded with zeros on the left to ``width`` positions (columns nobody attends)."""
    n = width - x.shape[2]
    return np.concatenate([np.zeros((*x.shape[:2], n, x.shape[3]), x.dtype), x], axis=2) if n else x


def generate(backend, prompts: list[list[int]], opts: UniformDiffusionOptions, *, vocab_size: int,
             canvas_length: int, eos_ids, pad_id: int, request_ids=None) -> UniformDiffusionResult:
    """The whole decode of ``prompts`` (UniformRun's arguments)."""
    run = UniformRun(backend, prompts, opts, vocab_size=vocab_size, canvas_length=canvas_length, eos_ids=eos_ids,
                     pad_id=pad_id, request_ids=request_ids)
    for _ in run:
        pass
    return run.result()


class TransformersDraws:
    """This rule's noise in the order transformers' DiffusionGemma generate() draws from torch's
    stream, so that generate() with torch.randint / torch.multinomial replaced by these decodes
    the same tokens (a test and peer-comparison aid: models/diffusion_gemma_decode.py's inverse_cdf turns
    ``uniforms`` into the multinomial's ids). generate() draws a canvas's first ids (randint), then
    per step the sample (multinomial) and the renoise (randint): the call order tells them apart.
    One instance serves one generate() call of a batch padded to ``prompt_len``; request ids are
    the batch rows."""

    def __init__(self, prompt_len: int, canvas_length: int, steps: int, seed: int = 0):
        self.p, self.length, self.steps, self.seed = prompt_len, canvas_length, steps, seed
        self.canvas, self.step, self.next_step = -1, None, steps

    def _where(self, rows: int):
        start = self.p + self.canvas * self.length
        return np.tile(np.arange(start, start + self.length), (rows, 1)), np.arange(rows)[:, None]

    def randint(self, high: int, rows: int) -> np.ndarray:
        """(rows, L) ids: a new canvas's first ids, or the renoise of the step just sampled."""
        if self.step is None:
            self.canvas += 1
            self.next_step = self.steps
            pos, req = self._where(rows)
            return noise.token_ids(self.seed, req, pos, 0, INIT, high)
        pos, req = self._where(rows)
        step, self.step = self.step, None
        return noise.token_ids(self.seed, req, pos, step, RENOISE, high)

    def uniforms(self, flat_rows: int) -> np.ndarray:
        """(B * L,) uniforms of the next step's sample, row-major over (batch row, position)."""
        self.step, self.next_step = self.next_step, self.next_step - 1
        pos, req = self._where(flat_rows // self.length)
        return noise.uniforms(self.seed, req, pos, self.step, SAMPLE).reshape(-1)
