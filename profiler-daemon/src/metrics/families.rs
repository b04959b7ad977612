//! What a component implements to put its metrics on the endpoint's page ([`MetricSource`]),
//! and the encoder it writes its families with ([`Families`]). A leaf: the components that
//! own metrics depend on it, and it on none of them.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// A component's metrics: it encodes its own families on each scrape, from values it keeps
/// (atomics, a snapshot it publishes). Each family is encoded by one source only.
pub trait MetricSource: Send + Sync {
    fn encode(&self, out: &mut Families) -> fmt::Result;

    /// Snapshots this source published so far: a page encoded before the last one is stale
    /// (the endpoint encodes a new one). Sources read live keep the default.
    fn published(&self) -> u64 {
        0
    }
}

/// The families of one scrape, written in order.
pub struct Families<'a>(DescriptorEncoder<'a>);

/// One label, `key="value"`: most labelled families have one.
pub type Label = [(&'static str, &'static str); 1];

/// Samples labelled by one key: `key` is the label's name, the first of each pair its value.
pub fn by(
    key: &'static str,
    samples: impl IntoIterator<Item = (&'static str, u64)>,
) -> impl Iterator<Item = (Label, u64)> {
    samples
        .into_iter()
        .map(move |(value, count)| ([(key, value)], count))
}

/// Samples labelled by reason, the most common key.
pub fn reasons(
    samples: impl IntoIterator<Item = (&'static str, u64)>,
) -> impl Iterator<Item = (Label, u64)> {
    by("reason", samples)
}

/// A counter family is declared without its `_total`: the encoder adds it to the samples, so
/// the names users query are the constants of `profiler_common::metric`.
fn family_name(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
}

impl<'a> Families<'a> {
    pub fn new(encoder: DescriptorEncoder<'a>) -> Self {
        Self(encoder)
    }

    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let family =
            self.0
                .encode_descriptor(family_name(name), help, None, MetricType::Counter)?;
        ConstCounter::new(value).encode(family)
    }

    pub fn gauge(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        ConstGauge::new(value).encode(family)
    }

    pub fn counters<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, u64)>,
    ) -> fmt::Result {
        let name = family_name(name);
        self.labelled(name, help, MetricType::Counter, samples, ConstCounter::new)
    }

    pub fn gauges<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, u64)>,
    ) -> fmt::Result {
        self.labelled(name, help, MetricType::Gauge, samples, ConstGauge::new)
    }

    /// A family of one sample per label set, each value made a `metric`.
    fn labelled<L: EncodeLabelSet, M: EncodeMetric>(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        samples: impl IntoIterator<Item = (L, u64)>,
        metric: fn(u64) -> M,
    ) -> fmt::Result {
        let mut family = self.0.encode_descriptor(name, help, None, kind)?;
        for (labels, value) in samples {
            metric(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
