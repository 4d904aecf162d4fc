#!/usr/bin/env python3
"""One training step of the main job (examples/moe_lm) against PyTorch, parameter by parameter,
from a trained state: two consecutive checkpoints of moe_lm (steps N and N + 1, any mesh) are
loaded into the PyTorch peer (bench/moe_lm_peer.py), which redoes step N on the same batch with
the same routing draws (gshard's counter-based uniforms, rebuilt in moe_lm_peer.py) and
torch.optim.AdamW
(moments and step count from checkpoint N). Checked:

  held-out loss of checkpoints N and N + 1 (the peer's evaluation against the one moe_lm saved)
  the step's cross-entropy and aux loss (against moe_lm's record of step N + 1)
  every parameter's clipped gradient (gshard's from AdamW's first moment: (m' - b1 m) / (1 - b1))
  every parameter's update (gshard's theta' - theta against torch.optim.AdamW's)

Exit status 1 when any differs by more than float rounding explains. bench/run_moe_lm_check.sh
makes the checkpoints and runs this.

Usage: moe_lm_check_step.py STEP_N.safetensors STEP_N+1.safetensors [--batch 32] [--lr 2e-3]
       [--warmup 50] [--eval-rows 16]   (the main job's options of the run, not in its checkpoints)
The model's sizes come from the checkpoints; the routing is the main job's default (capacity
factor 2, top-2, random second expert, aux-loss balance): runs with other --routing,
--capacity-factor or --balance options are not checked (the last is refused).
"""
import argparse
import json
import struct
import sys

import numpy as np
import torch

import moe_lm_peer as peer
from moe_lm_peer import NAMES, GshardDraws, load_into, peer_values


def read_safetensors(path):
    """{name: tensor}, metadata."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    types = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
    out = {}
    for name, v in header.items():
        if name != "__metadata__":
            a, b = v["data_offsets"]
            array = np.frombuffer(data[a:b], dtype=types[v["dtype"]]).reshape(v["shape"])
            out[name] = torch.from_numpy(array.copy())
    return out, header.get("__metadata__", {})


def records(meta):
    """moe_lm's loss records: {step: (train, aux, held_out)}."""
    out = {}
    for line in meta["moe_lm.records"].splitlines():
        step, *values = line.split()
        out[int(step)] = tuple(float(v) for v in values)
    return out


