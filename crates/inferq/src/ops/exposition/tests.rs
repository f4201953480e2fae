//! The page a small registry makes, compared whole with what client_golang writes for the same
//! metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::*;

/// Declared in the processor's field order, which is not Go's label order.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    queue_id: String,
    queue_name: String,
    pool_name: String,
}

fn labels(queue_id: &str, queue_name: &str) -> Labels {
    Labels {
        queue_id: queue_id.into(),
        queue_name: queue_name.into(),
        pool_name: "default".into(),
    }
}

#[test]
fn a_small_registry_reads_as_client_golang_writes_it() {
    let mut registry = Registry::default();
    let requests = Family::<Labels, Counter>::default();
    let latency =
        Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new([1e3, 1.8e6, 8.64e7]));
    let budget = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let unused = Family::<Labels, Counter>::default();
    let depth: Gauge = Gauge::default();
    registry.register(
        "requests",
        "Requests with a \\ and\na newline",
        requests.clone(),
    );
    registry.register("latency_millis", "Latency", latency.clone());
    registry.register("budget", "Budget", budget.clone());
    registry.register("never_recorded", "Never recorded", unused);
    registry.register("depth", "Depth", depth.clone());
    registry.register("build", "Build", Info::new(vec![("version", "1.2")]));

    requests.get_or_create(&labels("q2", "b")).inc_by(1_500_000);
    requests
        .get_or_create(&labels("q1", "a \"quoted\" {name}, # with\\ \n"))
        .inc();
    let histogram = latency.get_or_create(&labels("q1", "a"));
    histogram.observe(12.0);
    histogram.observe(2e6);
    budget.get_or_create(&labels("q1", "a")).set(1.0);
    depth.set(3);

    let page = encode(&registry).expect("encodes");
    let want = "\
# HELP budget Budget.
# TYPE budget gauge
budget{pool_name=\"default\",queue_id=\"q1\",queue_name=\"a\"} 1
# HELP build_info Build.
# TYPE build_info gauge
build_info{version=\"1.2\"} 1
# HELP depth Depth.
# TYPE depth gauge
depth 3
# HELP latency_millis Latency.
# TYPE latency_millis histogram
latency_millis_bucket{pool_name=\"default\",queue_id=\"q1\",queue_name=\"a\",le=\"1000\"} 1
latency_millis_bucket{pool_name=\"default\",queue_id=\"q1\",queue_name=\"a\",le=\"1.8e+06\"} 1
latency_millis_bucket{pool_name=\"default\",queue_id=\"q1\",queue_name=\"a\",le=\"8.64e+07\"} 2
latency_millis_bucket{pool_name=\"default\",queue_id=\"q1\",queue_name=\"a\",le=\"+Inf\"} 2
latency_millis_sum{pool_name=\"default\",queue_id=\"q1\",queue_name=\"a\"} 2.000012e+06
latency_millis_count{pool_name=\"default\",queue_id=\"q1\",queue_name=\"a\"} 2
# HELP requests_total Requests with a \\\\ and\\na newline.
# TYPE requests_total counter
requests_total{pool_name=\"default\",queue_id=\"q1\",queue_name=\"a \\\"quoted\\\" {name}, # with\\\\ \\n\"} 1
requests_total{pool_name=\"default\",queue_id=\"q2\",queue_name=\"b\"} 1.5e+06
";
    assert_eq!(page, want);
}

#[test]
fn an_empty_registry_is_an_empty_page() {
    assert_eq!(encode(&Registry::default()).expect("encodes"), "");
}
