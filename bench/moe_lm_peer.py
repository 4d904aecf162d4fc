#!/usr/bin/env python3
"""The main job's model (examples/moe_lm) written plainly in PyTorch eager, as a PyTorch user would
write it: the time of one training step, or the held-out loss after a few minutes of training.

The model is gshard's TransformerLM with moe_lm's defaults (examples/moe_lm/model.hpp, options.hpp),
the same shapes and FLOPs per step:

  byte tokens, vocabulary 256; learned positions; pre-LN blocks (x += attn(ln(x)), x += ffn(ln(x)),
  LayerNorm with gain and bias, eps 1e-5); a final LayerNorm; logits through the embedding (tied)
  d_model 128, 4 blocks, 4 heads of 32, FFN 512 with ReLU and no biases anywhere but LayerNorm;
  blocks 1 and 3 (every odd block) replace the dense FFN by an MoE FFN of 8 experts (FFN 512 each)
  MoE: one group per sequence (G = batch, S = context); top-2 softmax gates of a bias-free router;
  the second expert kept only if 2 g2 / (g1 + g2) > u, u ~ U(0, 1) (GShard's random policy);
  capacity C = max(4, floor(S * 2 / E)) = 32 per group and expert, first choices queued before
  second choices, overflow dropped; gates normalized over both choices before the drops
  loss = cross-entropy + 1e-2 * aux, aux = E / G * sum_ge mean_s(gates) * fraction of first
  choices, averaged over the MoE blocks (gshard's z-loss has weight 0 and is not computed here)
  init N(0, 1/fan_in) for weights, N(0, 0.02^2) for the embedding and positions
  AdamW over every parameter (LayerNorm and embeddings included, as gshard): betas (0.9, 0.98),
  eps 1e-9, weight decay 0.01 (decoupled); lr 2e-3 after 50 linear warm-up steps, then a cosine to
  0.1 x peak at --schedule-steps; gradients clipped to global norm 1. With --train-seconds and
  --schedule-steps 0 (the default, as the main job's --steps 0) the cosine's length is fitted at
  the warm-up's end to the steps that fill the training time

What a PyTorch user picks that gshard spells differently (same FLOPs): one fused QKV nn.Linear
instead of three "M N D" einsums; F.scaled_dot_product_attention(is_causal=True) for the causal
attention (its CPU flash kernel may skip score blocks that are wholly masked, which gshard's
attention computes); routing vectorized with one_hot/cumsum over S instead of a per-group
loop; dispatch and combine index-based as gshard's (gather of each slot's token into "G E C M", a
transpose to "E G C M" where gshard's AllToAll is, the experts as two batched einsums, gather back
per choice and weight); torch.optim.AdamW's default (for-each off on CPU) implementation and
clip_grad_norm_. --compile wraps the model (forward and backward) in torch.compile; the optimizer
step stays eager.

A timed step is, as gshard's Trainer::step: the step's batch (--data corpus: the main job's
train batch of that step, the default; random: uniform random bytes), zero_grad, forward,
backward, clip and the AdamW step; the median over --steps after --warmup.
--train-seconds S trains on the main job's corpus (examples/moe_lm/corpus.hpp, rebuilt here byte
for byte from Debian's fortune files: the same balanced streams, train batches and held-out
windows) for S seconds of training time (evaluation and set-up not counted), --train-steps N
for N steps (the schedule's length, as the main job's --steps N), and reports the held-out loss
as the main job does: mean over the 8 languages of 16 fixed windows each.

Usage: moe_lm_peer.py --steps 20 --warmup 3 --threads 1 [--compile] [--csv PATH]
       moe_lm_peer.py --train-seconds 540 --threads 2 [--csv PATH]
       moe_lm_peer.py --train-steps 600 --threads 1 --seed 2
"""
import argparse
import contextlib
import csv
import math
import os
import re
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- the corpus (examples/moe_lm/corpus.hpp) -------------------------------------------------

