//! claimed -> done, dead, parked or pending: [`Queue::finish`] ends a batch of held generations
//! in one `finish` script call, each item fenced on its own.
//!
//! A batch of [`Finish`] items comes in; the call's keys and arguments are built item by item,
//! the script runs, and its reply is read back as one [`Finished`] per item. After the call,
//! the writes may be waited on by replicas, and on a cluster what lives in other slots is done
//! in steps of its own (see [`crate::queue::cross_slot`]).

use std::borrow::Borrow;

use redis::Value;

use super::reply::bad_reply;
use super::{is_refusal, Finish, Finished, Queue, QueueError};
use inferq_client::keys::{active_key, cancel_key};
use inferq_client::scripts::SCRIPTS;

/// The keys every `finish` call passes before its result lists and producer keys (see
/// `finish-11.lua`).
const FINISH_FIXED_KEYS: usize = 11;

impl Queue {
    /// Acks, buries, parks and releases a batch of generations in one script call, each item
    /// fenced on its own. An outer error means the replies are unknown: retrying the whole
    /// batch is safe, because a repeated finish of a generation already done answers `NotYours`
    /// and writes nothing. A script error Redis answers (not a transport failure) fails every
    /// item of the batch: their claims are redelivered when their leases end.
    pub async fn finish<F: Borrow<Finish> + Sync>(
        &self,
        batch: &[F],
    ) -> Result<Vec<Finished>, QueueError> {
        let statuses = self.finish_call(batch).await?;
        if batch.len() < 2 || !statuses.iter().all(|s| matches!(s, Finished::Failed(_))) {
            return Ok(statuses);
        }
        // Redis refused the whole call. One item can be the cause (say, one naming a result list
        // this user may not write), and it must not fail its neighbours: each is tried alone.
        // Items are fenced, so one the refused call did move answers "not yours" now.
        let mut one_by_one = Vec::with_capacity(batch.len());
        for item in batch.chunks(1) {
            one_by_one.extend(self.finish_call(item).await?);
        }
        Ok(one_by_one)
    }

