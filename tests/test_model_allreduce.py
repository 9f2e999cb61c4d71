"""scripts/model_allreduce.py: the alpha-beta fit recovers known parameters, and the model's
predictions follow from them."""
import importlib.util
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # the scripts import their shared helpers
spec = importlib.util.spec_from_file_location("model_allreduce",
                                              REPO / "scripts" / "model_allreduce.py")
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)

SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB


def synthetic(a: float, b: float):
    return [(n, a + b * n) for n in SIZES]


def test_fit_recovers_latency_and_time_per_byte():
    a, b = model.fit(synthetic(40e-6, 1 / 100e6))
    assert a == pytest.approx(40e-6 + 1 / 100e6 * 4096, rel=0.05)  # median of 1, 4, 16 KiB
    assert b == pytest.approx(1 / 100e6, rel=0.01)


def test_fit_ignores_one_slow_outlier():
    points = synthetic(40e-6, 1 / 100e6)
    points[-2] = (points[-2][0], points[-2][1] * 1.7)  # one slow 64 MiB call
    _, b = model.fit(points)
    assert b == pytest.approx(1 / 100e6, rel=0.02)


def test_parameters_and_predictions_from_a_benchmark():
    rate = 119e6
    results = []
    for link, layout, algo, series, a, b in [
            ("1gbit", "2x1", "flat", "raw", 60e-6, 1 / rate),
            ("1gbit", "2x1", "flat", "hvdlike", 360e-6, 1 / rate),
            ("1gbit", "2x2", "flat", "hvdlike", 400e-6, 1 / (0.9 * rate)),
            ("1gbit", "2x2", "hierarchical", "hvdlike", 500e-6, 1 / (0.6 * rate))]:
        for n, t in synthetic(a, b):
            results.append(dict(link=link, layout=layout, algorithm=algo, series=series,
                                bytes=n, time_s=t, line_rate=rate))
    p = model.parameters({"results": results})
    assert p["alpha_s"] == pytest.approx((60e-6 + 4096 / rate) / 2)  # a at the median size
    assert p["overhead_s"] == pytest.approx(300e-6, rel=0.05)
    assert (p["e_flat"], p["e_hier"]) == (pytest.approx(0.9, rel=0.01),
                                          pytest.approx(0.6, rel=0.01))
    f, link = 64 << 20, 10 * model.GBIT
    flat = model.allreduce_time(p, "flat", 8, 8, f, link)
    assert flat == pytest.approx(p["overhead_s"] + 2 * math.log2(64) * p["alpha_s"]
                                 + 2 * 7 / 8 * f / (p["e_flat"] * link) + f / model.MPI_ON_NODE)
    rows = model.predict(p)
    assert len([r for r in rows if r.get("best")]) == len(model.LINKS_GBIT) * len(model.HOSTS)
    assert all(0 < r["efficiency"] <= 1 for r in rows)
    for key in {(r["link_gbit"], r["hosts"], r["algorithm"]) for r in rows}:
        mine = [r for r in rows if (r["link_gbit"], r["hosts"], r["algorithm"]) == key]
        # overlap with the best fusion size never loses to one bucket after backprop (tiny
        # buckets can: each pays the per-bucket costs)
        assert max(r["efficiency"] for r in mine) >= mine[0]["no_overlap_efficiency"]