MASK64 = (1 << 64) - 1
FORTUNES = "/usr/share/games/fortunes"
CHINESE = ["chinese", "song100", "tang300"]
# (code, directory under FORTUNES, only these files, excluded files), corpus.hpp's default_sources.
SOURCES = [("en", "", [], CHINESE), ("de", "de", [], []), ("es", "es", [], []),
           ("it", "it", [], []), ("ru", "ru", [], []), ("pl", "pl", [], []),
           ("cs", "cs", [], ["klasik-sk"]), ("zh", "", CHINESE, [])]
SEPARATOR = b"%\n"
CSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]?")  # ANSI colour sequences, dropped as markup


def mix(x):
    """splitmix64's finaliser, in 64-bit arithmetic."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def fnv1a(text):
    h = 0xCBF29CE484222325
    for c in text.encode():
        h = ((h ^ c) * 0x100000001B3) & MASK64
    return h


def parse_cookies(data):
    cookies, current = [], []
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        if line == b"%":
            text = b"".join(current)
            if text.strip():
                cookies.append(text)
            current = []
            continue
        current.append(CSI.sub(b"", line) + b"\n")
    text = b"".join(current)
    if text.strip():
        cookies.append(text)
    return cookies


def source_files(directory, only, exclude):
    if only:
        return sorted(os.path.join(directory, n) for n in only)
    names = [e.name for e in os.scandir(directory)
             if e.is_file(follow_symlinks=False) and not e.name.endswith((".dat", ".u8"))
             and e.name not in exclude]
    if not names:
        raise FileNotFoundError(f"no fortune files in {directory}")
    return sorted(os.path.join(directory, n) for n in names)


def load_corpus(root=FORTUNES, held_out_every=10):
    """{"codes", "train", "held_out"}: per language, the balanced byte streams of corpus.hpp."""
    splits = []
    for code, sub, only, exclude in SOURCES:
        train, held, index = [], [], 0
        for path in source_files(os.path.join(root, sub) if sub else root, only, exclude):
            with open(path, "rb") as f:
                for cookie in parse_cookies(f.read()):
                    held_out = mix(fnv1a(code) ^ index) % held_out_every == 0
                    (held if held_out else train).append(cookie)
                    index += 1
        splits.append((code, train, held))

    def size(cookies):  # of the stream the cookies make, separators included
        return sum(len(c) + len(SEPARATOR) for c in cookies)

    train_bytes = min(size(t) for _, t, _ in splits)
    held_bytes = min(size(h) for _, _, h in splits)

    def build(code, cookies, n):
        # Cookies in a hashed order, cut to exactly n bytes.
        order = sorted((mix((fnv1a(code) + 0x5151 + i) & MASK64), i) for i in range(len(cookies)))
        out, total = [], 0
        for _, i in order:
            if total >= n:
                break
            out += [cookies[i], SEPARATOR]
            total += len(cookies[i]) + len(SEPARATOR)
        return b"".join(out)[:n]

    return dict(codes=[c for c, _, _ in splits],
                train=[build(c, t, train_bytes) for c, t, _ in splits],
                held_out=[build(c + "/held-out", h, held_bytes) for c, _, h in splits])


def window(stream, seed, salt, split_tag, step, b, context):
    """Row b's context + 1 bytes: a window at a hash of (seed, split, step, b, salt)."""
    h = mix(seed ^ salt ^ split_tag)
    h = mix((h + step) & MASK64)
    h = mix((h + b) & MASK64)
    start = h % (len(stream) - context)
    return stream[start:start + context + 1]


def train_batch(corpus, seed, step, batch, context):
    """sample_batch(Split::train): row b from language (step * batch + b) mod languages."""
    n = len(corpus["codes"])
    rows = [window(corpus["train"][((step % n) * (batch % n) + b) % n], seed, 0, 0x7261696E, step,
                   b, context) for b in range(batch)]
    return as_tensors(rows)


def held_out_batch(corpus, lang, rows, context):
    """sample_language_batch(Split::held_out, seed 0x5eed, step 0): fixed evaluation windows."""
    salt = mix(0x6C616E67 + lang)
    return as_tensors([window(corpus["held_out"][lang], 0x5EED, salt, 0x68656C64, 0, b, context)
                       for b in range(rows)])


