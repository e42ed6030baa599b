"""The break-even step-cost ratio r* on synthetic curves with a known answer: power laws, on which the log-log
interpolation is exact, a curve that dips below the target before it settles, and the curves r* lies outside of."""

from __future__ import annotations

import math

import pytest

from deep_delta.experiments import break_even as be

STEPS = 100


def power_law(a: float, alpha: float, every: int = 10, steps: int = STEPS) -> list[list[float]]:
    """L(s) = a * s**-alpha at every ``every`` steps up to ``steps``."""
    return [[s, a * s ** -alpha] for s in range(every, steps + 1, every)]


@pytest.mark.parametrize("a, alpha, target", [(10.0, 0.5, 1.2), (5.0, 0.3, 1.9), (3.0, 0.1, 2.3), (10.0, 0.5, 1.0)])
def test_r_star_of_a_power_law_is_the_analytic_one(a, alpha, target):
    # L_v(N / r) = target  <=>  N / r = (a / target)**(1 / alpha)
    expected = STEPS / (a / target) ** (1 / alpha)
    got = be.break_even(power_law(a, alpha), STEPS, target)
    assert got["outside"] is None and got["r"] == pytest.approx(expected, rel=1e-9)


def test_the_interpolation_is_log_log_between_validation_points():
    curve = power_law(10.0, 0.5)
    assert be.loglog_value(curve, 35) == pytest.approx(10 / math.sqrt(35), rel=1e-12)
    assert be.loglog_value(curve, 5) is None and be.loglog_value(curve, 101) is None  # never extrapolated


def test_r_star_outside_the_curve_is_a_bound_not_an_extrapolation():
    curve = power_law(10.0, 0.5)  # 3.162 at step 10, 1.0 at step 100
    above = be.break_even(curve, STEPS, 3.5)  # reached before the first validation point
    assert above == {"r": None, "outside": "above", "bound": 10.0}
    below = be.break_even(curve, STEPS, 0.9)  # never reached: behind even at equal steps
    assert below == {"r": None, "outside": "below", "bound": 1.0}
    assert (be.seed_text({**above, "seed": 0}), be.seed_text({**below, "seed": 0})) == ("> 10.000", "< 1.000")
    assert be.break_even([], STEPS, 1.0)["outside"] == "no curve"


def test_a_noisy_dip_before_the_last_crossing_does_not_count():
    curve = [[10, 3.0], [20, 1.1], [30, 2.0], [40, 1.5], [100, 1.0]]
    s, _ = be.crossing_step(curve, 1.2)  # 1.1 at step 20 dips below, then the curve is above until after step 40
    assert 40 < s < 100
    assert be.break_even(curve, STEPS, 1.2)["r"] == pytest.approx(STEPS / s)


def test_the_interval_is_the_t_interval_of_log_r_exponentiated():
    per_seed = [{"seed": i, **be.break_even(power_law(10.0, 0.5), STEPS, t)} for i, t in enumerate((1.1, 1.2, 1.4))]
    logs = [math.log(x["r"]) for x in per_seed]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    got = be.summarize(per_seed)
    assert got["geo_mean"] == pytest.approx(math.exp(mean))
    assert got["ci95"] == pytest.approx([math.exp(mean - 4.303 * sd / math.sqrt(3)),
                                         math.exp(mean + 4.303 * sd / math.sqrt(3))])
    assert be.verdict(got, 0.5) == "pays (measured ratio below r*)"
    assert be.verdict(got, 5.0) == "does not pay (measured ratio above r*)"
    assert be.verdict(got, got["geo_mean"]).startswith("undecided")
    # a seed outside the curve: no mean, no interval, and the seed named
    outside = be.summarize([*per_seed, {"seed": 9, **be.break_even(power_law(10.0, 0.5), STEPS, 0.5)}])
    assert outside["geo_mean"] is None and outside["ci95"] is None and outside["outside_seeds"] == [9]


def test_the_check_states_the_error_of_the_truncated_curve():
    curve = power_law(10.0, 0.5)
    row = be.check_row("ddl-cc", 1.25, 80, 1.05, curve, 1.1, seed=100)
    assert row["estimate"] == pytest.approx(10 / math.sqrt(80))
    assert row["error"] == pytest.approx(1.05 - 10 / math.sqrt(80)) and row["tie"] == "ahead"
    assert be.check_row("ddl-cc", 20.0, 5, 3.0, curve, 1.1, seed=100)["error"] is None  # before the first point
