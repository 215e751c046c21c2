"""Benchmark of the prefix-tree merge on synthetic agentic workloads.

Workloads (token ids drawn at random from a 151,936-token vocabulary):

* ``grpo``: GRPO groups of 8 samples, a 2k-token prompt and ~300-token responses;
* ``agent``: 10-turn tool-using trajectories, each turn adding a ~500-token
  observation (a step's prompt = previous prompt + previous response + observation);
* ``agent-drift``: ``agent`` with 5% of steps forked by re-tokenization drift (one
  token changed at the turn boundary; later turns extend the drifted history).

* ``agent-long``: ``agent`` with 30 turns, so contexts grow to ~25k tokens.

For each it reports total_tokens, tree_tokens, their ratio, forks, and merge
throughput (tokens of the steps' full sequences merged per second) against two
baselines timed in the same run on the same steps: plain packing's NumPy copy of
every step's tokens into one array per scope (a memory-bandwidth floor, no merging at
all) and a naive per-token dict trie (a merge with one Python object per token).

``--torch`` adds a GPU section (torch and CUDA only): forward+backward of a random-init
~0.5B-parameter decoder on a tree-packed batch (FlexAttention with the tree mask_mod)
versus running each step alone versus plain packing of all steps (block-diagonal
causal), with the per-target logprob agreement of the three.

Run: ``.venv/bin/python -m bench.bench_prefix_tree [--scale S] [--torch]``; the table is
printed and the figures are written to ``bench/results/prefix_tree.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from clawr1.prefix_tree import StepTokens, build_tree, pack_tree

VOCAB = 151_936
RESULTS = Path(__file__).resolve().parent / "results" / "prefix_tree.json"


# ---------------------------------------------------------------------- workloads
@dataclass
class Scope:
    """The steps of one merge scope, as plain arrays (StepTokens are made fresh per timing)."""

    rows: list[tuple[str, np.ndarray, np.ndarray, str | None]]

    def steps(self) -> list[StepTokens]:
        return [StepTokens(sid, p, r, parent) for sid, p, r, parent in self.rows]


def grpo_groups(
    rng: np.random.Generator,
    groups: int,
    samples: int = 8,
    prompt_len: int = 2048,
    resp_mean: int = 300,
    vocab: int = VOCAB,
) -> list[Scope]:
    """GRPO groups: ``samples`` responses of ~``resp_mean`` tokens to one shared prompt."""
    scopes = []
    for g in range(groups):
        prompt = rng.integers(0, vocab, prompt_len)
        rows = []
        for i in range(samples):
            size = int(np.clip(rng.normal(resp_mean, resp_mean / 6), 1, 2 * resp_mean))
            resp = rng.integers(0, vocab, size)
            rows.append((f"g{g}-s{i}", prompt, resp, None))
        scopes.append(Scope(rows))
    return scopes


def agent_trajectories(
    rng: np.random.Generator,
    trajectories: int,
    turns: int = 10,
    drift: float = 0.0,
    prompt_range: tuple[int, int] = (800, 1200),
    resp_range: tuple[int, int] = (150, 450),
    obs_range: tuple[int, int] = (400, 600),
    vocab: int = VOCAB,
) -> list[Scope]:
    """Append-only turn chains; with ``drift`` > 0 a turn's history is re-tokenized differently."""
    scopes = []
    for t in range(trajectories):
        prompt = rng.integers(0, vocab, int(rng.integers(*prompt_range)))  # system prompt + task + tools
        rows: list[tuple[str, np.ndarray, np.ndarray, str | None]] = []
        for k in range(turns):
            resp = rng.integers(0, vocab, int(rng.integers(*resp_range)))
            rows.append((f"t{t}-k{k}", prompt, resp, rows[-1][0] if rows else None))
            observation = rng.integers(0, vocab, int(rng.integers(*obs_range)))
            history = np.concatenate([prompt, resp])
            if k + 1 < turns and rng.random() < drift:
                # The chat template merges the response's last token with the next turn's
                # separator differently: one id changes at the boundary.
                history = history.copy()
                history[-1] = (history[-1] + 1 + int(rng.integers(vocab - 1))) % vocab
            prompt = np.concatenate([history, observation])
        scopes.append(Scope(rows))
    return scopes