def as_tensors(rows):
    t = torch.tensor([list(r) for r in rows], dtype=torch.long)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


# --- the model (include/gshard/nn/transformer.hpp, moe.hpp) ----------------------------------

class Attention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        B, S, M = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, M // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(B, S, M))


class FeedForward(nn.Module):
    def __init__(self, d_model, hidden):
        super().__init__()
        self.wi = nn.Linear(d_model, hidden, bias=False)
        self.wo = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x):
        return self.wo(F.relu(self.wi(x))), None


class MoE(nn.Module):
    """GShard's top-2 MoE layer with expert capacity, one group per sequence."""

    def __init__(self, d_model, hidden, experts, capacity_factor=2.0, min_capacity=4):
        super().__init__()
        self.experts = experts
        self.capacity_factor = capacity_factor
        self.min_capacity = min_capacity
        self.wg = nn.Parameter(torch.empty(d_model, experts))
        self.wi = nn.Parameter(torch.empty(experts, d_model, hidden))
        self.wo = nn.Parameter(torch.empty(experts, hidden, d_model))
        self.u = None  # the routing uniforms "G S" of the next pass, when given (GshardDraws)

    def forward(self, x):
        G, S, M = x.shape
        E = self.experts
        C = max(self.min_capacity, int(S * self.capacity_factor / E))
        gates = torch.softmax(x @ self.wg, dim=-1)                        # [G,S,E]
        idx1 = gates.argmax(-1)                                           # ties: smaller expert
        idx2 = gates.masked_fill(F.one_hot(idx1, E).bool(), -1.0).argmax(-1)
        idx = torch.stack((idx1, idx2), -1)                               # [G,S,K]
        chosen = gates.gather(-1, idx)
        with torch.no_grad():  # routing decisions: integers, no gradient
            u = self.u if self.u is not None else torch.rand(G, S, device=x.device)
            routed2 = 2 * chosen[..., 1] / chosen.sum(-1) > u             # random second expert
            mask1 = F.one_hot(idx1, E)
            mask2 = F.one_hot(idx2, E) * routed2[..., None]
            # Positions in each expert's buffer: second choices queue after the kept first ones.
            pos1 = (mask1.cumsum(1) - mask1).gather(-1, idx1[..., None])
            base = mask1.sum(1, keepdim=True).clamp(max=C)
            pos2 = (mask2.cumsum(1) - mask2 + base).gather(-1, idx2[..., None])
            pos = torch.cat((pos1, pos2), -1)
            keep = (pos < C) & torch.stack((torch.ones_like(routed2), routed2), -1)
            slot = torch.where(keep, idx * C + pos, E * C)                # E * C: dropped
            # The token of every slot; empty slots read a zero row appended at S.
            token = torch.full((G, E * C + 1), S, dtype=torch.long, device=x.device)
            token.scatter_(1, slot.view(G, S * 2),
                           torch.arange(S, device=x.device).repeat_interleave(2).expand(G, -1))
            token = token[:, :E * C]
            first = mask1.to(x.dtype).mean(1)                             # [G,E]
        weight = chosen / chosen.sum(-1, keepdim=True) * keep             # [G,S,K]
        aux = (gates.mean(1) * first).sum() * (E / G)

        padded = F.pad(x, (0, 0, 0, 1))
        dispatched = padded.gather(1, token[..., None].expand(-1, -1, M))  # [G,E*C,M]
        at_experts = dispatched.view(G, E, C, M).transpose(0, 1)          # gshard's AllToAll
        hidden = F.relu(torch.einsum("egcm,emh->egch", at_experts, self.wi))
        y = torch.einsum("egch,ehm->egcm", hidden, self.wo).transpose(0, 1).reshape(G, E * C, M)
        y = F.pad(y, (0, 0, 0, 1))                                        # dropped read zeros
        taken = y.gather(1, slot.view(G, S * 2, 1).expand(-1, -1, M)).view(G, S, 2, M)
        return torch.einsum("gskm,gsk->gsm", taken, weight), aux


