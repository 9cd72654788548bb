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

/// Retiring the previous vault key: the vault counts its cards by the key
/// their fingerprint was made under, so the operator sees when none is left
/// under the previous one. A card seen during the rotation moves to the
/// new key; one not seen stays under the old until it is. Removal tried:
/// the re-key's `key_id` not updated — the re-keyed card stayed counted
/// under the previous key, and this failed.
#[tokio::test]
async fn the_vault_counts_its_cards_by_key_so_the_previous_one_can_be_retired() {
    use mock_gateway::vault::{cards_by_key, tokenise, ByKey};
    let migrations = vec![sqlx::migrate!("../../migrations/gateway")];
    let (_db, pool) = TempDb::with_tables("eo_gw_vault_keys", migrations, "").await.unwrap();
    let (old, new) = ("o".repeat(40), "n".repeat(40));
    let (old, new) = (old.as_bytes(), new.as_bytes());
    for card in ["4242424242424242", "5555555555554444"] {
        tokenise(&pool, old, None, card).await.unwrap();
    }
    let by = |current, previous, other| ByKey {
        current,
        previous,
        other,
    };
    assert_eq!(cards_by_key(&pool, old, None).await.unwrap(), by(2, 0, 0));
    // Rotating: the first card is seen again and moves to the new key.
    tokenise(&pool, new, Some(old), "4242424242424242").await.unwrap();
    assert_eq!(cards_by_key(&pool, new, Some(old)).await.unwrap(), by(1, 1, 0));
    tokenise(&pool, new, Some(old), "5555555555554444").await.unwrap();
    assert_eq!(
        cards_by_key(&pool, new, Some(old)).await.unwrap(),
        by(2, 0, 0),
        "none left under the previous key: it may be retired"
    );
    assert_ne!(mock_gateway::vault::key_id(old), mock_gateway::vault::key_id(new));
    assert!(
        !mock_gateway::vault::key_id(old).contains("oooo"),
        "the id hides the key"
    );
}