    /// One `finish` script call for `batch`; a refusal fails every item of it.
    async fn finish_call<F: Borrow<Finish> + Sync>(
        &self,
        batch: &[F],
    ) -> Result<Vec<Finished>, QueueError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut keys = self.finish_fixed_keys();
        let numbers: Vec<ItemNumbers> = batch
            .iter()
            .map(|f| self.item_numbers(f.borrow(), &mut keys))
            .collect();
        // What a staged item carries instead of its result: the list and the result together.
        let staged: Vec<Option<String>> = batch
            .iter()
            .map(|f| crate::queue::cross_slot::staging(f.borrow(), |list| self.staged(list)))
            .collect();
        let args = finish_args(batch, &numbers, &staged);
        let cmd = SCRIPTS.finish.cmd(&keys, &args);
        let reply = match SCRIPTS.finish.run(&mut self.con.clone(), &cmd).await {
            Ok(reply) => reply,
            Err(e) if is_refusal(&e) => {
                return Ok(vec![Finished::Failed(e.to_string()); batch.len()]);
            }
            Err(e) => return Err(e.into()),
        };
        let finished = read_finished(&reply, batch)?;
        self.after_finish(batch, &staged, &finished).await;
        Ok(finished)
    }

    /// The keys every `finish` call passes first, in the order `finish-11.lua` reads them.
    fn finish_fixed_keys(&self) -> Vec<String> {
        let k = &self.keys;
        vec![
            k.claimed.clone(),
            k.owners.clone(),
            k.idx.clone(),
            k.scores.clone(),
            k.deliveries.clone(),
            k.pending.clone(),
            k.parked.clone(),
            k.dead.clone(),
            k.deliveries_idx.clone(),
            k.finishing.clone(),
            k.finishing_idx.clone(),
        ]
    }

    /// The numbers of one item, pushing onto `keys` the keys it needs that are not there yet:
    /// its result list, then its producer keys, then its stored-apart body.
    fn item_numbers(&self, f: &Finish, keys: &mut Vec<String>) -> ItemNumbers {
        let (list, forget, backoff) = match f {
            Finish::Ack {
                id,
                request_token,
                result_list,
                ..
            }
            | Finish::Bury {
                id,
                request_token,
                result_list,
                ..
            } => {
                let list = self.result_list_index(f, result_list, keys);
                let forget = self.producer_keys_index(id, request_token, keys);
                (list, forget, 0)
            }
            Finish::Park { backoff, .. } => {
                (0, 0, u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX))
            }
            Finish::Release { .. } => (0, 0, 0),
        };
        let payload = self.payload_index(f, keys);
        ItemNumbers {
            list: list.to_string(),
            forget: forget.to_string(),
            backoff: backoff.to_string(),
            ttl: f.result_ttl_s().to_string(),
            payload: payload.to_string(),
        }
    }

    /// Where an ack's or a bury's result list is in `keys` (pushed there the first time an
    /// item names it), negated when results are published; 0 when nothing is pushed to it here.
    fn result_list_index(&self, f: &Finish, result_list: &String, keys: &mut Vec<String>) -> i64 {
        let pushes = !matches!(f, Finish::Bury { result, .. } if result.is_empty());
        let list = match keys[FINISH_FIXED_KEYS..]
            .iter()
            .position(|k| k == result_list)
        {
            // A bury without a result names no list: the call needs no right to it.
            _ if !pushes => 0,
            // A list in another cluster slot: the result is staged (index 0).
            _ if self.staged(result_list) => 0,
            Some(at) => at + FINISH_FIXED_KEYS + 1,
            None => {
                keys.push(result_list.clone());
                keys.len()
            }
        };
        // Negated: publish on the channel of that name (see `deliver.lua`).
        if self.publish_results {
            -i64::try_from(list).unwrap_or(0)
        } else {
            i64::try_from(list).unwrap_or(0)
        }
    }

    /// Where the producer's markers of request `id` (active, then cancel) are in `keys`, pushed
    /// for this item; 0 when it has none to clear here.
    fn producer_keys_index(&self, id: &str, request_token: &str, keys: &mut Vec<String>) -> usize {
        // On a cluster the markers are cleared after the call (`forget-1.lua`).
        if request_token.is_empty() || self.cluster {
            0
        } else {
            keys.push(active_key(id));
            keys.push(cancel_key(id));
            keys.len() - 1
        }
    }

    /// Where an ack's body stored apart is in `keys`, pushed for this item; 0 for none.
    fn payload_index(&self, f: &Finish, keys: &mut Vec<String>) -> usize {
        // An ack deletes the body stored apart in the same fenced step (on a cluster, where
        // it lives in another slot, after the call).
        match f {
            Finish::Ack { payload_ref, .. } if !payload_ref.is_empty() && !self.cluster => {
                keys.push(payload_ref.clone());
                keys.len()
            }
            _ => 0,
        }
    }

    /// What follows a call Redis took: waiting for replicas when an ack or a bury went through,
    /// and on a cluster the steps in other slots.
    async fn after_finish<F: Borrow<Finish> + Sync>(
        &self,
        batch: &[F],
        staged: &[Option<String>],
        finished: &[Finished],
    ) {
        let done = |(f, s): (&F, &Finished)| {
            *s == Finished::Published
                && matches!(f.borrow(), Finish::Ack { .. } | Finish::Bury { .. })
        };
        if let Some(wait) = self.settings.replica_wait {
            if batch.iter().zip(finished).any(done) {
                self.wait_for_replicas(&self.keys.pending, wait).await;
            }
        }
        if self.cluster {
            self.after_cluster_finish(batch, staged, finished).await;
        }
    }

    /// Waits for `wait.replicas` replicas to hold the writes sent to `key`'s primary; `true`
    /// when they do. A shortfall is logged: the writes stand on the primary alone, and a
    /// fail-over before they reach a replica undoes them (the request then runs again).
    pub(in crate::queue) async fn wait_for_replicas(
        &self,
        key: &str,
        wait: inferq_client::ReplicaWait,
    ) -> bool {
        match self.con.clone().wait_replicas(key, wait).await {
            Ok(acked) if acked >= wait.replicas => true,
            Ok(acked) => {
                tracing::warn!(queue = %self.name(), acked, wanted = wait.replicas, timeout = ?wait.timeout, "finished requests reached fewer replicas than asked within the timeout");
                false
            }
            Err(e) => {
                tracing::warn!(queue = %self.name(), error = %e, "cannot ask Redis how many replicas hold the finished requests (WAIT)");
                false
            }
        }
    }
}