class Block(nn.Module):
    def __init__(self, d_model, heads, ffn, experts, moe):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = Attention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.ffn = MoE(d_model, ffn, experts) if moe else FeedForward(d_model, ffn)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        y, aux = self.ffn(self.ln2(x))
        return x + y, aux


class MoeLM(nn.Module):
    def __init__(self, vocab=256, d_model=128, layers=4, heads=4, ffn=512, experts=8, context=128,
                 aux_weight=1e-2):
        super().__init__()
        self.aux_weight = aux_weight
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.empty(context, d_model))
        # Block i is MoE when i is odd (GShard: every other block).
        self.blocks = nn.ModuleList(
            Block(d_model, heads, ffn, experts, moe=experts > 0 and i % 2 == 1)
            for i in range(layers))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.reset_parameters()

    def reset_parameters(self):
        # gshard's init: N(0, 1/fan_in) weights, N(0, 0.02^2) embedding and positions.
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=m.in_features ** -0.5)
            elif isinstance(m, MoE):
                for w in (m.wg, m.wi, m.wo):
                    nn.init.normal_(w, std=w.shape[-2] ** -0.5)

    def forward(self, tokens, targets):
        x = self.embed(tokens) + self.pos[:tokens.shape[1]]
        auxes = []
        for block in self.blocks:
            x, aux = block(x)
            if aux is not None:
                auxes.append(aux)
        logits = F.linear(self.ln_f(x), self.embed.weight)                # tied
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        aux = torch.stack(auxes).mean() if auxes else ce.new_zeros(())
        return ce + self.aux_weight * aux, ce, aux


# --- gshard's parameters and random numbers, for --init gshard and moe_lm_check_step.py ---

NAMES = ["embed", "pos", "ln1_g", "ln1_b", "wq", "wk", "wv", "wo", "ln2_g", "ln2_b", "ffn_wi",
         "ffn_wo", "moe_wg", "moe_wi", "moe_wo", "lnf_g", "lnf_b"]  # TransformerLM::param_names
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


# gshard's random numbers (tensor/random.hpp, nn/transformer.hpp), in wrapping uint64 arithmetic.
def _mix(z):  # splitmix64's finaliser on numpy uint64 (wrapping)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniforms(seed, n, stream=0, as_float=True):
    """random_unit's values for elements 0..n-1 under seed and stream (random_uniform's, as
    float, for stream 0)."""
    with np.errstate(over="ignore"):
        key = np.uint64(seed) ^ (np.uint64(stream) * np.uint64(0xD1B54A32D192ED03))
        base = _mix(key + GOLDEN)
        bits = _mix(base + np.arange(n, dtype=np.uint64) + GOLDEN)
    u = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    if not as_float:
        return u
    u = u.astype(np.float32)
    return np.where(u < 1, u, np.float32(0))  # uniform_value: rounding up to 1 gives the low end


def parameter_seed(seed, i):
    """nn::detail::parameter_seed."""
    with np.errstate(over="ignore"):
        return int(_mix(np.uint64(seed) + GOLDEN * np.uint64(i + 1)))


def routing_seed(step, block):
    """TransformerLM::moe_options: parameter_seed(moe.seed (0) ^ step, block)."""
    return parameter_seed(step, block)


class GshardDraws:
    """Within it, each MoE block's routing uniform (the second choice's "G S" of gshard's "G S K"
    draw) is gshard's for `step` (TransformerLM::loss's seed: the step; 0 when evaluating)."""

    def __init__(self, net, step, rows, context):
        self.blocks = [b.ffn for b in net.blocks if isinstance(b.ffn, MoE)]
        self.draws = []
        for block, b in enumerate(net.blocks):
            if isinstance(b.ffn, MoE):
                u = uniforms(routing_seed(step, block), rows * context * 2)
                self.draws.append(torch.from_numpy(u.reshape(rows, context, 2)[..., 1].copy()))

    def __enter__(self):
        for moe, u in zip(self.blocks, self.draws):
            moe.u = u
        return self

    def __exit__(self, *exc):
        for moe in self.blocks:
            moe.u = None


