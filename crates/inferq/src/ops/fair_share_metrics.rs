//! The `fair-share` merge policy's own families (inferq's names): the requests each pool served
//! per tenant, the weight each tenant is served by, and how many tenants' queues have work. The
//! merge counts what it serves ([`crate::dispatch::fair_share::FairShare`]), the discovery sets
//! the weights it reads and the tenants it finds ([`crate::dispatch::discovery`]); the series
//! whose labels the config names (its weights, its listed queues' tenants) exist at 0 from
//! start-up, the rest appear as tenants are found.

use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::feedback_metrics::FloatGauge;

/// One tenant in one pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub pool_name: String,
    pub tenant: String,
}

/// One tenant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WeightLabels {
    pub tenant: String,
}

/// Every family of `fair-share`.
#[derive(Debug, Default)]
pub struct FairShareMetrics {
    /// Requests the pool's merge handed to a worker, per tenant.
    pub served: Family<TenantLabels, Counter>,
    /// The weight each named tenant is served by (config, then the weights hash).
    pub weight: Family<WeightLabels, FloatGauge>,
    /// The weight of a tenant no one named.
    pub default_weight: FloatGauge,
    /// Tenant queues in the index of queues with work (found and not yet idle).
    pub tenants_with_work: Gauge,
    /// The tenants whose weight series exist, so a weight taken away is removed.
    weighted: Mutex<BTreeSet<String>>,
}

impl FairShareMetrics {
    /// Adds every family to the registry.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "inferq_fair_share_served",
            "Requests fair-share handed to a worker, per pool and tenant",
            self.served.clone(),
        );
        r.register(
            "inferq_fair_share_weight",
            "The weight fair-share serves a named tenant by",
            self.weight.clone(),
        );
        r.register(
            "inferq_fair_share_default_weight",
            "The weight fair-share serves a tenant no one named by",
            self.default_weight.clone(),
        );
        r.register(
            "inferq_fair_share_tenants_with_work",
            "Tenant queues fair-share found in the index of queues with work",
            self.tenants_with_work.clone(),
        );
    }

    /// Creates the served count of `tenant` in `pool` at 0.
    pub fn precreate_served(&self, pool: &str, tenant: &str) {
        let _ = self.served.get_or_create(&TenantLabels {
            pool_name: pool.to_owned(),
            tenant: tenant.to_owned(),
        });
    }

    /// Sets the weights now in force: each named tenant's (removing those no longer named) and
    /// the default.
    pub fn set_weights<'a>(
        &self,
        named: impl IntoIterator<Item = (&'a String, f64)>,
        default: f64,
    ) {
        let mut weighted = self
            .weighted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut now = BTreeSet::new();
        for (tenant, w) in named {
            let labels = WeightLabels {
                tenant: tenant.clone(),
            };
            self.weight.get_or_create(&labels).set(w);
            now.insert(tenant.clone());
        }
        for gone in weighted.difference(&now) {
            self.weight.remove(&WeightLabels {
                tenant: gone.clone(),
            });
        }
        *weighted = now;
        self.default_weight.set(default);
    }
}
