#!/usr/bin/env python3
"""The MoE layer of bench_moe (bench/moe.cpp) in the systems users would pick instead, on the same
shapes, forward + backward, median of --reps steps after --warmup:

  torch_dense   PyTorch, GShard's dense formulation: one-hot dispatch and combine tensors "G S E C"
                and einsums (the paper's Algorithm 2), --threads intra-op threads;
  torch_index   PyTorch, index-based dispatch as Tutel does: index_add into the experts' buffer
                "E (G C) M", bmm over experts, gather back, --threads threads;
  jax_gspmd     JAX on CPU, the dense formulation under jit with sharding annotations over
                --devices host devices (XLA_FLAGS=--xla_force_host_platform_device_count), groups
                and experts split over them: GSPMD, the system GShard became.

Gating as bench_moe: top-2 softmax gates, every second choice dispatched, capacity
C = floor(S cf / E) per group and expert with first choices placed before second choices, gates
of kept choices normalized by the sum of both, the auxiliary loss mean(m_e c_e) E^2. Loss
sum(y * r) + aux; gradients with respect to x, router and experts.

Writes a CSV with the same columns as bench_moe's where they apply.
Usage: moe_peers.py --system torch_dense|torch_index|jax_gspmd --threads N --devices N --csv PATH
"""
import argparse
import csv
import os
import statistics
import sys
import time


def cases(ranks):
    out = [dict(case=f"gshard_{t}", tokens=t, group=1024, M=512, H=2048, E=8, cf=2.0)
           for t in (4096, 8192, 16384)]
    out.append(dict(case="tutel", tokens=2048 * ranks, group=512, M=2048, H=2048, E=2 * ranks,
                    cf=2.0))
    return out


def capacity(c):
    return int(c["group"] * c["cf"] / c["E"])


# --- PyTorch ---------------------------------------------------------------------------------

def torch_routing(torch, x, wg, C):
    """Top-2 routing per group: (gates1, gates2) [G,S], (idx1, idx2) [G,S], (pos1, pos2) [G,S],
    keep masks, and the auxiliary loss."""
    G, S, M = x.shape
    E = wg.shape[1]
    gates = torch.softmax(torch.einsum("gsm,me->gse", x, wg), dim=-1)
    idx1 = gates.argmax(dim=-1)
    mask1 = torch.nn.functional.one_hot(idx1, E).to(x.dtype)
    idx2 = (gates * (1 - mask1)).argmax(dim=-1)
    mask2 = torch.nn.functional.one_hot(idx2, E).to(x.dtype)
    aux = (mask1.mean(dim=1) * gates.mean(dim=1)).mean() * E * E
    pos1 = torch.cumsum(mask1, dim=1) - mask1                      # [G,S,E]
    keep1 = mask1 * (pos1 < C)
    count1 = keep1.sum(dim=1, keepdim=True)
    pos2 = torch.cumsum(mask2, dim=1) - mask2 + count1
    keep2 = mask2 * (pos2 < C)
    g1 = (gates * mask1).sum(-1)
    g2 = (gates * mask2).sum(-1)
    denom = g1 + g2 + 1e-9
    g1, g2 = g1 / denom, g2 / denom
    k1 = keep1.sum(-1)
    k2 = keep2.sum(-1)
    p1 = (pos1 * mask1).sum(-1).long()
    p2 = (pos2 * mask2).sum(-1).long()
    return (g1 * k1, g2 * k2), (idx1, idx2), (p1, p2), (k1, k2), aux


