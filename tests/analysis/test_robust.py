import numpy as np

from vlmtrace.analysis.robust import theil_sen


def test_theil_sen_finds_the_slope_despite_outliers():
    rng = np.random.default_rng(3)
    x = np.arange(200, dtype=float)
    y = 5.0 * x + rng.normal(0, 10, 200)
    y[::17] += 5000  # GC pauses, a huge image
    fit = theil_sen(x, y)
    assert abs(fit.slope - 5.0) < 0.1
    assert fit.low < 5.0 < fit.high


def test_interval_covers_the_true_slope_about_95_percent_of_the_time():
    rng = np.random.default_rng(4)
    x = np.arange(60, dtype=float)
    covered = sum((fit := theil_sen(x, 2.0 * x + rng.normal(0, 10, 60))).low <= 2.0 <= fit.high for _ in range(300))
    assert 0.9 <= covered / 300 <= 0.99


def test_sampled_pairs_on_long_series_keep_the_slope():
    rng = np.random.default_rng(5)
    x = np.arange(50_000, dtype=float)
    fit = theil_sen(x, -3.0 * x + rng.normal(0, 50, x.size))
    assert abs(fit.slope + 3.0) < 0.01 and fit.high < 0


def test_too_few_points_give_no_fit():
    assert theil_sen(np.array([1.0, 2.0]), np.array([1.0, 2.0])) is None


def test_grouped_noise_leaves_out_the_steps_between_groups():
    """Within stretches a steady rise; between them steps of 100 (a staircase of high-water marks on a
    leak): the grouped fit's residuals are measured from each group's own level, so the steps are not
    noise, and the rise counts as more than noise (leaks.is_significant)."""
    rng = np.random.default_rng(6)
    x = np.arange(120, dtype=float)
    groups = x // 30
    y = 2.0 * x + 100.0 * groups + rng.normal(0, 1, x.size)
    fit = theil_sen(x, y, groups=groups)
    assert abs(fit.slope - 2.0) < 0.05
    assert fit.noise < 2.0
    assert theil_sen(x, y).noise > 10 * fit.noise  # one line through the staircase: the steps are residuals


def test_ten_million_points_give_a_finite_fit_whose_interval_covers_the_slope():
    """Sen's variance grows with n³, past int64 at ~1.7 million points; the sampled pairs' interval is
    widened by its own sampling error, so it still covers the true slope."""
    rng = np.random.default_rng(7)
    x = np.arange(10_000_000, dtype=float)
    y = 4.0 * x + rng.normal(0, 1e6, x.size)
    fit = theil_sen(x, y)
    assert np.isfinite([fit.slope, fit.low, fit.high]).all()
    assert fit.low <= 4.0 <= fit.high and fit.high - fit.low < 0.1
    grouped = theil_sen(x, y, groups=np.repeat(np.arange(2), x.size // 2))
    assert grouped.low <= 4.0 <= grouped.high
