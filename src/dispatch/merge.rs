//! Random-robin merge: a pool takes its next request from one of its queues' channels, chosen
//! uniformly at random among those that have one ready, so no queue can starve another.

use std::future::poll_fn;
use std::task::Poll;

use tokio::sync::mpsc::Receiver;

/// The queues feeding one pool.
pub struct RandomRobin<T> {
    inputs: Vec<Receiver<T>>,
}

impl<T> RandomRobin<T> {
    pub fn new(inputs: Vec<Receiver<T>>) -> Self {
        RandomRobin { inputs }
    }

    /// The next item from a random ready input; `None` once every input is closed and empty.
    pub async fn next(&mut self) -> Option<T> {
        poll_fn(|cx| {
            let n = self.inputs.len();
            if n == 0 {
                return Poll::Ready(None);
            }
            let start = rand::random_range(0..n);
            let mut closed = Vec::new();
            for i in 0..n {
                let idx = (start + i) % n;
                match self.inputs[idx].poll_recv(cx) {
                    Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
                    Poll::Ready(None) => closed.push(idx),
                    Poll::Pending => {}
                }
            }
            closed.sort_unstable();
            for idx in closed.into_iter().rev() {
                self.inputs.swap_remove(idx);
            }
            if self.inputs.is_empty() {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::channel;

    #[tokio::test]
    async fn takes_from_every_ready_queue_and_ends_when_all_close() {
        let (a_tx, a_rx) = channel(1000);
        let (b_tx, b_rx) = channel(1000);
        for i in 0..500 {
            a_tx.send(("a", i)).await.unwrap();
            b_tx.send(("b", i)).await.unwrap();
        }
        drop((a_tx, b_tx));
        let mut merge = RandomRobin::new(vec![a_rx, b_rx]);
        let mut first_half_a = 0;
        for _ in 0..500 {
            if merge.next().await.unwrap().0 == "a" {
                first_half_a += 1;
            }
        }
        // Both queues had work: each gets roughly half of the first 500 picks.
        assert!((150..350).contains(&first_half_a), "{first_half_a}");
        let mut rest = 0;
        while merge.next().await.is_some() {
            rest += 1;
        }
        assert_eq!(rest, 500);
    }

    #[tokio::test]
    async fn a_busy_queue_does_not_block_an_idle_one() {
        let (a_tx, a_rx) = channel::<u32>(1);
        let (b_tx, b_rx) = channel::<u32>(1);
        let mut merge = RandomRobin::new(vec![a_rx, b_rx]);
        b_tx.send(7).await.unwrap();
        assert_eq!(merge.next().await, Some(7));
        drop((a_tx, b_tx));
        assert_eq!(merge.next().await, None);
    }
}