def torch_dense_layer(torch, x, wg, wi, wo, C):
    (g1, g2), (i1, i2), (p1, p2), (k1, k2), aux = torch_routing(torch, x, wg, C)
    E = wg.shape[1]
    oh = torch.nn.functional.one_hot
    pc1 = oh(p1.clamp(max=C - 1), C).to(x.dtype) * k1[..., None]
    pc2 = oh(p2.clamp(max=C - 1), C).to(x.dtype) * k2[..., None]
    e1 = oh(i1, E).to(x.dtype)
    e2 = oh(i2, E).to(x.dtype)
    combine = (g1[..., None, None] * e1[..., :, None] * pc1[..., None, :] +
               g2[..., None, None] * e2[..., :, None] * pc2[..., None, :])   # [G,S,E,C]
    dispatch = (combine > 0).to(x.dtype)
    d = torch.einsum("gsec,gsm->egcm", dispatch, x)
    h = torch.relu(torch.einsum("egcm,emh->egch", d, wi))
    y = torch.einsum("egch,ehm->egcm", h, wo)
    return torch.einsum("gsec,egcm->gsm", combine, y), aux


def torch_index_layer(torch, x, wg, wi, wo, C):
    (g1, g2), (i1, i2), (p1, p2), (k1, k2), aux = torch_routing(torch, x, wg, C)
    G, S, M = x.shape
    E = wg.shape[1]
    T = G * S
    xf = x.reshape(T, M)
    g = torch.arange(G).repeat_interleave(S)
    tok = torch.arange(T)
    slots, toks, weights = [], [], []
    for idx, pos, keep, gate in ((i1, p1, k1, g1), (i2, p2, k2, g2)):
        kept = keep.reshape(T) > 0
        slots.append((idx.reshape(T) * (G * C) + g * C + pos.reshape(T))[kept])
        toks.append(tok[kept])
        weights.append(gate.reshape(T)[kept])
    slot = torch.cat(slots)
    src = torch.cat(toks)
    w = torch.cat(weights)
    buf = torch.zeros(E * G * C, M, dtype=x.dtype).index_add(0, slot, xf.index_select(0, src))
    h = torch.relu(torch.bmm(buf.view(E, G * C, M), wi))
    y = torch.bmm(h, wo).reshape(E * G * C, M)
    out = torch.zeros(T, M, dtype=x.dtype).index_add(0, src, y.index_select(0, slot) * w[:, None])
    return out.view(G, S, M), aux


def run_torch(system, c, reps, warmup, threads):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    G, S, M, H, E = c["tokens"] // c["group"], c["group"], c["M"], c["H"], c["E"]
    C = capacity(c)
    x = torch.randn(G, S, M, requires_grad=True)
    wg = (torch.randn(M, E) * 0.05).requires_grad_()
    wi = (torch.randn(E, M, H) * 0.04).requires_grad_()
    wo = (torch.randn(E, H, M) * 0.02).requires_grad_()
    r = torch.randn(G, S, M)
    layer = torch_dense_layer if system == "torch_dense" else torch_index_layer
    times = []
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        for p in (x, wg, wi, wo):
            p.grad = None
        y, aux = layer(torch, x, wg, wi, wo, C)
        loss = (y * r).sum() + aux
        loss.backward()
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
    return statistics.median(times), f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


# --- JAX -------------------------------------------------------------------------------------

