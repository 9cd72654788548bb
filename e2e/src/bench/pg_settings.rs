//! `cargo xtask bench --pg-set name=value`: server settings applied for one
//! run (`ALTER SYSTEM`, reloaded) and reset after it, so a deployment's
//! settings (docs/operations.md, "PostgreSQL settings") are measured on the
//! same machine as the defaults. Settings that need a server restart are
//! refused: the bench does not restart a server it shares.

use sqlx::{Connection as _, PgConnection};

/// Settings in force for a run; [`Applied::reset`] puts the server back.
#[derive(Debug)]
pub struct Applied {
    url: String,
    names: Vec<String>,
}

/// Parses `name=value`.
pub fn parse(s: &str) -> Result<(String, String), String> {
    let (name, value) = s.split_once('=').ok_or_else(|| format!("{s:?} is not name=value"))?;
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{name:?} is not a setting name"));
    }
    Ok((name.to_owned(), value.trim().to_owned()))
}

/// Applies `settings` on the server of `url` (any of its databases) and
/// reloads; checks each is in force.
pub async fn apply(url: &str, settings: &[(String, String)]) -> anyhow::Result<Applied> {
    let mut db = PgConnection::connect(url).await?;
    let applied = Applied {
        url: url.to_owned(),
        names: settings.iter().map(|(n, _)| n.clone()).collect(),
    };
    // Every name checked before any is set: a refused one leaves the
    // server as it was.
    for (name, _) in settings {
        let context: Option<String> = sqlx::query_scalar("SELECT context FROM pg_settings WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut db)
            .await?;
        match context.as_deref() {
            None => anyhow::bail!("PostgreSQL has no setting {name}"),
            Some("postmaster") => anyhow::bail!("{name} takes effect only after a server restart; set it by hand"),
            Some(_) => {}
        }
    }
    for (name, value) in settings {
        // ALTER SYSTEM takes no bind parameters; the name is checked above
        // and the value is quoted as a literal.
        let literal = value.replace('\'', "''");
        let set = sqlx::raw_sql(&format!("ALTER SYSTEM SET {name} = '{literal}'"))
            .execute(&mut db)
            .await;
        if let Err(e) = set {
            // A value the server refused: undo the ones set before it.
            db.close().await.ok();
            applied.reset().await?;
            return Err(e.into());
        }
    }
    sqlx::query("SELECT pg_reload_conf()").execute(&mut db).await?;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    for (name, _) in settings {
        let (setting, pending): (String, bool) =
            sqlx::query_as("SELECT setting, pending_restart FROM pg_settings WHERE name = $1")
                .bind(name)
                .fetch_one(&mut db)
                .await?;
        anyhow::ensure!(!pending, "{name} is pending a restart");
        eprintln!("bench: PostgreSQL {name} = {setting}");
    }
    db.close().await?;
    Ok(applied)
}

impl Applied {
    /// Resets every applied setting to the server's configuration and reloads.
    pub async fn reset(self) -> anyhow::Result<()> {
        if self.names.is_empty() {
            return Ok(());
        }
        let mut db = PgConnection::connect(&self.url).await?;
        for name in &self.names {
            sqlx::raw_sql(&format!("ALTER SYSTEM RESET {name}"))
                .execute(&mut db)
                .await?;
        }
        sqlx::query("SELECT pg_reload_conf()").execute(&mut db).await?;
        db.close().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_setting_is_name_equals_value_and_a_name_is_one_word() {
        assert_eq!(
            parse("wal_compression=lz4"),
            Ok(("wal_compression".into(), "lz4".into()))
        );
        assert!(parse("wal_compression").is_err());
        assert!(parse("x; DROP TABLE t=1").is_err());
    }
}
