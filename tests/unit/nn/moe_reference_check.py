#!/usr/bin/env python3
"""Checks the C++ MoE reference (tests/support/moe_reference.hpp) against numpy.

Reads the cases written by the doctest case "moe_ref: dump for numpy" (moe_reference_test) and
recomputes each from its inputs with shared/reference/gshard.md's DENSE formulation (one-hot masks,
exclusive cumsums over S, combine[G,S,E,C], dispatch = combine != 0, np.einsum for the four layer
einsums). Outputs, combine, dispatch and losses must agree to 1e-10, routing and counts exactly.

usage: moe_reference_check.py CASES_FILE
"""
import sys

import numpy as np

TOL = 1e-10


def parse(path):
    cases, case = [], None
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "case":
                case = {}
                cases.append(case)
            elif parts[0] == "end":
                return cases, True
            else:
                case[parts[0]] = parts[1:]
    return cases, False


def one_hot(index, n):
    return (index[..., None] == np.arange(n)).astype(np.float64)


def dense_moe(c):
    G, S, M, E, H, k, min_capacity = (int(v) for v in c["sizes"])
    capacity_factor, policy, normalize, z_coef = (float(v) for v in c["options"])
    policy = int(policy)  # 0 all, 1 random, 2 sampling

    def arr(key, shape):
        return np.array([float(v) for v in c[key]], dtype=np.float64).reshape(shape)

    x, wg = arr("x", (G, S, M)), arr("wg", (M, E))
    wi, wo = arr("wi", (E, M, H)), arr("wo", (E, H, M))
    u = arr("u", (G, S))
    # DeepSeek-V3's selection bias: added to the gates for the argmax choices only.
    bias = np.array([float(v) for v in c.get("bias", [])] or [0.0] * E)
    C = max(min_capacity, int(S * capacity_factor / E))

    logits = np.einsum("GSM,ME->GSE", x, wg)
    mx = logits.max(axis=-1, keepdims=True)
    ex = np.exp(logits - mx)
    gates = ex / ex.sum(axis=-1, keepdims=True)
    lse = mx[..., 0] + np.log(ex.sum(axis=-1))
    router_z = np.mean(lse**2)

    # Top-k choices: argmax over experts not yet taken (np.argmax: ties to the smaller index);
    # the sampling policy's second expert by inverse CDF over gates with the first masked out.
    taken = np.zeros((G, S, E))
    masks, gate = [], []
    for j in range(k):
        if j == 1 and policy == 2:
            w = gates * (1 - taken)
            run = np.cumsum(w, axis=-1)
            cand = (w > 0) & (run > u[..., None] * run[..., -1:])
            last_positive = E - 1 - np.argmax((w > 0)[..., ::-1], axis=-1)
            idx = np.where(cand.any(axis=-1), np.argmax(cand, axis=-1), last_positive)
        else:
            idx = np.argmax(np.where(taken > 0, -np.inf, gates + bias), axis=-1)
        mask = one_hot(idx, E)
        taken += mask
        masks.append(mask)
        gate.append(np.einsum("GSE,GSE->GS", gates, mask))
    if normalize:
        denom = sum(gate)
        gate = [g / denom for g in gate]
    skipped = 0
    if policy == 1:
        keep = 2 * gate[1] > u
        skipped = int((~keep).sum())
        masks[1] = masks[1] * keep[..., None]

    # aux = mean_e(m_e * c_e) * E^2 per group (c from first choices before drops), mean over G.
    m_e = gates.mean(axis=1)
    c_e = masks[0].mean(axis=1)
    aux = np.mean(np.mean(m_e * c_e, axis=-1) * E * E)

    combine = np.zeros((G, S, E, C))
    kept_before = np.zeros((G, 1, E))
    expert = -np.ones((G, S, k), dtype=np.int64)
    position = -np.ones((G, S, k), dtype=np.int64)
    tokens_per_expert = np.zeros(E, dtype=np.int64)
    asked = 0
    for j in range(k):
        pos = np.cumsum(masks[j], axis=1) - masks[j] + kept_before
        kept = masks[j] * (pos < C)
        asked += int(masks[j].sum())
        kept_before = kept_before + kept.sum(axis=1, keepdims=True)
        combine += np.einsum("GS,GSE,GSEC->GSEC", gate[j], kept, one_hot(pos.astype(np.int64), C))
        has = kept.sum(axis=-1) > 0
        expert[..., j] = np.where(has, np.argmax(kept, axis=-1), -1)
        position[..., j] = np.where(has, np.einsum("GSE,GSE->GS", kept, pos), -1).astype(np.int64)
        tokens_per_expert += kept.sum(axis=(0, 1)).astype(np.int64)
    dispatch = (combine != 0).astype(np.float64)

    dispatched = np.einsum("GSEC,GSM->EGCM", dispatch, x)
    h = np.maximum(np.einsum("EGCM,EMH->EGCH", dispatched, wi), 0)
    y = np.einsum("EGCH,EHM->GECM", h, wo)
    out = np.einsum("GSEC,GECM->GSM", combine, y)

    dropped = asked - int(tokens_per_expert.sum())
    return {
        "C": np.array([C]),
        "out": out.ravel(),
        "combine": combine.ravel(),
        "dispatch": dispatch.ravel(),
        "expert": expert.ravel(),
        "position": position.ravel(),
        "tokens_per_expert": tokens_per_expert,
        "losses": np.array([aux, router_z, z_coef * router_z]),
        "dropped": np.array([dropped, skipped, dropped / asked if asked else 0.0]),
    }


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    cases, complete = parse(sys.argv[1])
    if not complete or len(cases) < 8:
        print(f"moe_reference_check: {sys.argv[1]}: truncated or too few cases ({len(cases)})")
        return 1
    failures, drops, skips, ks = 0, 0, 0, set()
    for n, case in enumerate(cases):
        want = dense_moe(case)
        ks.add(int(case["sizes"][5]))
        for key, expected in want.items():
            got = np.array([float(v) for v in case[key]])
            if got.shape != expected.shape:
                print(f"case {n}: {key}: {got.shape} values, numpy has {expected.shape}")
                failures += 1
                continue
            err = float(np.max(np.abs(got - expected))) if got.size else 0.0
            exact = key in ("C", "expert", "position", "tokens_per_expert")
            if err > (0 if exact else TOL):
                print(f"case {n}: {key}: max |C++ - numpy| = {err:.3e}")
                failures += 1
        drops += int(want["dropped"][0])
        skips += int(want["dropped"][1])
        print(f"case {n}: sizes {' '.join(case['sizes'])}, C {want['C'][0]}, "
              f"dropped {int(want['dropped'][0])}, skipped {int(want['dropped'][1])}: "
              f"max |out| diff {np.max(np.abs(np.array(case['out'], dtype=float) - want['out'])):.1e}")
    # The cases must exercise capacity drops, the random policy and k = 1, 2, 3.
    if drops == 0 or skips == 0 or not {1, 2, 3} <= ks:
        print("moe_reference_check: the cases do not cover drops, skips and k = 1, 2, 3")
        failures += 1
    print(f"moe_reference_check: {len(cases)} cases, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