def as_gshard(net, of):
    """of(parameter) for every peer parameter, in gshard's names and shapes."""
    m, heads = net.embed.weight.shape[1], net.blocks[0].attn.heads
    out = {n: [] for n in NAMES}
    out.update(embed=of(net.embed.weight), pos=of(net.pos), lnf_g=of(net.ln_f.weight),
               lnf_b=of(net.ln_f.bias))
    for b in net.blocks:
        out["ln1_g"].append(of(b.ln1.weight))
        out["ln1_b"].append(of(b.ln1.bias))
        out["ln2_g"].append(of(b.ln2.weight))
        out["ln2_b"].append(of(b.ln2.bias))
        qkv = of(b.attn.qkv.weight)
        for j, n in enumerate(("wq", "wk", "wv")):
            out[n].append(qkv[j * m:(j + 1) * m].T.reshape(m, heads, -1))
        out["wo"].append(of(b.attn.out.weight).T.reshape(heads, -1, m))
        if isinstance(b.ffn, peer.MoE):
            for n, p in (("moe_wg", b.ffn.wg), ("moe_wi", b.ffn.wi), ("moe_wo", b.ffn.wo)):
                out[n].append(of(p))
        else:
            out["ffn_wi"].append(of(b.ffn.wi.weight).T)
            out["ffn_wo"].append(of(b.ffn.wo.weight).T)
    return {n: (torch.stack(v) if v else torch.zeros(0)) if isinstance(v, list) else v
            for n, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step_n", help="moe_lm's checkpoint of step N")
    ap.add_argument("step_n1", help="the same run's checkpoint of step N + 1")
    # The main job's options that its checkpoints do not record (examples/moe_lm/options.hpp).
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--eval-rows", type=int, default=16, help="--eval-batches x batch / 8")
    args = ap.parse_args()
    a, meta_a = read_safetensors(args.step_n)
    b, meta_b = read_safetensors(args.step_n1)
    n = int(meta_a["moe_lm.step"])
    if int(meta_b["moe_lm.step"]) != n + 1 or meta_a["moe_lm.seed"] != meta_b["moe_lm.seed"]:
        print("the checkpoints must be steps N and N + 1 of one run", file=sys.stderr)
        return 2
    if any(k.startswith("router.") for k in a):
        print("selection-bias balancing (--balance bias/both) is not in the peer", file=sys.stderr)
        return 2
    seed, total = int(meta_a["moe_lm.seed"]), int(meta_b["moe_lm.total_steps"])
    context = a["model.pos"].shape[0]
    net = peer.MoeLM(d_model=a["model.embed"].shape[1], layers=a["model.ln1_g"].shape[0],
                     heads=a["model.wq"].shape[2], ffn=a["model.ffn_wi"].shape[2],
                     experts=a["model.moe_wg"].shape[2], context=context)
    corpus = peer.load_corpus()
    failures = []

    def check(what, ours, theirs, tolerance):
        ok = abs(ours - theirs) <= tolerance
        print(f"{what:28s} gshard {ours:10.6f}  PyTorch {theirs:10.6f}  |diff| "
              f"{abs(ours - theirs):.1e}{'' if ok else '  FAIL'}")
        if not ok:
            failures.append(what)

    def of(t, kind="model"):  # gshard's tensors of a checkpoint by parameter name
        return {name: t[f"{kind}.{name}"] if kind == "model" else t[f"optimizer.{i}.{kind}"]
                for i, name in enumerate(NAMES)}

    def held_out(t):
        load_into(net, of(t))
        losses = []
        with torch.no_grad():
            for lang in range(len(corpus["codes"])):
                with GshardDraws(net, 0, args.eval_rows, context):  # evaluation: seed 0
                    batch = peer.held_out_batch(corpus, lang, args.eval_rows, context)
                    losses.append(net(*batch)[1].item())
        return sum(losses) / len(losses)

    # Float sums in other orders: the losses agree to ~1e-6 relative.
    rec_a, rec_b = records(meta_a), records(meta_b)
    check(f"held-out loss, step {n}", rec_a[n][2], held_out(a), 1e-4)
    check(f"held-out loss, step {n + 1}", rec_b[n + 1][2], held_out(b), 1e-4)

    # Step N as the peer's Trainer.step: batch, forward, backward, clipping, AdamW.
    load_into(net, of(a))
    x, y = peer.train_batch(corpus, seed, n, args.batch, context)
    with GshardDraws(net, n, args.batch, context):
        loss, ce, aux = net(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(net.parameters()), 1.0)
    check(f"cross-entropy, step {n + 1}", rec_b[n + 1][0], ce.item(), 1e-4)
    check(f"aux loss, step {n + 1}", rec_b[n + 1][1], aux.item(), 1e-4)
    grads = as_gshard(net, lambda p: p.grad.detach().clone())
    before = as_gshard(net, lambda p: p.detach().clone())
    opt = torch.optim.AdamW(net.parameters(), lr=peer.learning_rate(n + 1, args.lr, args.warmup,
                                                                     total),
                            betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)
    m, v = peer_values(net, of(a, "m")), peer_values(net, of(a, "v"))
    for p in net.parameters():
        opt.state[p] = {"step": torch.tensor(float(n)), "exp_avg": m[id(p)].clone(),
                        "exp_avg_sq": v[id(p)].clone()}
    opt.step()
    after = as_gshard(net, lambda p: p.detach().clone())

    print(f"{'parameter':9s} {'|grad|':>10s} {'rel. diff':>10s} {'v rel. diff':>12s}"
          f" {'|update|':>10s} {'rel. diff':>10s}")
    for i, name in enumerate(NAMES):
        if a["model." + name].numel() == 0:
            continue  # no such blocks (e.g. no dense block)
        m0, m1 = a[f"optimizer.{i}.m"].double(), b[f"optimizer.{i}.m"].double()
        g_ours = (m1 - 0.9 * m0) / 0.1  # AdamW's first moment after the clipped gradient
        g_theirs = grads[name].double().reshape(g_ours.shape)
        v_ours = b[f"optimizer.{i}.v"].double()  # and its second, from PyTorch's gradient
        v_theirs = 0.98 * a[f"optimizer.{i}.v"].double() + 0.02 * g_theirs * g_theirs
        u_ours = b["model." + name].double() - a["model." + name].double()
        u_theirs = (after[name] - before[name]).double().reshape(u_ours.shape)

        def rel(x, y):
            return ((x - y).norm() / y.norm()).item()

        g_rel, v_rel, u_rel = rel(g_ours, g_theirs), rel(v_ours, v_theirs), rel(u_ours, u_theirs)
        # Gradients: sums in other orders, and m' - 0.9 m cancels about a digit. Updates: float
        # parameters near 1 (layer-norm gains) keep about 4 digits of a small update.
        ok = g_rel < 1e-3 and v_rel < 1e-4 and u_rel < 3e-3
        print(f"{name:9s} {g_ours.norm().item():10.6f} {g_rel:10.1e} {v_rel:12.1e}"
              f" {u_ours.norm().item():10.6f} {u_rel:10.1e}{'' if ok else '  FAIL'}")
        if not ok:
            failures.append(name)
    print("the same step" if not failures else "differs: " + ", ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
