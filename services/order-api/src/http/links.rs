//! The journey one click away: every successful answer about one order
//! carries `Link: <…/journey?order=<id>>; rel="journey"`, the page on
//! order-api's admin port that shows what each database and the log hold
//! of it (behind the operator's credential). Set by `JOURNEY_PUBLIC_URL`,
//! where an operator's browser reaches that port; unset, no link.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use uuid::Uuid;

/// `api` with the journey link on its answers, when `base` is given.
pub fn journey_links(api: Router, base: Option<&str>) -> Router {
    match base {
        Some(base) => {
            let base: Arc<str> = base.trim_end_matches('/').into();
            api.layer(axum::middleware::from_fn_with_state(base, link))
        }
        None => api,
    }
}

async fn link(State(base): State<Arc<str>>, req: Request, next: Next) -> Response {
    let in_path = order_in(req.uri().path());
    let mut resp = next.run(req).await;
    if !resp.status().is_success() {
        return resp;
    }
    // A created order is named by its Location (stored with a replayed answer too).
    let id = in_path.or_else(|| {
        resp.headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .and_then(order_in)
    });
    if let Some(value) = id.and_then(|id| HeaderValue::from_str(&journey_link(&base, id)).ok()) {
        resp.headers_mut().append(header::LINK, value);
    }
    resp
}

/// The `Link` value of order `id`'s journey under `base`.
pub fn journey_link(base: &str, id: Uuid) -> String {
    format!("<{base}/journey?order={id}>; rel=\"journey\"")
}

/// The order a path names: `/orders/{id}` and anything under it.
fn order_in(path: &str) -> Option<Uuid> {
    path.strip_prefix("/orders/")?.split('/').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_read_from_its_path_or_its_location() {
        let id = Uuid::from_u128(7);
        assert_eq!(order_in(&format!("/orders/{id}")), Some(id));
        assert_eq!(order_in(&format!("/orders/{id}/cancel")), Some(id));
        assert_eq!(order_in("/orders"), None);
        assert_eq!(order_in("/orders/not-an-id"), None);
        assert_eq!(order_in(&format!("/other/{id}")), None);
        assert_eq!(
            journey_link("http://127.0.0.1:9180", id),
            format!("<http://127.0.0.1:9180/journey?order={id}>; rel=\"journey\"")
        );
    }
}
