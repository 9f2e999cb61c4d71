"""Data-parallel training with NumPy only: a softmax classifier on synthetic data.

    hvdlikerun -np 2 python examples/numpy_data_parallel.py [--epochs 5] [--batch-size 64]

Each rank trains on its own shard; gradients are averaged with one fused grouped_allreduce per
step, so every rank keeps identical weights (checked at the end). Runs unchanged without
mpirun (one process).
"""
import argparse
import time

import numpy as np

import hvdlike as hvd


def synthetic_data(n: int, features: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 0.25, (classes, features))
    y = rng.integers(0, classes, n)
    x = centers[y] + rng.normal(0, 1, (n, features))
    return x.astype(np.float32), y


def loss_and_grads(w, b, x, y):
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y] + 1e-12).mean()
    p[np.arange(len(y)), y] -= 1
    p /= len(y)
    return loss, x.T @ p, p.sum(axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    features, classes = 64, 10
    x, y = synthetic_data(args.samples, features, classes)
    x, y = x[rank::size], y[rank::size]  # this rank's shard

    rng = np.random.default_rng(1234 + rank)  # deliberately different on each rank...
    w = rng.normal(0, 0.01, (features, classes)).astype(np.float32)
    b = np.zeros(classes, np.float32)
    w, b = hvd.broadcast(w, root_rank=0), hvd.broadcast(b, root_rank=0)  # ...until broadcast

    steps = len(y) // args.batch_size
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch * size + rank).permutation(len(y))
        losses = []
        for step in range(steps):
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            loss, gw, gb = loss_and_grads(w, b, x[idx], y[idx])
            gw, gb = hvd.grouped_allreduce([gw, gb], op=hvd.Average, name="grads")
            w -= args.lr * gw
            b -= args.lr * gb
            losses.append(loss)
        loss = hvd.allreduce(np.array(np.mean(losses)), op=hvd.Average, name="loss")
        acc = hvd.allreduce(np.array(np.mean((x @ w + b).argmax(1) == y)), name="accuracy")
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {float(loss):.4f} "
                  f"accuracy {float(acc):.4f}", flush=True)
    elapsed = time.perf_counter() - start
    weights = hvd.allgather(w[None])
    identical = all(np.array_equal(weights[0], weights[r]) for r in range(size))
    if rank == 0:
        images = args.epochs * steps * args.batch_size * size
        print(f"{size} rank(s), {images / elapsed:,.0f} samples/s, weights identical on all "
              f"ranks: {identical}")
    if not identical:
        raise SystemExit("weights differ between ranks")


if __name__ == "__main__":
    main()
