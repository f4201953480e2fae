//! Members that cannot be requests, set aside: moved from pending to the dead list (with an
//! `INVALID_REQUEST` result when their id can be read), and what `/readyz` says while Redis
//! refuses that.

use crate::dispatch::context::QueueCtx;
use crate::ops::Trouble;
use crate::queue::dead::DeadRecord;
use crate::queue::{QueueError, SetAside};
use inferq_client::wire::{ErrorCode, ResultMessage};

/// What `/readyz` names while Redis refuses to set this queue's bad members aside.
pub(super) fn dead_letters_of(ctx: &QueueCtx) -> String {
    format!("the dead list of queue {:?}", ctx.queue.name())
}

/// [`dead_letter`], and whether it was done: `false` when Redis refuses it (a dead list outside
/// this user's rights or of the wrong type), which `/readyz` then names until a bad member is
/// set aside again. An outage is an error, as for any poll.
pub(super) async fn set_aside(
    ctx: &QueueCtx,
    member: &[u8],
    reason: &str,
) -> Result<bool, QueueError> {
    match dead_letter(ctx, member, reason).await {
        Ok(()) => {
            ctx.readiness.note(&dead_letters_of(ctx), None);
            Ok(true)
        }
        Err(e) => match e.redis_refusal() {
            Some(refused) => {
                tracing::warn!(queue = %ctx.queue.name(), error = %refused, "Redis refuses to dead-letter a member that is not a valid request; it stays pending and the queue behind it goes on");
                ctx.readiness.note(
                    &dead_letters_of(ctx),
                    Some(Trouble::Refused(refused.to_string())),
                );
                Ok(false)
            }
            None => Err(e),
        },
    }
}

/// pending -> dead for a member that cannot be a request. When Redis will not take its
/// `INVALID_REQUEST` result (a result list the member names that this user may not write, or
/// that holds another type), the member is set aside without it, its record saying why: one bad
/// member must not stop the queue behind it.
async fn dead_letter(ctx: &QueueCtx, member: &[u8], reason: &str) -> Result<(), QueueError> {
    let (mut record, who) = DeadRecord::about(ctx.queue.name(), reason, member, None);
    let result = who.map(|(id, routing)| {
        // Go's form: `Failed: deadline is missing or invalid (Unix seconds).`
        let mut msg = ResultMessage::error(
            &id,
            ErrorCode::InvalidRequest,
            &format!("Failed: {reason}."),
        );
        msg.request_token = routing.request_token.clone();
        (ctx.result_route(&routing), msg)
    });
    let with_result = result.as_ref().map(|(route, msg)| (route, msg));
    let list = with_result.map(|(route, _)| route.list.as_str());
    // A result list no message may name is never pushed to: the member is set aside without
    // its result, as when Redis refuses the list.
    let mut outcome = match list.and_then(|l| ctx.route_refusal(l)) {
        Some(refusal) => SetAside::ResultRefused(refusal.to_string()),
        None => {
            ctx.queue
                .dead_letter(member, &record.to_json(), with_result)
                .await?
        }
    };
    if let (SetAside::ResultRefused(why), Some(list)) = (&outcome, list) {
        tracing::error!(queue = %ctx.queue.name(), result_list = %list, error = %why, "Redis refused an INVALID_REQUEST result; dead-lettering the member without it");
        record.reason = format!(
            "{}; its INVALID_REQUEST result could not be published to {list:?}: {why}",
            record.reason
        );
        outcome = ctx
            .queue
            .dead_letter(member, &record.to_json(), None)
            .await?;
    }
    if outcome == SetAside::Moved {
        ctx.metrics
            .dead_letters
            .get_or_create(&ctx.labels.with_outcome("undecodable"))
            .inc();
        tracing::warn!(queue = %ctx.queue.name(), id = %record.id, %reason, "dead-lettered a member that is not a valid request");
    }
    Ok(())
}
