"""Which MKL branch computes the same bits on CPUs of two vendors: digests of the same products per
``MKL_CBWR`` branch, each in a fresh process, natively and under an emulator that shows the same
binary another vendor's CPU.

A level of :mod:`clbench.cpu_kernels` pins MKL with ``MKL_CBWR``. Intel documents its ISA branches
(``AVX2``, ``AVX512``) for Intel CPUs only: elsewhere MKL takes its automatic branch. This script
prints, for each branch, a digest of a float32 and a float64 matmul, of float32 and float64
scaled-dot-product attention and of an MLP's weights after 100 Adam steps (ATen pinned to AVX2,
one thread), and the time of one float32 matmul. Run it twice, natively and under ``--under``,
and compare the digests row by row: a branch whose digests agree computes alike on both vendors.

    python perf/mkl_branches.py                                     # this CPU
    python perf/mkl_branches.py --under "qemu-x86_64 -cpu EPYC-Milan-v1" --repeat 1   # an AMD CPU, emulated

qemu's user-mode emulation (Debian's ``qemu-user``) runs x86-64 code on x86-64 with the CPUID it
is told (vendor ``AuthenticAMD`` for an EPYC model), so MKL dispatches as on that CPU; its
arithmetic is done in software, some thousand times slower, and may not match a real CPU's in
every instruction: its timings are not the CPU's, and a digest that differs there is evidence,
not proof, of another vendor's bits.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

BRANCHES = ("AUTO", "AVX2", "AVX512", "COMPATIBLE")

_WORK = r"""
import hashlib, sys, time, torch
torch.set_num_threads(1)
repeat = int(sys.argv[1])
g = torch.Generator().manual_seed(0)
digests = []
for dtype in (torch.float32, torch.float64):
    a, b = torch.randn(64, 576, generator=g, dtype=dtype), torch.randn(576, 1536, generator=g, dtype=dtype)
    digests.append(hashlib.sha1((a @ b).numpy().tobytes()).hexdigest()[:8])
    q = torch.randn(4, 9, 40, 64, generator=g, dtype=dtype)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    digests.append(hashlib.sha1(out.numpy().tobytes()).hexdigest()[:8])
torch.manual_seed(0)  # a training trajectory: 100 Adam steps of an MLP, digest of its final weights
net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.Adam(net.parameters(), lr=2e-3)
x, y = torch.randn(512, 64, generator=g), torch.randint(0, 10, (512,), generator=g)
for step in range(100):
    rows = slice(step % 8 * 64, step % 8 * 64 + 64)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x[rows]), y[rows]).backward()
    opt.step()
weights = torch.cat([p.detach().flatten() for p in net.parameters()])
digests.append(hashlib.sha1(weights.numpy().tobytes()).hexdigest()[:8])
a, b = torch.randn(256, 1024, generator=g), torch.randn(1024, 1024, generator=g)
start = time.perf_counter()
for _ in range(repeat):
    a @ b
print(" ".join(digests), f"{(time.perf_counter() - start) / repeat * 1000:.1f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--under", default="", help="a command to run each process under (an emulator)")
    parser.add_argument("--repeat", type=int, default=20, help="float32 matmuls timed per branch")
    parser.add_argument("--branches", nargs="+", default=list(BRANCHES), choices=BRANCHES)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    base.update(ATEN_CPU_CAPABILITY="avx2", OMP_NUM_THREADS="1")
    # the vendor MKL sees is the CPUID's, which /proc/cpuinfo (the host's, under qemu) does not show
    print(f"{args.under or 'native'}: ATen avx2, one thread\n")
    print("| MKL_CBWR | fp32 matmul | fp32 attention | fp64 matmul | fp64 attention | MLP trained | "
          "ms per fp32 256x1024x1024 |")
    print("|---|---|---|---|---|---|---:|")
    for branch in args.branches:
        done = subprocess.run([*shlex.split(args.under), sys.executable, "-c", _WORK, str(args.repeat)],
                              env={**base, "MKL_CBWR": branch}, capture_output=True, text=True, check=True)
        *digests, ms = done.stdout.split()
        print(f"| {branch} | {' | '.join(digests)} | {ms} |", flush=True)


if __name__ == "__main__":
    main()
