//! Inbox retention against a real PostgreSQL: what the window protects and
//! what happens past it.

use std::time::Duration;

use inbox::Recorded;
use uuid::Uuid;

#[tokio::test]
async fn inbox_retention_keeps_rows_inside_the_window() {
    let (_db, pool) = testkit::TempDb::with_pool("eo_inbox", 2, vec![inbox::migrator()])
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let (recent, old) = (Uuid::new_v4(), Uuid::new_v4());
    assert_eq!(inbox::record(&mut conn, "c", recent).await.unwrap(), Recorded::New);
    assert_eq!(inbox::record(&mut conn, "c", old).await.unwrap(), Recorded::New);
    sqlx::query("UPDATE inbox SET processed_at = now() - interval '8 days' WHERE event_id = $1")
        .bind(old)
        .execute(&mut *conn)
        .await
        .unwrap();

    let window = Duration::from_secs(7 * 86_400);
    assert_eq!(
        inbox::purge(&mut conn, window, 1000).await.unwrap(),
        1,
        "only the row past the window"
    );
    // A redelivery inside the window is absorbed (and counted)…
    assert_eq!(
        inbox::record(&mut conn, "c", recent).await.unwrap(),
        Recorded::Duplicate
    );
    let counted: i32 = sqlx::query_scalar("SELECT redeliveries FROM inbox_redeliveries WHERE event_id = $1")
        .bind(recent)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(counted, 1);
    // …one past it would be applied again: why the window must exceed the
    // broker's redelivery horizon.
    assert_eq!(inbox::record(&mut conn, "c", old).await.unwrap(), Recorded::New);
    drop(conn);
    pool.close().await;
}