def peer_values(net, t):
    """gshard's tensors (stacked over layers, by parameter name) as the peer's parameters:
    {id(parameter): tensor of its shape}."""
    out = {id(net.embed.weight): t["embed"], id(net.pos): t["pos"],
           id(net.ln_f.weight): t["lnf_g"], id(net.ln_f.bias): t["lnf_b"]}
    dense = moe = 0
    for l, b in enumerate(net.blocks):
        m = t["wq"].shape[1]
        out[id(b.ln1.weight)], out[id(b.ln1.bias)] = t["ln1_g"][l], t["ln1_b"][l]
        out[id(b.ln2.weight)], out[id(b.ln2.bias)] = t["ln2_g"][l], t["ln2_b"][l]
        # "M N D" -> nn.Linear's [out = (q|k|v, N, D), in = M]; "N D M" -> [M, N D]
        out[id(b.attn.qkv.weight)] = torch.cat([t[n][l].reshape(m, -1).T
                                                for n in ("wq", "wk", "wv")])
        out[id(b.attn.out.weight)] = t["wo"][l].reshape(-1, m).T
        if isinstance(b.ffn, MoE):
            for n, p in (("moe_wg", b.ffn.wg), ("moe_wi", b.ffn.wi), ("moe_wo", b.ffn.wo)):
                out[id(p)] = t[n][moe]
            moe += 1
        else:
            out[id(b.ffn.wi.weight)] = t["ffn_wi"][dense].T
            out[id(b.ffn.wo.weight)] = t["ffn_wo"][dense].T
            dense += 1
    return out


def load_into(net, t):
    values = peer_values(net, t)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(values[id(p)])


def normals(seed, shape, sd):
    """random_normal's float values (Box-Muller on streams 0 and 1) of a tensor of `shape`."""
    n = math.prod(shape)
    u1 = 1.0 - uniforms(seed, n, stream=0, as_float=False)
    u2 = uniforms(seed, n, stream=1, as_float=False)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)
    return torch.from_numpy((float(np.float32(sd)) * z).astype(np.float32).reshape(shape))


def gshard_init(net, seed):
    """TransformerLM::init(seed)'s parameters in the peer: N(0, 1/fan_in) weights, N(0, 0.02^2)
    embedding and positions, each tensor from parameter_seed(seed, i), i in init order."""
    b = net.blocks
    layers, d_model, heads = len(b), net.embed.weight.shape[1], b[0].attn.heads
    dense = [x.ffn for x in b if not isinstance(x.ffn, MoE)]
    moe = [x.ffn for x in b if isinstance(x.ffn, MoE)]
    ffn = dense[0].wi.weight.shape[0] if dense else moe[0].wi.shape[2]
    experts, hidden = (moe[0].experts, moe[0].wi.shape[2]) if moe else (0, 0)
    d = d_model // heads

    def sd(fan_in):  # TransformerLM::init's 1 / sqrt(fan_in), in double
        return 1 / math.sqrt(max(fan_in, 1))

    shapes = [("embed", (net.embed.weight.shape[0], d_model), 0.02),
              ("pos", tuple(net.pos.shape), 0.02)]
    shapes += [(n, (layers, d_model, heads, d), sd(d_model)) for n in ("wq", "wk", "wv")]
    shapes += [("wo", (layers, heads, d, d_model), sd(heads * d)),
               ("ffn_wi", (len(dense), d_model, ffn), sd(d_model)),
               ("ffn_wo", (len(dense), ffn, d_model), sd(ffn)),
               ("moe_wg", (len(moe), d_model, experts), sd(d_model)),
               ("moe_wi", (len(moe), experts, d_model, hidden), sd(d_model)),
               ("moe_wo", (len(moe), experts, hidden, d_model), sd(hidden))]
    t = {name: normals(parameter_seed(seed, i), shape, sd)
         for i, (name, shape, sd) in enumerate(shapes)}
    t.update(ln1_g=torch.ones(layers, d_model), ln2_g=torch.ones(layers, d_model),
             ln1_b=torch.zeros(layers, d_model), ln2_b=torch.zeros(layers, d_model),
             lnf_g=torch.ones(d_model), lnf_b=torch.zeros(d_model))
    load_into(net, t)


