"""Synced metrics under DDP equal the single-process values (2 CPU processes, gloo).

Exactness needs two things: metric states that are sums or concatenations (the metrics' job),
and each sample evaluated exactly once. PyTorch's ``DistributedSampler`` pads the last shard
by repeating samples so that every rank gets the same count; here N = 1001 is odd, and the
padded run visibly counts one sample twice. Lightning's ``UnrepeatedDistributedSampler`` shards
without padding (ranks may differ by one sample), which is what evaluation loaders must use.
"""

import socket
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

N, K, D, E, TOP_K = 1001, 7, 3, 4, 2
BATCH = 64


def _data():
    g = torch.Generator().manual_seed(1234)
    target = torch.multinomial(torch.tensor([0.3, 0.25, 0.15, 0.1, 0.1, 0.07, 0.03]), N,
                               replacement=True, generator=g)
    logits = torch.randn(N, K, generator=g) + 1.5 * torch.nn.functional.one_hot(target, K)
    gates = torch.randn(N, E, generator=g).softmax(-1)
    domains = torch.randint(0, D, (N,), generator=g)
    return logits, target, gates, domains


def _evaluate(indices):
    """Evaluate the metrics on the given sample indices (this process's shard)."""
    from clbench.metrics import RoutingRecorder, make_eval_metrics
    from clbench.models import routing_channel as routing

    logits, target, gates, domains = _data()
    metrics = make_eval_metrics(K, imbalance=True)
    recorder = RoutingRecorder(num_domains=D, compositions=True)
    recorder.add_layer("moe", E)
    index = torch.tensor(indices, dtype=torch.long)
    for start in range(0, len(indices), BATCH):
        batch = index[start:start + BATCH]
        metrics.update(logits[batch], target[batch])
        for d in range(D):
            rows = batch[domains[batch] == d]
            if len(rows):
                with recorder.domain(d), routing.units(sample_labels=target[rows]):
                    routing.record("moe", experts=gates[rows].topk(TOP_K, -1).indices,
                                   gates=gates[rows])
    out = {name: float(value) for name, value in metrics.compute().items()}
    gmean = metrics["gmean"]
    with gmean.sync_context():                 # the summed counts, as compute() sees them
        out["support"] = int((gmean.tp + gmean.fn).sum())
    util = recorder.compute()["moe"]
    out["utilization"] = util["utilization"].numpy()
    out["soft_utilization"] = util["soft_utilization"].numpy()
    out["load_imbalance"] = float(util["load_imbalance"])
    out["compositions"] = recorder.compositions().get("moe")  # merged across processes (N_eff)
    return out


def _shards(world):
    """Per-rank sample indices from Lightning's unpadded sampler and PyTorch's padded one."""
    from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
    from torch.utils.data import DistributedSampler

    samples = range(N)
    return {
        "unrepeated": [list(UnrepeatedDistributedSampler(samples, num_replicas=world, rank=r,
                                                         shuffle=False)) for r in range(world)],
        "padded": [list(DistributedSampler(samples, num_replicas=world, rank=r, shuffle=False))
                   for r in range(world)],
        # one process gets every sample, the other none: its empty states must still sync
        "lopsided": [list(samples)] + [[] for _ in range(world - 1)],
    }


def _worker(rank, world, port, shards, out_dir):
    import warnings

    import torch.distributed as dist

    from clbench.engine.trainer import end_process_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # "compute before update" on the empty rank
            results = {name: _evaluate(per_rank[rank]) for name, per_rank in shards.items()}
        results["shard_size"] = len(shards["unrepeated"][rank])
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        end_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(2, _free_port(), _shards(2), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _assert_same(synced, single):
    for key in ("acc", "gmean", "mauc", "load_imbalance"):
        assert synced[key] == pytest.approx(single[key], abs=1e-12), key
    assert synced["support"] == single["support"] == N
    np.testing.assert_allclose(synced["utilization"], single["utilization"], atol=1e-12)
    np.testing.assert_allclose(synced["soft_utilization"], single["soft_utilization"], atol=1e-6)
    assert synced["compositions"]["units"] == single["compositions"]["units"] == N
    assert synced["compositions"] == pytest.approx(single["compositions"], abs=1e-12)


def test_unpadded_shards_sync_to_the_single_process_values(ddp_results):
    single = _evaluate(list(range(N)))
    assert sorted(r["shard_size"] for r in ddp_results) == [500, 501]   # N not divisible
    for rank_result in ddp_results:
        _assert_same(rank_result["unrepeated"], single)


def test_a_process_without_samples_still_syncs(ddp_results):
    single = _evaluate(list(range(N)))
    for rank_result in ddp_results:
        _assert_same(rank_result["lopsided"], single)


def test_padding_sampler_double_counts(ddp_results):
    for rank_result in ddp_results:
        assert rank_result["padded"]["support"] == N + 1
