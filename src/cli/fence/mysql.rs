//! `palisade fence --store mysql://USER[:PASS]@HOST:PORT[/DB]`: the flags and exit
//! codes of the PostgreSQL store, against `palisade.fence` in MySQL or MariaDB.
//!
//! The check runs in autocommit (a transaction of its own, as with PostgreSQL). The
//! default key needs no migration check here: palisade never fenced in MySQL under
//! the bare lease name. `--lock-timeout` becomes the session's
//! `innodb_lock_wait_timeout`, which counts whole seconds: it is rounded up.

use super::{FenceArgs, Refusal};

#[cfg(feature = "mysql")]
pub(super) async fn fence(args: &FenceArgs, url: &str) -> Result<String, Refusal> {
    use super::{admitted_line, show_marks};
    use crate::fence::mysql::{self, Error};
    use mysql_async::prelude::Queryable;

    if args.payload.is_some() {
        return Err(Refusal::Usage(
            "--payload is for the file and Redis stores; with MySQL, call palisade.fence \
             in the statement that does your write"
                .into(),
        ));
    }
    let refusal = |e: Error| match e {
        Error::Stale(stale) => Refusal::Stale(stale),
        Error::BadInput(_) => Refusal::Usage(Box::new(e)),
        Error::LockTimeout { key, .. } => Refusal::store(Error::LockTimeout {
            key,
            timeout: Some(args.lock_timeout),
        }),
        // mysql_async's messages repeat their sources: the error and its cause, once.
        Error::Mysql(ref cause) | Error::Conflict(ref cause) => {
            Refusal::Store(format!("{e}: {cause}").into())
        }
        e => Refusal::store(e),
    };
    // The URL may hold a password: the messages do not repeat it.
    let opts = mysql_async::Opts::from_url(url)
        .map_err(|e| Refusal::Usage(format!("--store is not a MySQL URL: {e}").into()))?;
    let mut conn = mysql_async::Conn::new(opts)
        .await
        .map_err(|e| Refusal::Store(format!("cannot connect to MySQL: {e}").into()))?;
    let result = async {
        if args.create {
            mysql::install(&mut conn)
                .await
                .map_err(|e| install_refusal(&e))?;
            return Ok(format!(
                "palisade.fence schema version {} is installed",
                mysql::SQL_VERSION
            ));
        }
        if args.show {
            return Ok(show_marks(&mysql::marks(&mut conn).await.map_err(refusal)?));
        }
        let token = args.token.ok_or_else(Refusal::token_required)?;
        // Whole seconds, at least 1 (0 would be "do not wait" in MariaDB).
        let seconds = args.lock_timeout.as_secs_f64().ceil().max(1.0) as u64;
        conn.query_drop(format!("SET SESSION innodb_lock_wait_timeout = {seconds}"))
            .await
            .map_err(|e| refusal(Error::Mysql(e)))?;
        let admitted = mysql::admit_with(&mut conn, &args.key, token)
            .await
            .map_err(refusal)?;
        Ok(admitted_line(&args.key, admitted))
    }
    .await;
    let _ = conn.disconnect().await;
    result
}

/// Why `--create` failed, with what to do about the two usual causes.
#[cfg(feature = "mysql")]
fn install_refusal(e: &crate::fence::mysql::Error) -> Refusal {
    use crate::fence::mysql::Error;
    let cause = match e {
        Error::Mysql(cause) => cause.to_string(),
        e => e.to_string(),
    };
    // ER_BINLOG_UNSAFE_ROUTINE: a binary log and log_bin_trust_function_creators = 0.
    let hint = if e.server_code() == Some(1418) {
        "this server has a binary log: set log_bin_trust_function_creators = 1 for the \
         install (see sql/palisade-fence-mysql.sql)"
    } else if e.server_code() == Some(1205) {
        "open transactions that called palisade.fence hold it: install again when they \
         have ended"
    } else {
        "run --create as an account that may create the database palisade and routines in it"
    };
    Refusal::Store(format!("cannot install palisade.fence ({hint}): {cause}").into())
}

#[cfg(not(feature = "mysql"))]
pub(super) async fn fence(_: &FenceArgs, _: &str) -> Result<String, Refusal> {
    Err(Refusal::Usage(
        "this build has no MySQL store (feature `mysql`)".into(),
    ))
}
