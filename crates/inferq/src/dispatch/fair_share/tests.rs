//! The `fair-share` merge's behaviour: shares follow the weights, a tenant alone takes every
//! pick, deadlines order one tenant's requests, an idle tenant banks no credit, and the cap
//! holds a tenant back until its requests end.

use super::*;
use tokio::sync::mpsc::{channel, Sender};

/// An item: (tenant, deadline, label).
type Item = (&'static str, i64, u32);

fn weights(pairs: &[(&str, f64)]) -> SharedWeights {
    Arc::new(RwLock::new(Weights {
        by_tenant: pairs.iter().map(|(t, w)| (t.to_string(), *w)).collect(),
        default: 1.0,
    }))
}

fn merge(inputs: Vec<Receiver<Item>>, w: SharedWeights, cap: Option<usize>) -> FairShare<Item> {
    FairShare::new(
        inputs,
        Box::new(|item: &Item| (Arc::from(item.0), item.1)),
        w,
        cap,
        1,
    )
}

async fn fill(tx: &Sender<Item>, tenant: &'static str, n: u32) {
    for i in 0..n {
        tx.send((tenant, 100, i)).await.unwrap();
    }
}

#[tokio::test]
async fn shares_follow_the_weights() {
    let (a_tx, a_rx) = channel(1000);
    let (b_tx, b_rx) = channel(1000);
    let (c_tx, c_rx) = channel(1000);
    fill(&a_tx, "a", 600).await;
    fill(&b_tx, "b", 600).await;
    fill(&c_tx, "c", 600).await;
    let mut m = merge(
        vec![a_rx, b_rx, c_rx],
        weights(&[("a", 3.0), ("b", 2.0)]),
        None,
    );
    let mut got = HashMap::new();
    for _ in 0..600 {
        let (t, _, _) = m.next().await.unwrap();
        *got.entry(t).or_insert(0) += 1;
    }
    // 3 : 2 : 1 of 600 picks, up to a few picks' rounding of the tags.
    assert!((297..=303).contains(&got["a"]), "{got:?}");
    assert!((197..=203).contains(&got["b"]), "{got:?}");
    assert!((97..=103).contains(&got["c"]), "{got:?}");
}

#[tokio::test]
async fn a_tenant_alone_takes_every_pick_and_a_newcomer_shares_at_once() {
    let (a_tx, a_rx) = channel(1000);
    let (b_tx, b_rx) = channel(1000);
    fill(&a_tx, "a", 500).await;
    let mut m = merge(vec![a_rx, b_rx], weights(&[]), None);
    for _ in 0..200 {
        assert_eq!(
            m.next().await.unwrap().0,
            "a",
            "a alone is served every time"
        );
    }
    // b arrives after a was served 200 times: it shares from now on, neither waiting for a
    // to be done nor taking the next 200 picks to catch up.
    fill(&b_tx, "b", 100).await;
    let mut b = 0;
    for _ in 0..20 {
        if m.next().await.unwrap().0 == "b" {
            b += 1;
        }
    }
    assert!((9..=11).contains(&b), "b got {b} of 20");
    // Once b has nothing left, a takes every pick again.
    let mut rest = Vec::new();
    drop((a_tx, b_tx));
    while let Some((t, _, _)) = m.next().await {
        rest.push(t);
    }
    assert_eq!(rest.len(), 500 - 200 + 100 - 20);
    let tail: Vec<_> = rest.iter().rev().take(100).collect();
    assert!(tail.iter().all(|t| **t == "a"), "{tail:?}");
}

#[tokio::test]
async fn one_tenant_s_queues_go_by_deadline() {
    // Tenant a has two queues; its requests come out earliest deadline first across both,
    // while b still gets its half.
    let (a1_tx, a1_rx) = channel(100);
    let (a2_tx, a2_rx) = channel(100);
    let (b_tx, b_rx) = channel(100);
    for d in [10, 30, 50] {
        a1_tx.send(("a", d, d as u32)).await.unwrap();
    }
    for d in [20, 40, 60] {
        a2_tx.send(("a", d, d as u32)).await.unwrap();
    }
    fill(&b_tx, "b", 6).await;
    drop((a1_tx, a2_tx, b_tx));
    let mut m = merge(vec![a1_rx, a2_rx, b_rx], weights(&[]), None);
    let mut a = Vec::new();
    let mut order = Vec::new();
    while let Some((t, d, _)) = m.next().await {
        order.push(t);
        if t == "a" {
            a.push(d);
        }
    }
    assert_eq!(a, [10, 20, 30, 40, 50, 60]);
    assert_eq!(
        order[..6].iter().filter(|t| **t == "a").count(),
        3,
        "{order:?}"
    );
}

#[tokio::test]
async fn weights_change_while_running() {
    let (a_tx, a_rx) = channel(1000);
    let (b_tx, b_rx) = channel(1000);
    fill(&a_tx, "a", 800).await;
    fill(&b_tx, "b", 800).await;
    let w = weights(&[]);
    let mut m = merge(vec![a_rx, b_rx], w.clone(), None);
    for _ in 0..100 {
        m.next().await.unwrap();
    }
    w.write().unwrap().by_tenant.insert("b".into(), 4.0);
    let mut b = 0;
    for _ in 0..500 {
        if m.next().await.unwrap().0 == "b" {
            b += 1;
        }
    }
    assert!((395..=405).contains(&b), "b got {b} of 500 at weight 4 : 1");
}

#[tokio::test]
async fn the_cap_holds_a_tenant_back_until_its_requests_end() {
    let (a_tx, a_rx) = channel(100);
    let (b_tx, b_rx) = channel(100);
    fill(&a_tx, "a", 10).await;
    let mut m = merge(vec![a_rx, b_rx], weights(&[]), Some(2));
    let first = m.next().await.unwrap();
    let s1 = m.take_slot().expect("a slot with a cap");
    let _second = m.next().await.unwrap();
    let s2 = m.take_slot().unwrap();
    assert_eq!(first.0, "a");
    // a holds two: its third request waits, though it is the only one ready.
    let waited = tokio::time::timeout(std::time::Duration::from_millis(50), m.next()).await;
    assert!(waited.is_err(), "a went past its cap");
    // b is not held back by a's cap.
    b_tx.send(("b", 100, 0)).await.unwrap();
    assert_eq!(m.next().await.unwrap().0, "b");
    let _b_slot = m.take_slot();
    // One of a's requests ends: the next one goes, at once.
    let waiting = tokio::spawn(async move {
        let item = m.next().await;
        (item, m)
    });
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(!waiting.is_finished());
    drop(s1);
    let (item, _m) = tokio::time::timeout(std::time::Duration::from_secs(2), waiting)
        .await
        .expect("woken when a slot was freed")
        .unwrap();
    assert_eq!(item.unwrap().0, "a");
    drop(s2);
}

#[tokio::test]
async fn queues_come_and_go_and_the_merge_ends() {
    let (a_tx, a_rx) = channel(4);
    let mut m = merge(vec![a_rx], weights(&[]), None);
    let (b_tx, b_rx) = channel(4);
    m.add(b_rx);
    b_tx.send(("b", 1, 0)).await.unwrap();
    assert_eq!(m.next().await.unwrap().0, "b");
    a_tx.send(("a", 1, 0)).await.unwrap();
    drop(a_tx);
    assert_eq!(m.next().await.unwrap().0, "a");
    drop(b_tx);
    assert!(m.next().await.is_none());
    assert!(m.inputs.is_empty());
}

#[tokio::test]
async fn a_burst_serves_one_tenant_in_a_row_and_keeps_the_shares() {
    let (a_tx, a_rx) = channel(1000);
    let (b_tx, b_rx) = channel(1000);
    fill(&a_tx, "a", 400).await;
    fill(&b_tx, "b", 400).await;
    let mut m = FairShare::new(
        vec![a_rx, b_rx],
        Box::new(|item: &Item| (Arc::from(item.0), item.1)),
        weights(&[("a", 3.0)]),
        None,
        8,
    );
    let mut order = Vec::new();
    for _ in 0..400 {
        order.push(m.next().await.unwrap().0);
    }
    // b (weight 1) is served in runs of exactly the burst; a (weight 3) in runs of several.
    let mut runs_of_b = Vec::new();
    let mut run = 0;
    for (i, t) in order.iter().enumerate() {
        run = if i > 0 && order[i - 1] == *t {
            run + 1
        } else {
            1
        };
        let ends = order.get(i + 1) != Some(t);
        if *t == "b" && ends && i + 1 < order.len() {
            runs_of_b.push(run);
        }
    }
    assert!(runs_of_b.len() > 5, "{order:?}");
    assert!(runs_of_b.iter().all(|r| *r == 8), "{runs_of_b:?}");
    let a = order.iter().filter(|t| **t == "a").count();
    assert!((285..=315).contains(&a), "a got {a} of 400 at 3 : 1");
}