def learning_rate(step, peak, warmup, total, final=0.1):
    """gshard::nn::cosine(peak, warmup, total, final) at update `step` (1 for the first)."""
    if step < warmup:
        return peak * step / warmup
    p = min(1.0, (step - warmup) / (total - warmup))
    return peak * (final + (1 - final) * 0.5 * (1 + math.cos(math.pi * p)))


class Trainer:
    def __init__(self, a):
        torch.manual_seed(a.seed)
        self.net = MoeLM(d_model=a.d_model, layers=a.layers, heads=a.heads, ffn=a.ffn,
                         experts=a.experts, context=a.context)
        if a.init == "gshard":
            gshard_init(self.net, a.seed)
        self.model = torch.compile(self.net) if a.compile else self.net
        self.params = list(self.net.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=a.lr, betas=(0.9, 0.98), eps=1e-9,
                                     weight_decay=0.01)
        self.a = a
        self.updates = 0

    def draws(self, step, rows):
        """gshard's routing draws for this pass (--draws gshard), else PyTorch's."""
        if self.a.draws == "gshard":
            return GshardDraws(self.net, step, rows, self.a.context)
        return contextlib.nullcontext()

    def step(self, x, y):
        for g in self.opt.param_groups:
            g["lr"] = learning_rate(self.updates + 1, self.a.lr, self.a.warmup_lr,
                                    max(self.a.schedule_steps, self.a.warmup_lr + 1))
        self.opt.zero_grad(set_to_none=True)
        with self.draws(self.updates, x.shape[0]):
            total, ce, aux = self.model(x, y)
        total.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.updates += 1
        return ce, aux, norm

    @torch.no_grad()
    def held_out(self, corpus, rows):
        # Eager, so the evaluation batch shape does not recompile the compiled model.
        losses = []
        for lang in range(len(corpus["codes"])):
            x, y = held_out_batch(corpus, lang, rows, self.a.context)
            with self.draws(0, rows):  # the main job evaluates with routing seed 0
                losses.append(self.net(x, y)[1].item())
        return sum(losses) / len(losses)


