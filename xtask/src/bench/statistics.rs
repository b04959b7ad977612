//! Summaries of measured figures: medians, ranges, means with their 95% intervals, the daemon's
//! CPU fitted against its sample rate, and numbers with thousands separators.

/// The daemon's CPU as a straight line in the samples handled per second: a fixed part (JVM
/// tracking, /proc scans, profile building) and a part per sample. Least squares over runs that
/// differ only in frequency.
#[derive(Clone, Copy, Debug)]
pub(super) struct CpuFit {
    fixed_cores: f64,
    seconds_per_sample: f64,
}

impl CpuFit {
    /// The fit of (samples per second, cores used) points.
    pub(super) fn of(points: &[(f64, f64)]) -> Option<Self> {
        if points.len() < 2 {
            return None;
        }
        let n = points.len() as f64;
        let mean_x = points.iter().map(|(rate, _)| rate).sum::<f64>() / n;
        let mean_y = points.iter().map(|(_, cores)| cores).sum::<f64>() / n;
        let (mut sxx, mut sxy) = (0.0, 0.0);
        for (rate, cores) in points {
            let dx = rate - mean_x;
            sxx += dx * dx;
            sxy += dx * (cores - mean_y);
        }
        if sxx == 0.0 {
            return None;
        }
        let seconds_per_sample = sxy / sxx;
        Some(Self {
            fixed_cores: mean_y - seconds_per_sample * mean_x,
            seconds_per_sample,
        })
    }

    /// Samples per second at which the daemon would use a whole core; None when the per-sample
    /// part is lost in the noise.
    pub(super) fn saturation_rate(&self) -> Option<f64> {
        (self.seconds_per_sample > 0.0)
            .then(|| (1.0 - self.fixed_cores.max(0.0)) / self.seconds_per_sample)
    }
}

impl std::fmt::Display for CpuFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2}% of a core + {:.1} us per sample",
            self.fixed_cores * 100.0,
            self.seconds_per_sample * 1e6
        )
    }
}

pub(super) fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The mean and the half width of its 95% confidence interval (Student's t).
pub(super) fn mean_ci95(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n < 2 {
        return (values.first().copied().unwrap_or(f64::NAN), f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, t_975(n - 1) * (variance / n as f64).sqrt())
}

/// The 97.5% quantile of Student's t with `df` degrees of freedom (Cornish-Fisher expansion
/// around the normal quantile: within 2% from 4 degrees of freedom, exact in the limit).
fn t_975(df: usize) -> f64 {
    let z: f64 = 1.959_964;
    let df = df as f64;
    z + (z.powi(3) + z) / (4.0 * df)
        + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * df * df)
}

pub(super) fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(*v), hi.max(*v))
        })
}

/// An integer with thousands separators: 1234567.8 -> "1,234,568".
pub(super) fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if value < -0.5 {
        out.insert(0, '-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_thousands_and_medians() {
        assert_eq!(thousands(1_234_567.8), "1,234,568");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(-1500.0), "-1,500");
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0].into_iter()), 2.5);
    }

    #[test]
    fn fits_fixed_and_per_sample_cpu() {
        // 0.5% of a core plus 10 us per sample.
        let points: Vec<(f64, f64)> = [38.0, 198.0, 1998.0]
            .into_iter()
            .map(|rate| (rate, 0.005 + rate * 10e-6))
            .collect();
        let fit = CpuFit::of(&points).expect("a fit");
        assert!((fit.fixed_cores - 0.005).abs() < 1e-9);
        assert!((fit.seconds_per_sample - 10e-6).abs() < 1e-12);
        let saturation = fit.saturation_rate().expect("a positive slope");
        assert!((saturation - 99_500.0).abs() < 1e-3);
    }

    #[test]
    fn t_quantile_is_close_to_the_tables() {
        // Published two-sided 95% values.
        for (df, table) in [(4, 2.776), (9, 2.262), (29, 2.045), (299, 1.968)] {
            let t = t_975(df);
            assert!((t - table).abs() / table < 0.02, "df {df}: {t} vs {table}");
        }
    }

    #[test]
    fn the_interval_narrows_with_more_pairs() {
        let few: Vec<f64> = (0..10).map(|i| (i % 3) as f64).collect();
        let many: Vec<f64> = (0..1000).map(|i| (i % 3) as f64).collect();
        let (mean_few, half_few) = mean_ci95(&few);
        let (mean_many, half_many) = mean_ci95(&many);
        assert!((mean_few - 0.9).abs() < 1e-9 && (mean_many - 0.999).abs() < 1e-9);
        assert!(half_many < half_few / 5.0, "{half_many} vs {half_few}");
    }
}
