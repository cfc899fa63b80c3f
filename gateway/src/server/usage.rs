//! `GET /v1/usage`: a tenant's usage by day and model, for one of its admin keys.

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::AppState;
use crate::http::{self, ApiError, Body};
use crate::usage::{day_of, now_ms, parse_day, Period, ReadError};

/// Longest span one query covers.
const MAX_DAYS: i64 = 366;

pub async fn usage(state: &AppState, req: &Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let tenant = state
        .tenants()
        .authenticate_admin(http::bearer(req).unwrap_or(""))
        .map_err(|_| ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: Some("invalid_admin_key"),
            ..ApiError::bad_request(
                "/v1/usage needs one of the tenant's admin keys (admin_key_sha256 in the tenants config) as `Authorization: Bearer <key>`",
                None,
            )
        })?;
    let Some(log) = &state.usage else {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("usage_disabled"),
            ..ApiError::bad_request(
                "this gateway keeps no usage records (started with --usage-db off)",
                None,
            )
        });
    };
    // ?start=YYYY-MM-DD&end=YYYY-MM-DD (UTC, inclusive); default: this month up to today.
    let today = now_ms().div_euclid(86_400_000);
    let (month_start, _) = Period::Month.bounds(now_ms());
    let (mut start, mut end) = (month_start.div_euclid(86_400_000), today);
    for (k, v) in http::query_pairs(req) {
        let day = |name: &'static str| {
            parse_day(&v).ok_or_else(|| {
                ApiError::bad_request(
                    format!("{name} must be a date as YYYY-MM-DD (UTC), got `{v}`"),
                    Some(name),
                )
            })
        };
        match k.as_str() {
            "start" => start = day("start")?,
            "end" => end = day("end")?,
            _ => {
                return Err(ApiError::bad_request(
                    format!(
                        "unknown query parameter `{k}`: /v1/usage takes start and end (YYYY-MM-DD)"
                    ),
                    None,
                ))
            }
        }
    }
    if end < start || end - start >= MAX_DAYS {
        return Err(ApiError::bad_request(
            format!("end must be on or after start, at most {MAX_DAYS} days later"),
            Some("end"),
        ));
    }
    let (from, to) = (day_of(start * 86_400_000), day_of(end * 86_400_000));
    let rows = log
        .summary(tenant.id(), &from, &to)
        .await
        .map_err(|e| match e {
            ReadError::Busy => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: Some("usage_busy"),
                retry_after: Some(std::time::Duration::from_secs(1)),
                ..ApiError::bad_request(e.to_string(), None)
            },
            ReadError::TimedOut(_) => {
                ApiError::overloaded(e.to_string(), std::time::Duration::from_secs(1))
            }
            ReadError::Store(e) => ApiError::internal(e.to_string()),
        })?;
    let total = |f: fn(&crate::usage::DayRow) -> u64| rows.iter().map(f).sum::<u64>();
    let budget = tenant.config.budget_usd.map(|usd| {
        log.budget(
            tenant.id(),
            usd,
            tenant.config.budget_period.unwrap_or(Period::Month),
        )
    });
    Ok(http::json(
        StatusCode::OK,
        &serde_json::json!({
            "object": "usage",
            "tenant": tenant.id(),
            "start": from,
            "end": to,
            "data": rows,
            "total": {
                "requests": total(|r| r.requests),
                "prompt_tokens": total(|r| r.prompt_tokens),
                "cached_tokens": total(|r| r.cached_tokens),
                "completion_tokens": total(|r| r.completion_tokens),
                "cost_usd": rows.iter().map(|r| r.cost_usd).sum::<f64>(),
            },
            "budget": budget,
        }),
    ))
}