# ---------------------------------------------------------------------- timing
def best_of(repeats: int, fn: Callable[[Any], Any], setup: Callable[[], Any]) -> float:
    """Best wall time of ``fn(setup())`` over ``repeats`` runs; ``setup`` is not timed."""
    best = float("inf")
    for _ in range(repeats):
        arg = setup()
        t0 = time.perf_counter()
        fn(arg)
        best = min(best, time.perf_counter() - t0)
    return best


def naive_trie_tokens(steps: list[StepTokens]) -> int:
    """One dict per token: the simple merge this package must beat."""
    root: dict[int, dict] = {}
    count = 0
    for s in steps:
        node = root
        for tok in s.sequence.tolist():
            nxt = node.get(tok)
            if nxt is None:
                nxt = node[tok] = {}
                count += 1
            node = nxt
    return count


def bench_workload(name: str, scopes: list[Scope], repeats: int, trie_budget_s: float) -> dict[str, Any]:
    all_steps = [s.steps() for s in scopes]
    trees = [build_tree(st) for st in all_steps]
    total = sum(t.total_tokens for t in trees)
    tree_tokens = sum(t.tree_tokens for t in trees)

    def merge(step_lists: list[list[StepTokens]]) -> None:
        for st in step_lists:
            build_tree(st)

    def copy(step_lists: list[list[StepTokens]]) -> None:
        # What plain packing costs: every step's tokens copied into one array per scope.
        for st in step_lists:
            np.concatenate([a for s in st for a in (s.prompt_ids, s.response_ids)])

    def fresh() -> list[list[StepTokens]]:
        return [s.steps() for s in scopes]

    merge_s = best_of(repeats, merge, fresh)
    copy_s = best_of(repeats, copy, fresh)
    pack_s = best_of(repeats, lambda sl: [pack_tree(st) for st in sl], fresh)

    # The naive trie is slow: time it on as many scopes as fit the budget, scaled per token.
    trie_tokens = trie_time = 0.0
    for st in all_steps:
        t0 = time.perf_counter()
        naive_trie_tokens(st)
        trie_time += time.perf_counter() - t0
        trie_tokens += sum(len(s.sequence) for s in st)
        if trie_time > trie_budget_s:
            break
    merge_tps, copy_tps, trie_tps = total / merge_s, total / copy_s, trie_tokens / trie_time
    return {
        "workload": name,
        "scopes": len(scopes),
        "steps": sum(len(st) for st in all_steps),
        "total_tokens": total,
        "tree_tokens": tree_tokens,
        "ratio": total / tree_tokens,
        "forks": sum(t.forks for t in trees),
        "nodes": sum(t.num_nodes for t in trees),
        "merge_s": merge_s,
        "merge_tokens_per_s": merge_tps,
        "copy_tokens_per_s": copy_tps,
        "trie_tokens_per_s": trie_tps,
        "merge_vs_copy": merge_tps / copy_tps,
        "merge_vs_trie": merge_tps / trie_tps,
        "pack_s": pack_s,
        "pack_tokens_per_s": total / pack_s,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = [
        ("workload", "{}"),
        ("steps", "{:d}"),
        ("total_tokens", "{:,d}"),
        ("tree_tokens", "{:,d}"),
        ("ratio", "{:.2f}x"),
        ("forks", "{:d}"),
        ("merge_tokens_per_s", "{:.3g}"),
        ("merge_vs_copy", "{:.2f}x"),
        ("merge_vs_trie", "{:.1f}x"),
        ("pack_tokens_per_s", "{:.3g}"),
    ]
    cells = [[c for c, _ in cols]] + [[fmt.format(r[c]) for c, fmt in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    for j, row in enumerate(cells):
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    print(
        "merge/pack tokens_per_s count the steps' full sequences (total_tokens); "
        "merge_vs_copy: against plain packing's NumPy copy of every step (no merge); "
        "merge_vs_trie: against a per-token dict trie."
    )


# ---------------------------------------------------------------------- torch section
TORCH_SIZES = {
    # ~0.46B parameters: 24 blocks of 12.85M plus a 155.6M tied embedding (Qwen-like vocabulary).
    "0.5b": {"dim": 1024, "layers": 24, "heads": 16, "ffn": 2816, "vocab": VOCAB},
    # Only for a quick check of the code path, e.g. on a CPU.
    "tiny": {"dim": 64, "layers": 2, "heads": 4, "ffn": 128, "vocab": 1024},
}


def torch_workloads(size: str, rng: np.random.Generator) -> list[tuple[str, list[StepTokens]]]:
    """What one training micro-batch would hold: two GRPO groups; one 10-turn trajectory."""
    if size == "tiny":
        grpo = grpo_groups(rng, 2, samples=4, prompt_len=48, resp_mean=12, vocab=1024)
        agent = agent_trajectories(
            rng, 1, turns=4, prompt_range=(20, 30), resp_range=(5, 12), obs_range=(6, 10), vocab=1024
        )
    else:
        grpo = grpo_groups(rng, 2)
        agent = agent_trajectories(rng, 1)
    return [
        ("grpo x2", [s for scope in grpo for s in scope.steps()]),
        ("agent trajectory", [s for scope in agent for s in scope.steps()]),
    ]


def _decoder(
    cfg: dict[str, int], dtype: Any, device: Any
) -> tuple[list[Any], Callable[..., Any], Callable[..., Any]]:
    """A random-init decoder (RMSNorm, rotary MHA, SwiGLU, tied embedding) as plain tensors.

    Returns (parameters, forward(ids, positions, attn) -> hidden, target_logprobs(hidden,
    pred_idx, labels)); ``attn(q, k, v)`` takes [1, heads, n, head_dim] tensors, so the
    same weights run under any attention rule.
    """
    import torch
    import torch.nn.functional as F

    dim, heads, layers, ffn, vocab = (cfg[k] for k in ("dim", "heads", "layers", "ffn", "vocab"))
    head_dim = dim // heads

    def weight(*shape: int, std: float = 0.02) -> Any:
        w = torch.randn(*shape, device=device, dtype=torch.float32) * std
        return w.to(dtype).requires_grad_()

    def ones() -> Any:
        return torch.ones(dim, device=device, dtype=dtype).requires_grad_()

    out_std = 0.02 / (2 * layers) ** 0.5
    embed, final_norm = weight(vocab, dim), ones()
    blocks = [
        {
            "n1": ones(),
            "wqkv": weight(dim, 3 * dim),
            "wo": weight(dim, dim, std=out_std),
            "n2": ones(),
            "w13": weight(dim, 2 * ffn),
            "w2": weight(ffn, dim, std=out_std),
        }
        for _ in range(layers)
    ]
    params = [embed, final_norm, *(t for b in blocks for t in b.values())]
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)

    def norm(x: Any, w: Any) -> Any:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def rope(x: Any, cos: Any, sin: Any) -> Any:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(ids: Any, positions: Any, attn: Callable[[Any, Any, Any], Any]) -> Any:
        n = ids.shape[0]
        angles = positions.float()[:, None] * inv_freq[None, :]
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        h = F.embedding(ids, embed)
        for b in blocks:
            x = norm(h, b["n1"])
            q, k, v = (x @ b["wqkv"]).view(n, 3, heads, head_dim).permute(1, 2, 0, 3).unbind(0)
            o = attn(rope(q, cos, sin)[None], rope(k, cos, sin)[None], v[None])[0]
            h = h + o.transpose(0, 1).reshape(n, dim) @ b["wo"]
            x = norm(h, b["n2"])
            gate, up = (x @ b["w13"]).chunk(2, dim=-1)
            h = h + (F.silu(gate) * up) @ b["w2"]
        return norm(h, final_norm)

    def target_logprobs(hidden: Any, pred_idx: Any, labels: Any) -> Any:
        # The LM head runs only where a target is predicted: a trainer never needs all logits.
        logits = (hidden[pred_idx] @ embed.T).float()
        return torch.log_softmax(logits, dim=-1).gather(-1, labels[:, None])[:, 0]

    return params, forward, target_logprobs


def torch_section(args: argparse.Namespace) -> dict[str, Any]:
    """Forward+backward time of tree packing vs. per-step runs vs. plain packing."""
    try:
        import torch
    except ImportError:
        print("torch section skipped: torch is not installed")
        return {"skipped": "torch is not installed"}
    device = torch.device(args.torch_device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch section skipped: no CUDA GPU")
        return {"skipped": "no CUDA GPU"}
    flex_fn = None
    if args.torch_attn == "flex":
        if device.type != "cuda":
            print("torch section skipped: FlexAttention has no backward on CPU (pass --torch-attn sdpa)")
            return {"skipped": "FlexAttention needs a GPU for backward"}
        try:
            from torch.nn.attention.flex_attention import flex_attention
        except ImportError:
            print("torch section skipped: FlexAttention needs torch >= 2.5 (or pass --torch-attn sdpa)")
            return {"skipped": "no FlexAttention"}
        flex_fn = torch.compile(flex_attention, dynamic=False)  # compiled once, one graph per length

    cfg = TORCH_SIZES[args.torch_size]
    torch.manual_seed(args.seed)
    model = _decoder(cfg, getattr(torch, args.torch_dtype), device)
    n_params = sum(p.numel() for p in model[0])
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"\ntorch {torch.__version__}: decoder {n_params / 1e6:,.1f}M params ({cfg['layers']} layers, dim "
        f"{cfg['dim']}, {cfg['heads']} heads), {args.torch_dtype}, {device.type} ({gpu}), packed attention: "
        f"{args.torch_attn}; forward+backward ms, mean of {args.torch_iters} runs after "
        f"{args.torch_warmup} warm-up"
    )
    rng = np.random.default_rng(args.seed + 1)
    results = []
    for name, steps in torch_workloads(args.torch_size, rng):
        row = _torch_workload(args, model, flex_fn, device, name, steps, rng.standard_normal(len(steps)))
        results.append(row)
        ms, peak, diff = row["ms"], row["peak_gib"], row["max_abs_dlogprob_vs_per_step"]
        print(
            f"{name}: {row['steps']} steps, total {row['total_tokens']:,} tokens, "
            f"tree {row['tree_tokens']:,} (packed length {row['tree_seq_len']:,}, "
            f"pack {row['pack_ms']:.1f} ms)\n"
            f"  per-step {ms['per_step']:.1f} ms | plain packing {ms['plain']:.1f} ms | "
            f"tree {ms['tree']:.1f} ms"
            f"  ->  tree {row['tree_speedup_vs_per_step']:.2f}x vs per-step, "
            f"{row['tree_speedup_vs_plain']:.2f}x vs plain packing\n"
            f"  peak GiB per-step/plain/tree {peak['per_step']:.1f}/{peak['plain']:.1f}/{peak['tree']:.1f}; "
            f"max |dlogprob| vs per-step: plain {diff['plain']:.2e}, tree {diff['tree']:.2e}"
            + (f"\n  errors: {row['errors']}" if row["errors"] else "")
        )
    return {
        "torch": torch.__version__,
        "device": gpu,
        "params": n_params,
        "config": cfg,
        "dtype": args.torch_dtype,
        "attention": args.torch_attn,
        "iters": args.torch_iters,
        "workloads": results,
    }


def _torch_workload(
    args: argparse.Namespace,
    model: Any,
    flex_fn: Callable[..., Any] | None,
    device: Any,
    name: str,
    steps: list[StepTokens],
    adv: np.ndarray,
) -> dict[str, Any]:
    """Time one micro-batch three ways and compare the per-target logprobs they give.

    ``flex_fn`` is the compiled FlexAttention for packed runs, or None for SDPA with a dense mask.
    """
    import torch
    import torch.nn.functional as F

    from clawr1.prefix_tree import dense_mask, flex_mask_mod

    params, forward, target_logprobs = model

    def tensor(a: np.ndarray) -> Any:
        return torch.as_tensor(a, device=device)

    def masked_attn(
        n: int, dense: Callable[[], np.ndarray], mask_mod: Callable[[], Callable[..., Any]]
    ) -> Callable[[Any, Any, Any], Any]:
        """Attention under a mask given both ways; only the form the backend needs is built."""
        if flex_fn is None:
            allowed = tensor(dense())
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        from torch.nn.attention.flex_attention import create_block_mask

        # _compile: build the block mask blockwise instead of materializing n x n booleans.
        block_mask = create_block_mask(mask_mod(), None, None, n, n, device=device, _compile=True)
        return lambda q, k, v: flex_fn(q, k, v, block_mask=block_mask)

    def causal(q: Any, k: Any, v: Any) -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def train_step(ids: Any, pos: Any, attn: Any, pred: Any, labels: Any, weights: Any) -> Any:
        lp = target_logprobs(forward(ids, pos, attn), pred, labels)
        (-(lp * weights).sum() / max(1, len(lp))).backward()
        return lp.detach().float()

    def clear_grads() -> None:
        for p in params:
            p.grad = None

    def timed(fn: Callable[[], Any]) -> dict[str, Any]:
        try:
            for _ in range(args.torch_warmup):
                fn()
                clear_grads()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            for _ in range(args.torch_iters):
                out = fn()
                clear_grads()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
            ms = (time.perf_counter() - t0) / args.torch_iters * 1000
            return {"ms": ms, "peak_gib": peak, "logprobs": out.cpu().numpy()}
        except torch.cuda.OutOfMemoryError:
            clear_grads()
            torch.cuda.empty_cache()
            return {"ms": float("nan"), "peak_gib": float("nan"), "logprobs": None, "error": "out of memory"}

    pad = 128 if flex_fn is not None else None  # FlexAttention's block size
    t0 = time.perf_counter()
    packed = pack_tree(steps, advantages=adv, pad_to_multiple=pad)
    pack_ms = (time.perf_counter() - t0) * 1000
    labels, weights = tensor(packed.labels), tensor(packed.target_advantages)

    # Tree packing: one pass over the merged tree, depth positions, tree mask.
    tree_attn = masked_attn(packed.seq_len, lambda: dense_mask(packed), lambda: flex_mask_mod(packed, device))
    tree_args = (tensor(packed.input_ids), tensor(packed.position_ids), tree_attn, tensor(packed.pred_idx))
    tree = timed(lambda: train_step(*tree_args, labels, weights))

    # Plain packing: all steps concatenated, each attending causally within itself.
    lens = np.array([len(s.sequence) for s in steps])
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    n_real = int(lens.sum())
    n_plain = n_real + (-n_real % pad if pad else 0)
    ids, pos, doc = np.zeros(n_plain, np.int64), np.zeros(n_plain, np.int64), np.full(n_plain, -1, np.int64)
    ids[:n_real] = np.concatenate([s.sequence for s in steps])
    pos[:n_real] = np.arange(n_real) - np.repeat(starts, lens)
    doc[:n_real] = np.repeat(np.arange(len(steps)), lens)
    pred = np.concatenate(
        [b + np.arange(s.prompt_len - 1, n - 1) for s, b, n in zip(steps, starts, lens, strict=True)]
    )
    doc_t = tensor(doc)
    plain_attn = masked_attn(
        n_plain,
        lambda: (doc[:, None] == doc[None, :]) & np.tri(n_plain, dtype=bool),
        lambda: lambda b, h, q, kv: (doc_t[q] == doc_t[kv]) & (kv <= q),
    )
    plain_args = (tensor(ids), tensor(pos), plain_attn, tensor(pred))
    plain = timed(lambda: train_step(*plain_args, labels, weights))

    # Per-step: every step alone with causal attention, gradients accumulated over steps.
    per_step_args = [
        (
            tensor(s.sequence),
            torch.arange(len(s.sequence), device=device),
            causal,
            torch.arange(s.prompt_len - 1, len(s.sequence) - 1, device=device),
            tensor(s.response_ids),
            torch.full((s.response_len,), float(a), device=device),
        )
        for s, a in zip(steps, adv, strict=True)
    ]
    per_step = timed(lambda: torch.cat([train_step(*a) for a in per_step_args]))

    def max_diff(run: dict[str, Any]) -> float:
        if run["logprobs"] is None or per_step["logprobs"] is None:
            return float("nan")
        return float(np.abs(run["logprobs"] - per_step["logprobs"]).max())

    runs = {"per_step": per_step, "plain": plain, "tree": tree}
    return {
        "workload": name,
        "steps": len(steps),
        "total_tokens": packed.total_tokens,
        "tree_tokens": packed.tree_tokens,
        "tree_seq_len": packed.seq_len,
        "plain_seq_len": n_plain,
        "targets": packed.num_targets,
        "pack_ms": pack_ms,
        "ms": {k: r["ms"] for k, r in runs.items()},
        "tree_speedup_vs_per_step": per_step["ms"] / tree["ms"],
        "tree_speedup_vs_plain": plain["ms"] / tree["ms"],
        "peak_gib": {k: r["peak_gib"] for k, r in runs.items()},
        "max_abs_dlogprob_vs_per_step": {"plain": max_diff(plain), "tree": max_diff(tree)},
        "errors": {k: r["error"] for k, r in runs.items() if "error" in r},
    }


def _json_safe(obj: Any) -> Any:
    """NaN (a figure not measured, e.g. peak memory on a CPU) becomes null: strict JSON has no NaN."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of scopes")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure (best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write the figures")
    parser.add_argument("--torch", action="store_true", help="also time a ~0.5B decoder on a CUDA GPU")
    parser.add_argument(
        "--torch-device", default="cuda", help="cuda, or cpu for a smoke run with --torch-size tiny"
    )
    parser.add_argument("--torch-size", choices=sorted(TORCH_SIZES), default="0.5b")
    parser.add_argument(
        "--torch-attn", choices=["flex", "sdpa"], default="flex", help="attention for packed runs"
    )
    parser.add_argument("--torch-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--torch-iters", type=int, default=3)
    parser.add_argument(
        "--torch-warmup", type=int, default=2, help="untimed runs first (FlexAttention compiles)"
    )
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)

    def n(base: int) -> int:
        return max(1, round(base * args.scale))

    workloads = [
        ("grpo", grpo_groups(rng, n(128))),
        ("agent", agent_trajectories(rng, n(96))),
        ("agent-drift", agent_trajectories(rng, n(96), drift=0.05)),
        ("agent-long", agent_trajectories(rng, n(16), turns=30)),
    ]
    rows = [bench_workload(name, scopes, args.repeats, trie_budget_s=1.5) for name, scopes in workloads]
    print_table(rows)
    result: dict[str, Any] = {
        "workloads": rows,
        "env": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "scale": args.scale,
            "repeats": args.repeats,
        },
    }
    if args.torch:
        result["torch"] = torch_section(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(_json_safe(result), indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