/// One item's numbers in a `finish` call, as text. Lua indexes KEYS from 1, so an index is the
/// length of `keys` after a push; 0 names no key.
struct ItemNumbers {
    /// The index of its result list (negated: publish on the channel of that name).
    list: String,
    /// The index of its producer keys (the active marker; the cancel marker follows it).
    forget: String,
    /// A park's backoff in milliseconds.
    backoff: String,
    /// The TTL (seconds, 0 for none) its push sets on the result list.
    ttl: String,
    /// The index of the body an ack deletes.
    payload: String,
}

/// The fields of one item of a `finish` call, by the names `finish-11.lua`'s header gives them,
/// in the order the script reads them ([`ITEM_FIELDS`] per item, its `local W`). The one
/// place that knows the layout: [`item_args`] fills it, [`ItemArgs::encode`] lays it out, and
/// the tests read a call's arguments back with [`ItemArgs::decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ItemArgs<'a> {
    /// `ack`, `bury`, `park` or `release`.
    kind: &'a [u8],
    claim_key: &'a [u8],
    owner_token: &'a [u8],
    /// ack, bury: the index into KEYS of the result list (negated: publish on that channel; 0:
    /// stage); park: the member to park; release: empty.
    list_or_member: &'a [u8],
    /// ack, bury: the result (or what to stage); park: the backoff in ms; release: empty.
    result_or_backoff: &'a [u8],
    /// bury: the dead-letter record; otherwise empty.
    record: &'a [u8],
    /// ack, bury: the index into KEYS of request-active:<id>, or 0.
    forget: &'a [u8],
    /// ack, bury: the generation's request token.
    request_token: &'a [u8],
    /// ack, bury: the result list's TTL in seconds, 0 for none.
    ttl: &'a [u8],
    /// ack: the index into KEYS of the payload key, or 0.
    payload: &'a [u8],
}

/// Fields per item of a `finish` call (`local W` in `finish-11.lua`).
const ITEM_FIELDS: usize = 10;

impl<'a> ItemArgs<'a> {
    /// An item that carries only its kind and fence (a release; a park fills in the rest).
    fn fenced(kind: &'a [u8], fence: &'a crate::queue::Fence) -> ItemArgs<'a> {
        ItemArgs {
            kind,
            claim_key: fence.key.as_bytes(),
            owner_token: fence.token.as_bytes(),
            list_or_member: b"",
            result_or_backoff: b"",
            record: b"",
            forget: b"0",
            request_token: b"",
            ttl: b"0",
            payload: b"0",
        }
    }

    /// The fields in the script's order.
    fn encode(self) -> [&'a [u8]; ITEM_FIELDS] {
        [
            self.kind,
            self.claim_key,
            self.owner_token,
            self.list_or_member,
            self.result_or_backoff,
            self.record,
            self.forget,
            self.request_token,
            self.ttl,
            self.payload,
        ]
    }

    /// One item read back from a call's arguments (the tests' side of [`ItemArgs::encode`]).
    #[cfg(test)]
    fn decode(fields: &[&'a [u8]]) -> Option<ItemArgs<'a>> {
        let [kind, claim_key, owner_token, list_or_member, result_or_backoff, record, forget, request_token, ttl, payload] =
            <[&[u8]; ITEM_FIELDS]>::try_from(fields).ok()?;
        Some(ItemArgs {
            kind,
            claim_key,
            owner_token,
            list_or_member,
            result_or_backoff,
            record,
            forget,
            request_token,
            ttl,
            payload,
        })
    }
}

/// The arguments of a `finish` call: [`ITEM_FIELDS`] per item, in the order of `batch`.
fn finish_args<'a, F: Borrow<Finish>>(
    batch: &'a [F],
    numbers: &'a [ItemNumbers],
    staged: &'a [Option<String>],
) -> Vec<&'a [u8]> {
    let mut args: Vec<&[u8]> = Vec::with_capacity(batch.len() * ITEM_FIELDS);
    for ((f, n), staged) in batch.iter().map(Borrow::borrow).zip(numbers).zip(staged) {
        args.extend(item_args(f, n, staged.as_deref()).encode());
    }
    args
}

