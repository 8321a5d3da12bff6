"""Forward+backward time of the ViT MoE MLP layer against the dense MLP at equal active parameters.

The dense layer is timm's ``Mlp`` (``dim -> hidden -> dim``, GELU); the MoE layer is
``clbench.models.vision.moe.MoEMLP`` with ``--experts`` experts of that same shape, top-1 switch
routing, at ``--level`` (image or token): every token passes through one expert, so both do
the same matrix products and the MoE adds the router, the sort, one gather and one scatter.
One random batch ``(--batch-size, --tokens, --dim)`` is shared. A step is forward, a sum of
squares, backward; a round times ``--steps`` steps of each layer (the order alternating), after
an untimed warm-up round; on CUDA the clock is read after a synchronise.

Printed per round: both step times and the ratio moe / dense; then the median ratio
(target: <= 1.25).

    OMP_NUM_THREADS=1 python perf/moe_vit_speed.py                   # CPU, ViT-Tiny-sized block
    python perf/moe_vit_speed.py --level token --rounds 9
    python perf/moe_vit_speed.py --device cuda --dim 384 --batch-size 128
    python perf/moe_vit_speed.py --device cuda --dim 384 --batch-size 128 --bf16 --dispatch grouped
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def step_time(layer, x, steps: int, device: str, bf16: bool = False) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = layer(x).float().pow(2).sum()
        loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> list[float]:
    from timm.layers import Mlp

    from clbench.models.vision.moe import MoEMLP

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=192)
    parser.add_argument("--mlp-ratio", type=float, default=4.0)
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--level", choices=["image", "token"], default="image")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=65)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dispatch", choices=["loop", "grouped"], default="loop",
                        help="the MoE layer's dispatch (grouped runs in bf16 only: with --bf16)")
    parser.add_argument("--bf16", action="store_true", help="both layers under bf16 autocast")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    hidden = int(args.dim * args.mlp_ratio)
    dense = Mlp(args.dim, hidden).to(args.device)
    moe = MoEMLP.from_dense(dense, copy_weights=False, num_experts=args.experts, top_k=1,
                            level=args.level, dispatch=args.dispatch).to(args.device)
    x = torch.randn(args.batch_size, args.tokens, args.dim, device=args.device)
    for layer in (dense, moe):
        step_time(layer, x, 1, args.device, args.bf16)  # warm-up
    print(f"dim={args.dim} hidden={hidden} experts={args.experts} level={args.level} dispatch={args.dispatch} "
          f"{'bf16 autocast ' if args.bf16 else ''}"
          f"batch={args.batch_size}x{args.tokens} device={args.device} threads={torch.get_num_threads()}")
    ratios = []
    for r in range(args.rounds):
        order = (dense, moe) if r % 2 == 0 else (moe, dense)
        times = {id(layer): step_time(layer, x, args.steps, args.device, args.bf16) for layer in order}
        ratio = times[id(moe)] / times[id(dense)]
        ratios.append(ratio)
        print(f"round {r}: dense {1e3 * times[id(dense)]:.2f} ms  moe {1e3 * times[id(moe)]:.2f} ms  "
              f"ratio {ratio:.3f}")
    print(f"median ratio moe/dense: {statistics.median(ratios):.3f} (target <= 1.25)")
    return ratios


if __name__ == "__main__":
    main()
