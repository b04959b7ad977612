//! Summaries of measured figures: medians, ranges, the daemon's CPU fitted against its sample
//! rate, and numbers with thousands separators.

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

/// The mean of `values` and the half-width of its 95% confidence interval (Student's t: the
/// values are few, and assumed independent and about normal); the half-width is infinite for
/// fewer than two values.
pub(super) fn mean_interval(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, f64::INFINITY);
    }
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, t_975(n - 1) * (variance / n as f64).sqrt())
}

/// Student's t distribution's 97.5th percentile for `degrees` degrees of freedom (at least 1).
fn t_975(degrees: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match degrees {
        0 => f64::INFINITY,
        1..=30 => TABLE[degrees - 1],
        31..=60 => 2.0,
        _ => 1.96,
    }
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
    fn confidence_interval_of_a_mean() {
        // Mean 2, sample standard deviation 1 (values 1, 2, 3): t(2) * 1 / sqrt(3).
        let (mean, half) = mean_interval(&[1.0, 2.0, 3.0]);
        assert!((mean - 2.0).abs() < 1e-12);
        assert!((half - 4.303 / 3f64.sqrt()).abs() < 1e-9);
        assert_eq!(mean_interval(&[5.0]).1, f64::INFINITY);
        // Many values: the normal distribution's 1.96.
        let values: Vec<f64> = (0..100).map(|i| f64::from(i % 2)).collect();
        let (mean, half) = mean_interval(&values);
        assert!((mean - 0.5).abs() < 1e-12);
        let sd = (25.0f64 / 99.0).sqrt();
        assert!((half - 1.96 * sd / 10.0).abs() < 1e-9);
    }
}