#[tokio::test]
async fn a_batch_records_each_id_once_and_reports_the_rest_as_duplicates() {
    let (_db, pool) = testkit::TempDb::with_pool("eo_inbox", 2, vec![inbox::migrator()])
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let (seen, a, b) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    assert_eq!(inbox::record(&mut conn, "c", seen).await.unwrap(), Recorded::New);
    let at = |event_id, offset| inbox::Delivery {
        event_id,
        source: Some((2, offset)),
        fingerprint: None,
    };
    let recorded = inbox::record_batch(&mut conn, "c", &[at(a, 5), at(seen, 6), at(b, 7), at(a, 9)])
        .await
        .unwrap();
    assert_eq!(
        recorded,
        vec![Recorded::New, Recorded::Duplicate, Recorded::New, Recorded::Duplicate],
        "new, seen before, new, repeated inside the batch"
    );
    // Another consumer deduplicates on its own.
    let other = inbox::record_batch(&mut conn, "d", &[seen.into()]).await.unwrap();
    assert_eq!(other, vec![Recorded::New]);
    // The row keeps the copy that was applied: the first of the two of `a`
    // (offset 5, not 9); the one recorded by hand has no source.
    let sources: Vec<(uuid::Uuid, Option<i32>, Option<i64>)> = sqlx::query_as(
        "SELECT event_id, source_partition, source_offset FROM inbox WHERE consumer = 'c' ORDER BY source_offset NULLS FIRST",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(
        sources,
        vec![(seen, None, None), (a, Some(2), Some(5)), (b, Some(2), Some(7))]
    );
    let counted: i64 =
        sqlx::query_scalar("SELECT sum(redeliveries)::int8 FROM inbox_redeliveries WHERE consumer = 'c'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(counted, 2, "both duplicates counted");
    drop(conn);
    pool.close().await;
}

#[tokio::test]
async fn seen_names_the_processed_ids_and_a_miss_is_recorded_with_its_business_key() {
    let (_db, pool) = testkit::TempDb::with_pool("eo_inbox", 2, vec![inbox::migrator()])
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let (done, other, fresh) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    inbox::record(&mut conn, "c", done).await.unwrap();
    inbox::record(&mut conn, "d", other).await.unwrap();
    let seen = inbox::seen(&mut conn, "c", &[done, other, fresh]).await.unwrap();
    assert_eq!(seen, [done].into(), "only c's own, processed ids");

    let order = Uuid::new_v4();
    inbox::note_miss(&mut conn, "c", fresh, order, "reservation per order")
        .await
        .unwrap();
    let misses: Vec<(String, Uuid, Uuid, String)> =
        sqlx::query_as("SELECT consumer, event_id, order_id, caught_by FROM inbox_misses")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    assert_eq!(
        misses,
        [("c".to_owned(), fresh, order, "reservation per order".to_owned())]
    );
    drop(conn);
    pool.close().await;
}

#[tokio::test]
async fn a_begun_batch_names_its_fresh_deliveries_and_its_rows_commit_with_the_transaction() {
    let (_db, pool) = testkit::TempDb::with_pool("eo_inbox", 3, vec![inbox::migrator()])
        .await
        .unwrap();
    let (seen, a, b) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let (tx, fresh) = inbox::begin_batch(&pool, "c", &[seen.into()]).await.unwrap();
    assert_eq!((fresh.indices(), fresh.is_empty()), (vec![0], false));
    tx.commit().await.unwrap();

    let batch = [a.into(), seen.into(), b.into(), a.into()];
    let (tx, fresh) = inbox::begin_batch(&pool, "c", &batch).await.unwrap();
    assert_eq!(fresh.indices(), [0, 2]);
    assert!(!fresh.is_empty());
    assert_eq!(
        fresh.recorded(),
        [Recorded::New, Recorded::Duplicate, Recorded::New, Recorded::Duplicate]
    );
    // Rolled back (the effect failed): nothing of the batch is recorded.
    tx.rollback().await.unwrap();
    let (tx, fresh) = inbox::begin_batch(&pool, "c", &batch).await.unwrap();
    assert_eq!(fresh.indices(), [0, 2], "the rolled-back rows are new again");
    tx.commit().await.unwrap();
    let (tx, fresh) = inbox::begin_batch(&pool, "c", &[b.into(), seen.into()]).await.unwrap();
    assert_eq!((fresh.indices(), fresh.is_empty()), (vec![], true), "all duplicates");
    assert_eq!(fresh.recorded(), [Recorded::Duplicate, Recorded::Duplicate]);
    tx.commit().await.unwrap();
    pool.close().await;
}

fn reply(n: u8) -> inbox::Reply {
    inbox::Reply {
        reply_id: Uuid::new_v4(),
        topic: "order.events".into(),
        message_key: "order".into(),
        event_type: format!("Reply{n}"),
        body: format!("{{\"n\":{n}}}"),
        traceparent: None,
    }
}

#[tokio::test]
async fn the_replies_of_an_event_are_kept_in_order_with_its_row_and_go_with_it() {
    let (_db, pool) = testkit::TempDb::with_pool("eo_inbox", 2, vec![inbox::migrator()])
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let (a, b, none) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    for id in [a, b, none] {
        inbox::record(&mut conn, "c", id).await.unwrap();
    }
    let (a1, a2, b1) = (reply(1), reply(2), reply(3));
    let kept = [(a, a1.clone()), (b, b1.clone()), (a, a2.clone())];
    inbox::record_replies(&mut conn, "c", &kept).await.unwrap();
    let got = inbox::replies_of(&mut conn, "c", &[a, none]).await.unwrap();
    assert_eq!(got, [(a, a1), (a, a2)], "a's, in the order emitted; none for `none`");
    assert!(inbox::replies_of(&mut conn, "other", &[a]).await.unwrap().is_empty());
    assert!(inbox::replies_of(&mut conn, "c", &[]).await.unwrap().is_empty());
    // A reply cannot outlive (or precede) its event's row.
    let orphan = inbox::record_replies(&mut conn, "c", &[(Uuid::new_v4(), reply(4))]).await;
    assert!(orphan.is_err(), "no inbox row, no reply kept");
    // Purged with the row.
    sqlx::query("UPDATE inbox SET processed_at = now() - interval '8 days' WHERE event_id = $1")
        .bind(b)
        .execute(&mut *conn)
        .await
        .unwrap();
    inbox::purge(&mut conn, Duration::from_secs(7 * 86_400), 100)
        .await
        .unwrap();
    assert!(inbox::replies_of(&mut conn, "c", &[b]).await.unwrap().is_empty());
    drop(conn);
    pool.close().await;
}

/// A repeat whose fingerprint (type, digest) is not the one its id was
/// recorded with is a reused id, not a copy: `Reused`, not counted as a
/// redelivery — before the batch or inside it. Without a fingerprint on
/// either side nothing can be told: a duplicate. Removal tried: the
/// fingerprint comparison dropped (every repeat a duplicate) — this failed.
#[tokio::test]
async fn an_id_used_again_for_another_fact_is_refused_not_absorbed() {
    let (_db, pool) = testkit::TempDb::with_pool("eo_inbox", 2, vec![inbox::migrator()])
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let fact = |event_type: &str, digest| {
        Some(inbox::Fingerprint {
            event_type: event_type.into(),
            digest,
        })
    };
    let of = |event_id, fingerprint| inbox::Delivery {
        event_id,
        source: None,
        fingerprint,
    };
    let (x, y) = (Uuid::new_v4(), Uuid::new_v4());
    let reserve = fact("ReserveStock", 41);
    let first = inbox::record_batch(&mut conn, "c", &[of(x, reserve.clone())])
        .await
        .unwrap();
    assert_eq!(first, vec![Recorded::New]);
    let repeats = inbox::record_batch(
        &mut conn,
        "c",
        &[
            of(x, reserve.clone()),
            of(x, fact("ReserveStock", 42)),
            of(x, fact("ReleaseStock", 41)),
            of(x, None),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        repeats,
        vec![
            Recorded::Duplicate,
            Recorded::Reused,
            Recorded::Reused,
            Recorded::Duplicate
        ],
        "a copy, another body, another type, a copy that says nothing"
    );
    let inside = inbox::record_batch(
        &mut conn,
        "c",
        &[of(y, reserve.clone()), of(y, fact("ReserveStock", 7))],
    )
    .await
    .unwrap();
    assert_eq!(
        inside,
        vec![Recorded::New, Recorded::Reused],
        "the first copy in a batch is the record"
    );
    let redeliveries: i32 = sqlx::query_scalar("SELECT redeliveries FROM inbox_redeliveries WHERE event_id = $1")
        .bind(x)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(redeliveries, 2, "the two copies, not the reuses");
    // begin_batch names the first reused delivery, so the caller refuses
    // the batch; a batch of copies and new ids has none.
    let z = Uuid::new_v4();
    let (tx, fresh) = inbox::begin_batch(&pool, "c", &[of(z, reserve.clone()), of(x, reserve.clone())])
        .await
        .unwrap();
    assert_eq!(fresh.reused(), None);
    drop(tx);
    let (tx, fresh) = inbox::begin_batch(
        &pool,
        "c",
        &[
            of(z, reserve.clone()),
            of(y, reserve.clone()),
            of(x, fact("ReleaseStock", 41)),
        ],
    )
    .await
    .unwrap();
    assert_eq!(fresh.reused(), Some(2), "{:?}", fresh.recorded());
    drop(tx);
}
