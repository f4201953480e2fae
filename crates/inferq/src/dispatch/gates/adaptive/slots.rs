//! The wait for a free slot of a window, shared by the feedback gates. A gate asks
//! [`wait_for_slot`] with a closure that takes a slot when the window has room (under the
//! gate's own lock); a freed slot or a changed window wakes the waiters through the gate's
//! [`Notify`]. A waiter that finds no room within [`WAIT_SLICE`] answers `None`, and the pool gate
//! asks again (so a cancel or a shutdown is never kept waiting here).

use std::time::Duration;

use tokio::sync::Notify;

/// How long one ask waits for room before it answers "wait" (and is asked again).
pub(super) const WAIT_SLICE: Duration = Duration::from_millis(250);

/// Takes a slot with `take` as soon as it gives one, waiting up to [`WAIT_SLICE`] for `notify`
/// to say that room may have freed.
pub(super) async fn wait_for_slot<T>(
    notify: &Notify,
    mut take: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + WAIT_SLICE;
    loop {
        // Registered before the look, so a release between the look and the wait still wakes us.
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(slot) = take() {
            return Some(slot);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return take();
        }
    }
}