/// One item's fields: its kind, its fence, then what that kind carries (see `finish-11.lua`).
/// A staged item carries its staging instead of its result.
fn item_args<'a>(f: &'a Finish, n: &'a ItemNumbers, staged: Option<&'a str>) -> ItemArgs<'a> {
    match f {
        Finish::Ack {
            fence,
            request_token,
            result,
            ..
        } => ItemArgs {
            list_or_member: n.list.as_bytes(),
            result_or_backoff: staged.unwrap_or(result).as_bytes(),
            forget: n.forget.as_bytes(),
            request_token: request_token.as_bytes(),
            ttl: n.ttl.as_bytes(),
            payload: n.payload.as_bytes(),
            ..ItemArgs::fenced(b"ack", fence)
        },
        Finish::Bury {
            fence,
            request_token,
            result,
            record,
            ..
        } => ItemArgs {
            list_or_member: n.list.as_bytes(),
            result_or_backoff: staged.unwrap_or(result).as_bytes(),
            record: record.as_bytes(),
            forget: n.forget.as_bytes(),
            request_token: request_token.as_bytes(),
            ttl: n.ttl.as_bytes(),
            ..ItemArgs::fenced(b"bury", fence)
        },
        Finish::Park { fence, member, .. } => ItemArgs {
            list_or_member: member,
            result_or_backoff: n.backoff.as_bytes(),
            ..ItemArgs::fenced(b"park", fence)
        },
        Finish::Release { fence } => ItemArgs::fenced(b"release", fence),
    }
}

/// The reply of a `finish` call as one status per item of `batch`.
fn read_finished<F: Borrow<Finish>>(
    reply: &Value,
    batch: &[F],
) -> Result<Vec<Finished>, QueueError> {
    let statuses = match reply {
        Value::Array(items) if items.len() == batch.len() => items,
        _ => return Err(bad_reply("finish", reply)),
    };
    statuses
        .iter()
        .zip(batch.iter().map(Borrow::borrow))
        .map(|(s, f)| finished_of(s, f).ok_or_else(|| bad_reply("finish", reply)))
        .collect()
}

