//! The admin ports: probes, metrics and `/openapi.json` open to whoever
//! reaches them (an orchestrator, Prometheus); an order's journey and a
//! participant's records only to that service's operator and, for a
//! participant's records, to order-api (its `ADMIN_READERS`), which
//! draws the journey. Every admin route of every service, with no
//! credential, a wrong one, each other principal's, and the right ones.

use e2e::stack::{Secrets, Service};
use uuid::Uuid;

/// Who knocks.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Who {
    Nobody,
    Wrong,
    OrderApiOperator,
    InventoryOperator,
    PaymentOperator,
    /// order-api's credential at the participants.
    OrderApiReader,
    /// A client's API key.
    Client,
}

const EVERYONE: [Who; 7] = [
    Who::Nobody,
    Who::Wrong,
    Who::OrderApiOperator,
    Who::InventoryOperator,
    Who::PaymentOperator,
    Who::OrderApiReader,
    Who::Client,
];

impl Who {
    fn credential<'a>(self, secrets: &'a Secrets, api_key: &'a str) -> Option<&'a str> {
        match self {
            Who::Nobody => None,
            Who::Wrong => Some("0123456789abcdef0123456789abcdef-not-a-key"),
            Who::OrderApiOperator => Some(&secrets.order_api_operator),
            Who::InventoryOperator => Some(&secrets.operator),
            Who::PaymentOperator => Some(&secrets.payment_operator),
            Who::OrderApiReader => Some(&secrets.order_api_reader),
            Who::Client => Some(api_key),
        }
    }
}

/// Knocks on every admin route with every credential; returns the lines of
/// the access matrix (route, who → status). Panics at the first status
/// other than the documented one.
pub async fn every_admin_route(stack: &e2e::Stack, http: &reqwest::Client, order: Uuid) -> Vec<String> {
    let open = ["/health/live", "/health/ready", "/metrics"];
    let mut doors: Vec<(Service, String, &[Who])> = Vec::new();
    for s in [
        Service::OrderApi,
        Service::Inventory,
        Service::Payment,
        Service::Relay,
        Service::Gateway,
    ] {
        for path in open {
            doors.push((s, path.to_owned(), &EVERYONE));
        }
    }
    for s in [Service::OrderApi, Service::Inventory, Service::Gateway] {
        doors.push((s, "/openapi.json".to_owned(), &EVERYONE));
    }
    let journey = format!("/orders/{order}/journey");
    doors.push((Service::OrderApi, journey, &[Who::OrderApiOperator]));
    doors.push((
        Service::OrderApi,
        format!("/journey?order={order}"),
        &[Who::OrderApiOperator],
    ));
    doors.push((
        Service::OrderApi,
        "/orders?status=CONFIRMED".to_owned(),
        &[Who::OrderApiOperator],
    ));
    let part = format!("/journey/{order}?events=");
    doors.push((
        Service::Inventory,
        part.clone(),
        &[Who::InventoryOperator, Who::OrderApiReader],
    ));
    doors.push((Service::Payment, part, &[Who::PaymentOperator, Who::OrderApiReader]));
    doors.push((
        Service::Payment,
        format!("/payments/{order}"),
        &[Who::PaymentOperator, Who::OrderApiReader],
    ));
    let secrets = stack.secrets();
    let mut lines = Vec::new();
    for (service, path, allowed) in &doors {
        let url = format!("{}{path}", stack.admin_url(*service));
        for who in EVERYONE {
            let mut req = http.get(&url);
            if let Some(c) = who.credential(secrets, stack.api_key()) {
                req = req.bearer_auth(c);
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let want = if allowed.contains(&who) { 200 } else { 401 };
            if status == 401 {
                let challenges: Vec<_> = resp.headers().get_all("www-authenticate").iter().collect();
                assert!(
                    challenges.iter().any(|c| c.to_str().unwrap().starts_with("Basic ")),
                    "{service:?} {path}: a refusal offers Basic, so a browser asks: {challenges:?}"
                );
            }
            assert_eq!(status, want, "{service:?} {path} as {who:?}");
            lines.push(format!("{service:?} {path} as {who:?} → {status}"));
        }
    }
    // A browser's way in: HTTP Basic, the operator's credential as password.
    let page = format!("{}/orders/{order}/journey", stack.admin_url(Service::OrderApi));
    let basic = http
        .get(&page)
        .basic_auth("operator", Some(&secrets.order_api_operator))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status().as_u16(), 200, "Basic with the operator's credential");
    let basic = http
        .get(&page)
        .basic_auth("operator", Some(&secrets.operator))
        .send()
        .await
        .unwrap();
    assert_eq!(
        basic.status().as_u16(),
        401,
        "Basic with inventory's operator credential"
    );
    lines
}