def blas():
    m = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return m.group(1) if m else "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps (median)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--data", choices=["corpus", "random"], default="corpus",
                    help="the corpus' train batches (as the main job) or uniform random bytes")
    ap.add_argument("--train-seconds", type=float, default=0,
                    help="train on the corpus for this many seconds, then report held-out loss")
    ap.add_argument("--train-steps", type=int, default=0,
                    help="train on the corpus for this many steps (the schedule's length when "
                         "--schedule-steps is 0), then report held-out loss")
    ap.add_argument("--csv", default="")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-lr", type=int, default=50, help="learning-rate warm-up steps")
    ap.add_argument("--schedule-steps", type=int, default=0,
                    help="the cosine's length (0: fitted to --train-seconds, else 1000)")
    ap.add_argument("--eval-rows", type=int, default=16, help="held-out windows per language")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init", choices=["torch", "gshard"], default="torch",
                    help="torch: torch.manual_seed(seed) draws; gshard: the main job's initial "
                         "parameters for --seed (its counter-based draws, rebuilt in numpy)")
    ap.add_argument("--draws", choices=["torch", "gshard"], default="torch",
                    help="the random second expert's uniforms: torch.rand, or the main job's for "
                         "each step (with --init gshard the run is the main job's, to rounding)")
    a = ap.parse_args()
    if a.compile and a.draws == "gshard":
        ap.error("--draws gshard feeds the MoE layers between calls; not under --compile")
    if a.schedule_steps == 0 and a.train_steps > 0:
        a.schedule_steps = a.train_steps
    if a.schedule_steps == 0 and not a.train_seconds > 0:
        a.schedule_steps = 1000
    if a.train_steps > 0 and not a.train_seconds > 0:
        a.train_seconds = math.inf

    torch.set_num_threads(a.threads)
    system = "torch_compile" if a.compile else "torch_eager"
    tokens = a.batch * a.context
    t = Trainer(a)
    count = sum(p.numel() for p in t.params)
    print(f"{system}: torch {torch.__version__}, BLAS {blas()}, {torch.get_num_threads()} "
          f"thread(s); {count} parameters; batch {a.batch} x context {a.context}", flush=True)
    corpus = load_corpus() if a.train_seconds > 0 or a.data == "corpus" else None

    def batch(step):
        if corpus:
            return train_batch(corpus, a.seed, step, a.batch, a.context)
        g = torch.Generator().manual_seed(a.seed * 1000003 + step)
        r = torch.randint(0, 256, (a.batch, a.context + 1), generator=g)
        return r[:, :-1].contiguous(), r[:, 1:].contiguous()

    row = dict(system=system, torch_version=torch.__version__, threads=a.threads,
               batch=a.batch, context=a.context, d_model=a.d_model, tokens_per_step=tokens,
               seconds_per_step="", tokens_per_s="", parameters=count, blas=blas(),
               mode="train" if a.train_seconds > 0 else "time", steps=0, held_out_loss="",
               note="")
    times = []
    try:
        if a.train_seconds > 0:
            before = t.held_out(corpus, a.eval_rows)
            print(f"held-out loss at step 0: {before:.4f}", flush=True)
            trained, last_print, step = 0.0, 0.0, 0
            fit_at, first_dt = max(10, a.warmup_lr), 0.0
            while trained < a.train_seconds and (a.train_steps == 0 or step < a.train_steps):
                t0 = time.perf_counter()
                ce, aux, _ = t.step(*batch(step))
                dt = time.perf_counter() - t0
                trained += dt
                first_dt = first_dt or dt
                if a.schedule_steps == 0 and step + 1 == fit_at:  # as the main job's --steps 0
                    step_s = (trained - first_dt) / (fit_at - 1)
                    a.schedule_steps = fit_at + int((a.train_seconds - trained) / step_s)
                    print(f"schedule: {a.schedule_steps} steps, fitted at {step_s:.3f} s/step",
                          flush=True)
                if step >= a.warmup:  # the first steps compile (--compile): not in the median
                    times.append(dt)
                step += 1
                if trained - last_print >= 10 or step == 1:
                    last_print = trained
                    print(f"step {step:5d}  loss {ce.item():.4f}  aux {aux.item():.4f}  "
                          f"{tokens * step / trained:8.0f} tokens/s", flush=True)
            row["held_out_loss"] = f"{t.held_out(corpus, a.eval_rows):.4f}"
            row["steps"] = step
            print(f"done: {step} steps in {trained:.0f} s of training; held-out loss {before:.4f}"
                  f" -> {row['held_out_loss']} nats/byte", flush=True)
        else:
            for step in range(a.warmup + a.steps):
                t0 = time.perf_counter()
                ce, aux, norm = t.step(*batch(step))
                dt = time.perf_counter() - t0
                if step >= a.warmup:
                    times.append(dt)
                print(f"step {step:4d}  loss {ce.item():.4f}  aux {aux.item():.4f}  "
                      f"grad norm {norm.item():.3f}  {dt:.3f} s", flush=True)
            row["steps"] = len(times)
    except Exception as e:  # noqa: BLE001: torch.compile fails in many ways on odd CPUs
        if not a.compile:
            raise
        first_line = (str(e).splitlines() or [""])[0][:200]
        row["note"] = f"torch.compile failed: {type(e).__name__}: {first_line}"
        print(f"{system}: {row['note']}; no timing", flush=True)
        times = []
    if times:
        s = statistics.median(times)
        row["seconds_per_step"] = f"{s:.6f}"
        row["tokens_per_s"] = f"{tokens / s:.1f}"
        print(f"{system}: {s:.4f} s/step (median of {len(times)}), {tokens / s:.0f} tokens/s",
              flush=True)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row.keys()))
            w.writeheader()
            w.writerow(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