def run_jax(c, reps, warmup, devices):
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    devs = jax.devices()[:devices]
    mesh = Mesh(devs, ("x",))
    G, S, M, H, E = c["tokens"] // c["group"], c["group"], c["M"], c["H"], c["E"]
    C = capacity(c)

    def shard(*spec):
        return NamedSharding(mesh, P(*spec))

    def layer(x, wg, wi, wo):
        gates = jax.nn.softmax(jnp.einsum("gsm,me->gse", x, wg), axis=-1)
        idx1 = jnp.argmax(gates, axis=-1)
        mask1 = jax.nn.one_hot(idx1, E, dtype=x.dtype)
        idx2 = jnp.argmax(gates * (1 - mask1), axis=-1)
        mask2 = jax.nn.one_hot(idx2, E, dtype=x.dtype)
        aux = jnp.mean(jnp.mean(mask1, axis=1) * jnp.mean(gates, axis=1)) * E * E
        pos1 = jnp.cumsum(mask1, axis=1) - mask1
        keep1 = mask1 * (pos1 < C)
        pos2 = jnp.cumsum(mask2, axis=1) - mask2 + jnp.sum(keep1, axis=1, keepdims=True)
        keep2 = mask2 * (pos2 < C)
        g1 = jnp.sum(gates * mask1, -1)
        g2 = jnp.sum(gates * mask2, -1)
        denom = g1 + g2 + 1e-9
        g1, g2 = g1 / denom, g2 / denom
        p1 = jnp.sum(pos1 * mask1, -1).astype(jnp.int32)
        p2 = jnp.sum(pos2 * mask2, -1).astype(jnp.int32)
        pc1 = jax.nn.one_hot(p1, C, dtype=x.dtype)
        pc2 = jax.nn.one_hot(p2, C, dtype=x.dtype)
        combine = ((g1[..., None, None] * keep1[..., :, None] * pc1[..., None, :]) +
                   (g2[..., None, None] * keep2[..., :, None] * pc2[..., None, :]))
        combine = jax.lax.with_sharding_constraint(combine, shard("x", None, None, None))
        dispatch = (combine > 0).astype(x.dtype)
        d = jnp.einsum("gsec,gsm->egcm", dispatch, x)
        d = jax.lax.with_sharding_constraint(d, shard("x", None, None, None))  # the AllToAll
        h = jax.nn.relu(jnp.einsum("egcm,emh->egch", d, wi))
        y = jnp.einsum("egch,ehm->egcm", h, wo)
        y = jax.lax.with_sharding_constraint(y, shard(None, "x", None, None))  # and back
        return jnp.einsum("gsec,egcm->gsm", combine, y), aux

    def loss(x, wg, wi, wo, r):
        y, aux = layer(x, wg, wi, wo)
        return jnp.sum(y * r) + aux

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
    key = jax.random.PRNGKey(0)
    k = jax.random.split(key, 5)
    x = jax.device_put(jax.random.normal(k[0], (G, S, M), jnp.float32), shard("x", None, None))
    wg = jax.device_put(0.05 * jax.random.normal(k[1], (M, E), jnp.float32), shard(None, None))
    wi = jax.device_put(0.04 * jax.random.normal(k[2], (E, M, H), jnp.float32),
                        shard("x", None, None))
    wo = jax.device_put(0.02 * jax.random.normal(k[3], (E, H, M), jnp.float32),
                        shard("x", None, None))
    r = jax.device_put(jax.random.normal(k[4], (G, S, M), jnp.float32), shard("x", None, None))
    times = []
    for i in range(warmup + 1 + reps):  # one more warm-up: the first call compiles
        t0 = time.perf_counter()
        value, grads = step(x, wg, wi, wo, r)
        jax.block_until_ready(grads)
        dt = time.perf_counter() - t0
        if i >= warmup + 1:
            times.append(dt)
    return statistics.median(times), f"jax {jax.__version__}, {len(devs)} host device(s)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system", required=True, choices=["torch_dense", "torch_index", "jax_gspmd"])
    ap.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads")
    ap.add_argument("--devices", type=int, default=1, help="JAX host devices (ranks' counterpart)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--only", default="")
    ap.add_argument("--csv", required=True)
    a = ap.parse_args()
    ranks = a.devices if a.system == "jax_gspmd" else a.threads
    rows = []
    for c in cases(ranks):
        if a.only and a.only not in c["case"]:
            continue
        if a.system == "jax_gspmd":
            t, what = run_jax(c, a.reps, a.warmup, a.devices)
        else:
            t, what = run_torch(a.system, c, a.reps, a.warmup, a.threads)
        rate = c["tokens"] / t
        print(f"{a.system:12s} {c['case']:12s} {c['tokens']:7d} tokens  {t:8.3f} s/step "
              f"{rate:10.0f} tokens/s  ({what})", flush=True)
        rows.append(dict(system=a.system, case=c["case"], ranks=ranks, tokens=c["tokens"],
                         group=c["group"], M=c["M"], H=c["H"], E=c["E"], capacity=capacity(c),
                         seconds=f"{t:.6f}", tokens_per_s=f"{rate:.1f}", version=what))
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["system"])
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