/// One item's status in the reply; `None` for a value the script never answers.
fn finished_of(status: &Value, f: &Finish) -> Option<Finished> {
    match status {
        Value::Int(1) => Some(Finished::Published),
        Value::Int(-2) => Some(Finished::Failed(format!(
            "WRONGTYPE the result list {:?} holds another type than a list",
            f.result_list().unwrap_or_default()
        ))),
        Value::Int(_) => Some(Finished::NotYours),
        // Redis refused to PUBLISH the result (redis-pubsub): nothing of it moved.
        Value::BulkString(refusal) => Some(Finished::Failed(format!(
            "{} (PUBLISH on the channel {:?})",
            String::from_utf8_lossy(refusal),
            f.result_list().unwrap_or_default()
        ))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::queue::Fence;

    fn fence(n: u8) -> Fence {
        Fence {
            key: format!("claim-{n}"),
            token: format!("owner-{n}"),
        }
    }

    fn numbers(list: &str, forget: &str, backoff: &str, ttl: &str, payload: &str) -> ItemNumbers {
        ItemNumbers {
            list: list.to_owned(),
            forget: forget.to_owned(),
            backoff: backoff.to_owned(),
            ttl: ttl.to_owned(),
            payload: payload.to_owned(),
        }
    }

    /// The layout the Rust side writes is the one the script reads: as many fields per item as
    /// its `local W`.
    #[test]
    fn items_have_as_many_fields_as_the_script_reads() {
        let (_, text) = inferq_client::scripts::FILES
            .iter()
            .find(|(file, _)| *file == "finish-11")
            .expect("finish-11 is listed");
        let w = text
            .lines()
            .find_map(|line| line.strip_prefix("local W = "))
            .and_then(|n| n.trim().parse::<usize>().ok());
        assert_eq!(w, Some(ITEM_FIELDS));
    }

    /// A batch of each kind, encoded as one call's arguments, reads back field by field: each
    /// kind's values sit where the script's header says, the rest hold their neutral values.
    #[test]
    fn a_calls_arguments_decode_back_to_each_items_fields() {
        let batch = vec![
            Finish::Ack {
                fence: fence(1),
                id: "a".into(),
                request_token: "tok-a".into(),
                result_list: "results".into(),
                result_ttl_s: 60,
                result: r#"{"id":"a"}"#.into(),
                payload_ref: "request-payload:a:tok-a".into(),
            },
            Finish::Bury {
                fence: fence(2),
                id: "b".into(),
                request_token: "tok-b".into(),
                result_list: "results".into(),
                result_ttl_s: 0,
                result: r#"{"id":"b"}"#.into(),
                record: r#"{"reason":"x"}"#.into(),
            },
            Finish::Park {
                fence: fence(3),
                member: b"member-c".to_vec(),
                backoff: Duration::from_millis(250),
            },
            Finish::Release { fence: fence(4) },
        ];
        let numbers = vec![
            numbers("-5", "7", "0", "60", "9"),
            numbers("5", "0", "0", "0", "0"),
            numbers("0", "0", "250", "0", "0"),
            numbers("0", "0", "0", "0", "0"),
        ];
        let staged = vec![None, Some("staged-b".to_owned()), None, None];
        let args = finish_args(&batch, &numbers, &staged);
        assert_eq!(args.len(), 4 * ITEM_FIELDS);
        let items: Vec<ItemArgs<'_>> = args
            .chunks(ITEM_FIELDS)
            .map(|fields| ItemArgs::decode(fields).expect("ten fields"))
            .collect();
        let ack = items[0];
        assert_eq!(
            (ack.kind, ack.claim_key, ack.owner_token),
            (&b"ack"[..], &b"claim-1"[..], &b"owner-1"[..])
        );
        assert_eq!(ack.list_or_member, b"-5", "a negated index publishes");
        assert_eq!(ack.result_or_backoff, br#"{"id":"a"}"#);
        assert_eq!(ack.record, b"");
        assert_eq!((ack.forget, ack.request_token), (&b"7"[..], &b"tok-a"[..]));
        assert_eq!((ack.ttl, ack.payload), (&b"60"[..], &b"9"[..]));
        let bury = items[1];
        assert_eq!(bury.kind, b"bury");
        assert_eq!(
            bury.result_or_backoff, b"staged-b",
            "a staged item carries its staging"
        );
        assert_eq!(bury.record, br#"{"reason":"x"}"#);
        assert_eq!(bury.payload, b"0", "a bury keeps the body for a requeue");
        let park = items[2];
        assert_eq!(park.kind, b"park");
        assert_eq!(park.list_or_member, b"member-c");
        assert_eq!(park.result_or_backoff, b"250");
        assert_eq!(
            (park.record, park.forget, park.request_token),
            (&b""[..], &b"0"[..], &b""[..])
        );
        let release = items[3];
        assert_eq!(release, ItemArgs::fenced(b"release", &fence(4)));
        assert_eq!(release.claim_key, b"claim-4");
    }
}
