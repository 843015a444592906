"""Solution to the exercise of notebooks/02_hicache_round_trip.ipynb; ``python notebooks/solutions/02_hicache_round_trip.py``
prints the predictions next to the saved H200 run (tests/test_notebooks.py runs it)."""
from kvnumba.tools import results

LINK_GBPS = 55.0  # the host->device copy ceiling of the H200 machine that saved the run (its meta says so)


def predict():
    """Little's law: bandwidth = bytes in flight / latency.

    One block of 32 warps with one 8-byte word a lane in flight has 32 x 32 x 8 = 8,192 bytes outstanding. At
    ``block_quota=1`` it moved B1 GB/s, so one read takes 8,192 / B1 ns. With ``q`` blocks (each on its own SM)
    ``q`` times the bytes are in flight at the same latency: about ``q x B1``, until the link's ceiling caps it.
    """
    saved = results.load("h200-block-quota.json")
    measured = dict(zip(saved["block_quota"], saved["gbps"]["kvnumba, registers"]))
    assert "55 GB/s" in saved["meta"]["machine"]
    latency_ns = 32 * 32 * 8 / measured[1]
    predicted = {q: min(q * 32 * 32 * 8 / latency_ns, LINK_GBPS) for q in (2, 4)}
    for q, gbps in predicted.items():  # within 10% of what the H200 measured
        assert abs(gbps - measured[q]) <= 0.1 * measured[q], (q, gbps, measured[q])
    return latency_ns, predicted, measured


if __name__ == "__main__":
    latency_ns, predicted, measured = predict()
    print(f"one read across PCIe takes about {latency_ns:.0f} ns")
    for q, gbps in predicted.items():
        print(f"block_quota={q}: predicted {gbps:.1f} GB/s, measured {measured[q]:.1f}")
