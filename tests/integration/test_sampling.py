"""Sampling mode (--sample-rate): a Poisson process over allocated bytes, every sample weighted
by 1/P. The estimates of a known workload must land on the true totals within the error the
sampling itself predicts."""
import math

from conftest import Memhook, build, site

SIZES = {"site_small": 48, "site_medium": 1000, "site_large": 20000, "site_huge": 300000}
COUNTS = {"site_small": 120000, "site_medium": 40000, "site_large": 4000, "site_huge": 400}
RATE = 64 * 1024


def sigma(size: int, blocks: int) -> float:
    """Standard deviation of the estimated bytes of `blocks` blocks of `size` bytes."""
    p = -math.expm1(-size / RATE)
    return math.sqrt(blocks * size * size * (1 - p) / p)


def test_estimates_converge_on_the_true_totals(tmp_path, targets):
    target = targets(build(tmp_path, "sampling.c"))
    mh = Memhook(target.pid, tmp_path, "--sample-rate", str(RATE))
    target.command("go")
    report = mh.stop()
    t = report["totals"]
    assert t["sample_rate"] == RATE and t["dropped_events"] == 0
    true_total = sum(SIZES[f] * COUNTS[f] for f in SIZES)
    assert 0 < t["sampled_allocations"] < sum(COUNTS.values()) / 10  # it did sample
    for f, size in SIZES.items():
        s = site(report, f)
        allocated, live = size * COUNTS[f], size * COUNTS[f] // 2
        # Four standard deviations: a false alarm about once in 16,000 runs per figure.
        assert abs(s["alloc_bytes"] - allocated) <= 4 * sigma(size, COUNTS[f]), (f, s)
        assert abs(s["outstanding_bytes"] - live) <= 4 * sigma(size, COUNTS[f] // 2), (f, s)
    # Blocks larger than the rate are almost always sampled: nearly exact.
    huge = site(report, "site_huge")
    assert abs(huge["outstanding_bytes"] - 200 * 300000) <= 0.02 * 200 * 300000
    total_sigma = math.sqrt(sum(sigma(SIZES[f], COUNTS[f]) ** 2 for f in SIZES))
    assert abs(t["alloc_bytes"] - true_total) <= 4 * total_sigma
    assert target.finish() == 0


def test_sampling_is_unbiased_over_repeated_runs(tmp_path, targets):
    """Many independent sessions on the same workload: the mean estimate of the small site
    (where one sample stands for ~1,400 blocks) converges as 1/sqrt(runs)."""
    target = targets(build(tmp_path, "sampling.c"))
    runs, estimates = 6, []
    for _ in range(runs):
        mh = Memhook(target.pid, tmp_path, "--sample-rate", str(RATE))
        target.command("go")
        estimates.append(site(mh.stop(), "site_small")["alloc_bytes"])
        target.command("release")
    mean = sum(estimates) / runs
    truth = SIZES["site_small"] * COUNTS["site_small"]
    assert abs(mean - truth) <= 4 * sigma(48, COUNTS["site_small"]) / math.sqrt(runs), estimates
    assert len(set(estimates)) > 1  # independent draws, not one replayed sequence
    assert target.finish() == 0


def test_realloc_in_sampling_mode(tmp_path, targets):
    """realloc frees a block (recorded only if it was sampled) and allocates one (sampled by its
    new size): the small blocks all leave, exactly; the grown ones are estimated."""
    target = targets(build(tmp_path, "sampling.c"))
    mh = Memhook(target.pid, tmp_path, "--sample-rate", str(RATE))
    target.command("grow")
    report = mh.stop()
    grown = site(report, "grow_site")
    assert grown["operations"] == ["realloc"]
    assert abs(grown["outstanding_bytes"] - 4000 * 20000) <= 4 * sigma(20000, 4000)
    assert abs(grown["alloc_bytes"] - 8000 * 20000) <= 4 * sigma(20000, 8000)
    small = [s for s in report["sites"] if s["frames"][0]["function"].startswith("grow_source")]
    assert all(s["outstanding_bytes"] == 0 for s in small)  # every sampled one was freed
    assert target.finish() == 0
