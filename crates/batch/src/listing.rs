//! Paging through a tenant's files or batches: newest first (or oldest first with
//! `order=asc`), `limit` per page, continuing `after` an id, as OpenAI's list calls do; a
//! page's objects are read in one pipelined round trip.

use redis::AsyncCommands;

use crate::error::ApiError;
use crate::files_api::ListQuery;
use crate::state::App;

/// One page of ids.
#[derive(Debug)]
pub struct Page {
    pub ids: Vec<String>,
    pub has_more: bool,
}

/// The page of `zset` (scores: creation times) that `q` asks for.
pub async fn page(
    app: &App,
    zset: &str,
    q: &ListQuery,
    default_limit: u64,
    max_limit: u64,
) -> Result<Page, ApiError> {
    let limit = match &q.limit {
        None => default_limit,
        Some(text) => match text.parse::<u64>() {
            Ok(n) if (1..=max_limit).contains(&n) => n,
            _ => {
                return Err(ApiError::invalid(
                    format!("Invalid 'limit': must be an integer between 1 and {max_limit}."),
                    Some("limit"),
                ))
            }
        },
    };
    let asc = match q.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "Invalid 'order': must be 'asc' or 'desc'.",
                Some("order"),
            ))
        }
    };
    let mut con = app.redis.clone();
    let start: isize = match &q.after {
        None => 0,
        Some(after) => {
            let rank: Option<isize> = if asc {
                con.zrank(zset, after).await?
            } else {
                con.zrevrank(zset, after).await?
            };
            match rank {
                Some(r) => r + 1,
                None => {
                    return Err(ApiError::invalid(
                        format!("Invalid 'after': no object with id '{after}'."),
                        Some("after"),
                    ))
                }
            }
        }
    };
    let stop = start + limit as isize;
    let mut ids: Vec<String> = if asc {
        con.zrange(zset, start, stop).await?
    } else {
        con.zrevrange(zset, start, stop).await?
    };
    let has_more = ids.len() as u64 > limit;
    ids.truncate(limit as usize);
    Ok(Page { ids, has_more })
}

/// The hashes of `ids` (keys from `key`), in one round trip; ids whose hash is gone are left
/// out.
pub async fn fetch(
    app: &App,
    ids: &[String],
    key: fn(&str) -> String,
) -> Result<Vec<crate::model::Fields>, ApiError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for id in ids {
        pipe.hgetall(key(id));
    }
    let mut con = app.redis.clone();
    let all: Vec<crate::model::Fields> = pipe.query_async(&mut con).await?;
    Ok(all.into_iter().filter(|f| !f.is_empty()).collect())
}
