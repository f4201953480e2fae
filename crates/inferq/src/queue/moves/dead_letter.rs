//! pending -> dead: [`Queue::dead_letter`] sets aside a member that cannot be a request, with
//! a result when an id could be read (staged first when its list is in another cluster slot).

use redis::Value;

use super::reply::bad_reply;
use super::{is_refusal, Fence, Finish, Queue, QueueError, ResultRoute, SetAside};
use inferq_client::keys::claim_key;
use inferq_client::scripts::SCRIPTS;
use inferq_client::wire::ResultMessage;

impl Queue {
    /// pending -> dead for a member that cannot be a request; with a result when an id could
    /// be read.
    pub async fn dead_letter(
        &self,
        member: &[u8],
        record: &str,
        result: Option<(&ResultRoute, &ResultMessage)>,
    ) -> Result<SetAside, QueueError> {
        let (list, ttl_s, json) = match result {
            Some((route, msg)) => (route.list.clone(), route.ttl_s, msg.to_json()),
            None => (self.keys.dead.clone(), 0, String::new()),
        };
        let k = &self.keys;
        let keys = [&k.pending, &k.dead, &list, &k.finishing, &k.finishing_idx];
        // On a cluster, a result list in another slot gets its result staged, then delivered.
        let staged = match result {
            Some((route, msg)) if self.staged(&route.list) => Some((
                claim_key(&msg.id, "", member),
                crate::queue::cross_slot::staging(
                    &Finish::Ack {
                        fence: Fence {
                            key: String::new(),
                            token: String::new(),
                        },
                        id: msg.id.clone(),
                        request_token: String::new(),
                        result_list: route.list.clone(),
                        result_ttl_s: route.ttl_s,
                        result: json.clone(),
                        payload_ref: String::new(),
                    },
                    |_| true,
                )
                .unwrap_or_default(),
            )),
            _ => None,
        };
        let mode: &[u8] = match (&staged, self.publish_results) {
            (Some(_), _) => b"stage",
            (None, true) => b"publish",
            (None, false) => b"",
        };
        let (ck, carried) = match &staged {
            Some((ck, value)) => (ck.as_bytes(), value.as_bytes()),
            None => (&b""[..], json.as_bytes()),
        };
        let ttl_s = ttl_s.to_string();
        let args: [&[u8]; 6] = [
            member,
            record.as_bytes(),
            carried,
            mode,
            ck,
            ttl_s.as_bytes(),
        ];
        let cmd = SCRIPTS.dead_letter.cmd(&keys, &args);
        let reply = match SCRIPTS.dead_letter.run(&mut self.con.clone(), &cmd).await {
            Ok(reply) => reply,
            // Refused with a result to push: the result list can be the cause (outside this
            // user's rights); the caller can set the member aside without it.
            Err(e) if result.is_some() && is_refusal(&e) => {
                return Ok(SetAside::ResultRefused(e.to_string()))
            }
            Err(e) => return Err(e.into()),
        };
        match reply {
            Value::Int(1) => {
                if let Some((ck, value)) = staged {
                    self.settle_one(ck, value).await;
                }
                Ok(SetAside::Moved)
            }
            Value::Int(0) => Ok(SetAside::Gone),
            Value::Int(-1) => Ok(SetAside::ResultRefused(format!(
                "WRONGTYPE the result list {list:?} holds another type than a list"
            ))),
            other => Err(bad_reply("deadLetter", &other)),
        }
    }
}
