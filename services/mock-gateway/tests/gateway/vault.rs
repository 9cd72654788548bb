//! The vault's key rotated: a known card keeps its token.

use testkit::TempDb;

/// Rotating the vault key: while the old key is given as the previous one,
/// a known card keeps its token (re-keyed on sight, then found under the
/// new key alone); a card first seen after a rotation without it gets a new
/// token.
#[tokio::test]
async fn a_vault_key_rotation_keeps_each_cards_token() {
    use mock_gateway::vault::tokenise;
    let migrations = vec![sqlx::migrate!("../../migrations/gateway")];
    let (_db, pool) = TempDb::with_tables("eo_gw_vault", migrations, "").await.unwrap();
    let (old, new, other) = ("o".repeat(40), "n".repeat(40), "x".repeat(40));
    let card = "4242424242424242";
    let first = tokenise(&pool, old.as_bytes(), None, card).await.unwrap();
    let rotating = tokenise(&pool, new.as_bytes(), Some(old.as_bytes()), card)
        .await
        .unwrap();
    assert_eq!(
        rotating.token, first.token,
        "the same card, the same token, across the rotation"
    );
    let after = tokenise(&pool, new.as_bytes(), None, card).await.unwrap();
    assert_eq!(after.token, first.token, "re-keyed: found under the new key alone");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM card_tokens")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    // Without the previous key, a change of key loses the card's token.
    let lost = tokenise(&pool, other.as_bytes(), None, card).await.unwrap();
    assert_ne!(lost.token, first.token);
}
