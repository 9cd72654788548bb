//! One order's journey on order-api's admin port — the JSON and the page
//! drawing it, in headless Chromium — for an order whose first command the
//! relay published twice (a crash between publishing and marking): every
//! message written, published and applied, the copy inventory-service's
//! inbox absorbed, the gateway's record under the charge's key, the trace.

use std::time::Duration;

use e2e::driver::{new_key, Client, OrderRequest, GOOD_CARD};
use e2e::stack::Service;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orders_journey_shows_each_step_and_the_copy_an_inbox_absorbed() {
    let mut stack = crate::stack("journey").await;
    let client = Client::new(&stack, Duration::from_secs(5)).unwrap();
    client.seed_stock("WIDGET", 10).await.unwrap();
    // The relay publishes the order's first command and dies before marking
    // it: started again, it publishes it again.
    let point = outbox::relay::CRASH_AFTER_PUBLISH_BEFORE_MARK;
    stack.arm(Service::Relay, point);
    stack.restart_unready(Service::Relay).await.unwrap();
    let order = OrderRequest {
        sku: "WIDGET".into(),
        quantity: 2,
        amount_cents: 1_250,
        card: GOOD_CARD.into(),
    };
    let key = new_key();
    let id = client
        .place_order(&key, &order, Duration::from_secs(10))
        .await
        .unwrap()
        .id;
    stack.wait_exit(Service::Relay, Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        stack.crash_point_reports(Service::Relay, point),
        1,
        "the crash point fired"
    );
    stack.disarm(Service::Relay);
    stack.start_service(Service::Relay).await.unwrap();
    let finals = client.wait_terminal(&[id], Duration::from_secs(60)).await.unwrap();
    assert_eq!(finals[&id].status, "CONFIRMED");

    let admin = stack.admin_url(Service::OrderApi);
    let operator = stack.secrets().order_api_operator.clone();
    let http = reqwest::Client::new();
    let read = || async {
        let r = http
            .get(format!("{admin}/orders/{id}/journey"))
            .bearer_auth(&operator)
            .send()
            .await
            .unwrap();
        r.json::<Value>().await.unwrap()
    };
    // inventory-service answers the repeated command with its stored reply,
    // under the reply's first id: the saga's inbox absorbs that copy too,
    // unless the two copies of the command came in one batch. A few seconds
    // for it to land.
    let mut journey = read().await;
    for _ in 0..20 {
        if journey.to_string().matches("redelivered cop").count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        journey = read().await;
    }
    assert_eq!(journey["missing"], serde_json::json!([]), "{journey:#}");
    let steps = journey["steps"].as_array().unwrap();
    let of = |kind: &str| steps.iter().filter(|s| s["kind"] == kind).collect::<Vec<_>>();
    // Every message written is published and applied by exactly one inbox:
    // order-api's two commands, the participants' two replies.
    let sent = of("sent");
    assert_eq!(sent.len(), 4, "{sent:#?}");
    for s in &sent {
        let applied: Vec<_> = of("received")
            .into_iter()
            .filter(|r| r["event_id"] == s["event_id"])
            .collect();
        assert_eq!(applied.len(), 1, "{} applied once: {applied:#?}", s["what"]);
        assert!(
            applied[0]["offset"].is_i64(),
            "where the copy was read: {:#}",
            applied[0]
        );
        assert!(of("published").iter().any(|p| p["event_id"] == s["event_id"]));
    }
    // The command published again is absorbed by inventory-service's inbox
    // (and the reply it sends again for it, if any, by the saga's).
    let absorbed: Vec<_> = of("received")
        .into_iter()
        .filter(|r| r["redeliveries"].as_i64() > Some(0))
        .collect();
    let first_command = &sent.iter().find(|s| s["service"] == "order-api").unwrap()["event_id"];
    let command: Vec<_> = absorbed.iter().filter(|r| &r["event_id"] == first_command).collect();
    assert_eq!(command.len(), 1, "{absorbed:#?}");
    assert_eq!(command[0]["service"], "inventory-service");
    assert!(absorbed
        .iter()
        .all(|r| r["what"].as_str().unwrap().contains("1 redelivered copy absorbed")));
    assert!(
        absorbed.len() <= 2 && absorbed.iter().skip(1).all(|r| r["service"] == "order-api"),
        "{absorbed:#?}"
    );
    // The states, oldest first, end CONFIRMED; the charge's key has its
    // ledger entry; the trace is linked.
    let states = of("state");
    assert!(states.first().unwrap()["what"].as_str().unwrap().contains("PENDING"));
    assert!(states.last().unwrap()["what"].as_str().unwrap().contains("→ CONFIRMED"));
    let gateway = of("gateway");
    assert_eq!(gateway.len(), 1, "{gateway:#?}");
    assert!(
        gateway[0]["what"].as_str().unwrap().contains("ledger entry"),
        "{:#}",
        gateway[0]
    );
    assert_eq!(gateway[0]["key"], of("payment")[0]["key"]);
    let trace = journey["trace_id"].as_str().unwrap();
    assert_eq!(trace.len(), 32);
    assert!(journey["trace_url"]
        .as_str()
        .unwrap()
        .ends_with(&format!("/trace/{trace}")));
    let at: Vec<&str> = steps.iter().map(|s| s["at"].as_str().unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "oldest first");

    // The page draws every step, the absorbed copy marked, the trace
    // linked: opened as a browser opens it, the operator's credential as
    // Basic auth's password (in the URL, where a person types it at the
    // browser's prompt), and the page's own request for the JSON rides on it.
    let with_key = admin.replacen("http://", &format!("http://operator:{operator}@"), 1);
    let page = format!("{with_key}/journey?order={id}");
    let dom = tokio::task::spawn_blocking({
        let page = page.clone();
        move || testkit::browser::dom(&page)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(dom.contains(&format!("data-drawn=\"{}\"", steps.len())), "{dom}");
    assert_eq!(dom.matches("class=\"step ").count(), steps.len(), "{dom}");
    assert_eq!(dom.matches("what absorbed").count(), absorbed.len(), "{dom}");
    assert!(dom.contains(&format!("/trace/{trace}")), "{dom}");
    assert!(dom.contains("CONFIRMED"), "{dom}");
    // Its picture, for the tour (docs/img/journey.png, written again with
    // EO_UPDATE_SCREENSHOTS=1).
    let shot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/journey.png");
    tokio::task::spawn_blocking({
        let shot = shot.clone();
        move || testkit::browser::screenshot(&page, &shot, 1100, 1180)
    })
    .await
    .unwrap()
    .unwrap();
    if std::env::var_os("EO_UPDATE_SCREENSHOTS").is_some() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/img/journey.png");
        std::fs::copy(&shot, docs).unwrap();
    }

    // One click away: the API's answer about the order links its journey,
    // and the page without an order lists the orders, found by the key
    // the client placed it with.
    let answer = stack
        .http_client(Duration::from_secs(5))
        .unwrap()
        .get(format!("{}/orders/{id}", stack.url(Service::OrderApi)))
        .bearer_auth(stack.api_key())
        .send()
        .await
        .unwrap();
    assert_eq!(
        answer.headers()["link"].to_str().unwrap(),
        format!("<{admin}/journey?order={id}>; rel=\"journey\"")
    );
    let list = |query: String| {
        let (http, operator, admin) = (http.clone(), operator.clone(), admin.clone());
        async move {
            let r = http
                .get(format!("{admin}/orders?{query}"))
                .bearer_auth(&operator)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, by_key) = list(format!("q={key}")).await;
    assert_eq!(status, 200);
    assert_eq!(by_key.as_array().unwrap().len(), 1, "{by_key}");
    assert_eq!(by_key[0]["id"], id.to_string());
    let (_, by_id) = list(format!("q={id}")).await;
    assert_eq!(by_id[0]["id"], id.to_string());
    let (_, confirmed) = list("status=CONFIRMED".into()).await;
    assert!(confirmed.as_array().unwrap().iter().any(|o| o["id"] == id.to_string()));
    let (_, none) = list("status=CANCELLED".into()).await;
    assert_eq!(none, serde_json::json!([]));
    assert_eq!(list("status=LOST".into()).await.0, 400);
    let listing = tokio::task::spawn_blocking(move || testkit::browser::dom(&format!("{with_key}/journey")))
        .await
        .unwrap()
        .unwrap();
    assert!(listing.contains("data-listed=\"1\""), "{listing}");
    assert!(listing.contains(&format!("journey?order={id}")), "{listing}");

    // The fan-out is bounded: with one journey at a time and a participant
    // that accepts and never answers, a second journey is refused at once
    // (503, Retry-After) while the first waits out its call, then comes
    // back with that participant's part named missing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    stack.set_env(Service::OrderApi, "INVENTORY_ADMIN_URL", &silent_url);
    stack.set_env(Service::OrderApi, "JOURNEY_MAX_IN_FLIGHT", "1");
    stack.restart(Service::OrderApi).await.unwrap();
    let first = tokio::spawn({
        let read = format!("{admin}/orders/{id}/journey");
        let (http, operator) = (http.clone(), operator.clone());
        async move { http.get(read).bearer_auth(operator).send().await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let second = http
        .get(format!("{admin}/orders/{id}/journey"))
        .bearer_auth(&operator)
        .send()
        .await
        .unwrap();
    assert_eq!(second.status().as_u16(), 503, "one journey at a time");
    assert!(started.elapsed() < Duration::from_secs(1), "refused at once");
    assert_eq!(second.headers()["retry-after"], "1");
    let first = first.await.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    let first: Value = first.json().await.unwrap();
    assert!(
        first["missing"].to_string().contains("inventory-service"),
        "{}",
        first["missing"]
    );
    held.abort();
}
