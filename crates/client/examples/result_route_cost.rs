//! Measures the result-route check's cost per result: `decide` for a message-named list
//! against the reserved keys of 1, 10 and 100 queues (the fleet's sizes), with and without an
//! allow-list, beside a reference run in the same process (one `HashSet` lookup of the same
//! names, the least any check costs). Prints ns per result and the ratio to the reference.
//!
//! `cargo run --release -p inferq-client --example result_route_cost`

use std::collections::HashSet;
use std::hint::black_box;
use std::time::Instant;

use inferq_client::result_route::{decide, ReservedKeys};

const ROUNDS: usize = 2_000_000;

fn reserved(queues: usize) -> ReservedKeys {
    let mut b = ReservedKeys::builder()
        .key("retry-sortedset")
        .prefix("inferq-tenant:")
        .prefix("inferq-tenants:index")
        .prefix("inferq-tenants:weights")
        .prefix("{inferq-batch}:")
        .open("{inferq-batch}:results")
        .open("{inferq-batch}:front:results");
    for i in 0..queues {
        b = b.queue(&format!("request-queue-{i}"));
    }
    b.build()
}

/// Nanoseconds per call of `f` over `names`.
fn per_call(names: &[String], mut f: impl FnMut(&str) -> bool) -> f64 {
    let started = Instant::now();
    let mut n = 0usize;
    for i in 0..ROUNDS {
        n += usize::from(f(black_box(&names[i % names.len()])));
    }
    black_box(n);
    started.elapsed().as_nanos() as f64 / ROUNDS as f64
}

fn main() {
    let names: Vec<String> = (0..64).map(|i| format!("results:tenant-{i}")).collect();
    let set: HashSet<String> = names.iter().take(8).cloned().collect();
    let reference = per_call(&names, |l| set.contains(l));
    println!("reference: one HashSet lookup: {reference:.1} ns");
    let allow = vec!["results:*".to_owned()];
    for queues in [1, 10, 100] {
        let r = reserved(queues);
        let open = per_call(&names, |l| decide(&r, l, false, &[]).is_ok());
        let allowed = per_call(&names, |l| decide(&r, l, false, &allow).is_ok());
        println!(
            "{queues:>3} queues: {open:.1} ns per result ({:.1}x reference); with an allow-list \
             pattern: {allowed:.1} ns ({:.1}x)",
            open / reference,
            allowed / reference
        );
    }
}
