//! `palisade fence`: admit a fencing token from the shell, against a file store (a
//! directory), PostgreSQL (`postgres://...`) or Redis (`redis://...`).
//!
//! **The default key** (`<namespace>/<lease>`, `#<slot>` for a semaphore's slot
//! above 0) and why an older default is checked: `key`.
//!
//! **`--create`** takes no token (clap `conflicts_with`, which counts
//! `PALISADE_FENCING_TOKEN` too, so under `palisade lock` it fails with exit 2 rather
//! than quietly fence nothing): setting up and fencing are separate steps, because a
//! writer that passed `--create` on every call would recreate a deleted store and
//! have its stale token admitted as the first.

#[cfg(feature = "s3")]
mod s3;

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod key;
mod mysql;

use self::key::{KeyMoved, key_from_env};
use super::{Threads, block_on, parse_duration, parse_slot};
use crate::fence::{Admitted, Fence, FenceError, FileStore, Stale, parse_token};

/// Exit status of `palisade fence` when the token is stale and the write refused.
pub const EXIT_STALE: u8 = 3;
/// Exit status for bad arguments (clap uses the same for its usage errors).
pub const EXIT_USAGE: u8 = 2;

/// `palisade fence`: admit a fencing token against a file-backed fence, from the shell.
///
/// Exit codes:
/// - 0: admitted (or, with `--show`, the marks were printed; with `--create`, the store is ready);
/// - 1: the store could not be read or written (I/O error, corrupt file, not installed,
///   `--lock-timeout` ran out, the default key would start a mark over);
/// - 2: bad arguments, e.g. a token that is not an unsigned decimal integer;
/// - 3: rejected: the token is lower than the highest admitted for the key.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit codes: 0 admitted, 1 store error, 2 bad arguments, 3 stale token rejected.",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct FenceArgs {
    /// `palisade fence check URL`: probe a store instead of fencing.
    #[command(subcommand)]
    pub command: Option<FenceCommand>,

    /// Where the marks live: a directory, `postgres://...` or `mysql://...`
    /// (palisade.fence), `redis://...`, or `s3://BUCKET` (the object is its own mark).
    /// A fence call creates no store: set one up with --create.
    // The empty default only fills the field under `check`, which needs no store.
    #[arg(
        long,
        value_name = "DIR|URL",
        required = true,
        default_value = "",
        hide_default_value = true,
        value_parser = clap::builder::TypedValueParser::map(
            clap::builder::OsStringValueParser::new(),
            PathBuf::from
        )
    )]
    pub store: PathBuf,

    /// Set the store up instead of fencing: make the directory if it does not exist
    /// or is empty (its parent must exist; a damaged store is an error even so), or
    /// install or upgrade palisade.fence in PostgreSQL (as a role that may create the
    /// schema). Takes no token, not even PALISADE_FENCING_TOKEN: setting up and
    /// fencing are separate steps, so a writer never recreates a deleted store and
    /// has its token admitted as the first.
    #[arg(long, conflicts_with_all = ["show", "token", "payload"])]
    pub create: bool,

    /// How long to wait for another writer: for the file store's lock, or in
    /// PostgreSQL for the key's mark (`lock_timeout`), which a transaction that
    /// fenced the key holds until it ends (e.g. 500ms, 5s).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub lock_timeout: Duration,

    /// What the token fences. Default: `<namespace>/<lease>` from PALISADE_NAMESPACE
    /// and PALISADE_LEASE (as `palisade lock` sets them), `<namespace>/<lease>#N` for
    /// slot N above 0 of a semaphore (--slot), the lease name when only
    /// PALISADE_LEASE is set, else "default".
    #[arg(long = "key", id = "key", value_name = "KEY")]
    pub key_arg: Option<String>,

    /// The semaphore slot the token was granted in (0 to 63), for the default key
    /// [default: PALISADE_SLOT (as `palisade lock` sets it), else 0].
    #[arg(
        long,
        value_name = "N",
        value_parser = parse_slot,
        allow_negative_numbers = true,
        conflicts_with = "key"
    )]
    pub slot: Option<i32>,

    /// The key fenced: `--key`, else the default above ([`run`] sets it).
    #[arg(skip)]
    pub key: String,

    /// Fencing token of this write: an unsigned decimal integer.
    #[arg(
        long,
        env = "PALISADE_FENCING_TOKEN",
        value_parser = parse_token,
        // So that `--token -1` reaches parse_token and gets its clear message.
        allow_negative_numbers = true,
        required_unless_present_any = ["show", "create"]
    )]
    pub token: Option<u64>,

    /// Record this text in the store's journal as the accepted write.
    #[arg(long, conflicts_with = "show")]
    pub payload: Option<String>,

    /// Print the highest admitted token of every key, as JSON, instead of admitting.
    #[arg(long)]
    pub show: bool,

    /// With an s3:// store: the object's content, from this file (- for stdin).
    #[arg(long, value_name = "PATH|-", conflicts_with_all = ["show", "create", "payload"])]
    pub body_file: Option<PathBuf>,
}

/// The subcommands of `palisade fence`.
#[derive(clap::Subcommand, Debug)]
pub enum FenceCommand {
    /// Probe an object store: does it honour conditional writes atomically (a wrong
    /// If-Match refused, racing conditional writers with one winner)? Exit 0 if so.
    #[cfg(feature = "s3")]
    Check(s3::CheckArgs),
}

/// Why `palisade fence` admitted nothing; each kind has its exit status.
#[derive(Debug)]
enum Refusal {
    /// The token is lower than the key's mark (exit 3); one type for every store.
    Stale(Stale),
    /// Bad arguments (exit 2).
    Usage(Box<dyn Error>),
    /// The store could not be read or written (exit 1), printed with its causes.
    Store(Box<dyn Error>),
}

impl Refusal {
    fn store(e: impl Error + 'static) -> Self {
        Refusal::Store(Box::new(e))
    }

    fn token_required() -> Self {
        Refusal::Usage("--token (or PALISADE_FENCING_TOKEN) is required".into())
    }

    fn report(self) -> ExitCode {
        let (code, message) = match self {
            Refusal::Stale(stale) => (EXIT_STALE, stale.to_string()),
            Refusal::Usage(e) => (EXIT_USAGE, format!("palisade fence: {e}")),
            Refusal::Store(e) => (1, format!("palisade fence: {}", error_chain(e.as_ref()))),
        };
        eprintln!("{message}");
        ExitCode::from(code)
    }
}

impl From<FenceError> for Refusal {
    fn from(e: FenceError) -> Self {
        match e {
            FenceError::Stale(stale) => Refusal::Stale(stale),
            e => Refusal::store(e),
        }
    }
}

pub fn run(mut args: FenceArgs) -> ExitCode {
    #[cfg(feature = "s3")]
    if let Some(FenceCommand::Check(check)) = args.command.take() {
        return s3::check(check);
    }
    let done = |result: Result<String, Refusal>| match result {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(refusal) => refusal.report(),
    };
    let lease_key = match args.key_arg.take() {
        Some(key) => {
            args.key = key;
            None
        }
        None => match key_from_env(args.slot) {
            Ok((key, lease_key)) => {
                args.key = key;
                lease_key
            }
            Err(refusal) => return done(Err(refusal)),
        },
    };
    let lease_key = lease_key.as_deref();
    let store = args.store.to_str().unwrap_or_default();
    if store.starts_with("s3://") {
        return object_store(&args, store.to_owned(), done);
    }
    if args.body_file.is_some() {
        return done(Err(Refusal::Usage(
            "--body-file is for s3:// stores; use --payload".into(),
        )));
    }
    match args.store.to_str().filter(|s| is_database_url(s)) {
        Some(url) if url.starts_with("redis") => block_on("fence", Threads::One, async {
            done(redis(&args, url).await)
        }),
        Some(url) if url.starts_with("mysql") => block_on("fence", Threads::One, async {
            done(mysql::fence(&args, url).await)
        }),
        Some(url) => block_on("fence", Threads::One, async {
            done(postgres(&args, url, lease_key).await)
        }),
        None => done(file(&args, lease_key)),
    }
}

/// `palisade fence --store s3://BUCKET` (feature `s3`).
fn object_store(
    args: &FenceArgs,
    url: String,
    done: impl Fn(Result<String, Refusal>) -> ExitCode,
) -> ExitCode {
    #[cfg(feature = "s3")]
    return block_on("fence", Threads::One, async {
        done(s3::write(args, &url).await)
    });
    #[cfg(not(feature = "s3"))]
    {
        let _ = (args, url);
        done(Err(Refusal::Usage(
            "this build has no object-store fence (feature `s3`)".into(),
        )))
    }
}

fn is_database_url(store: &str) -> bool {
    ["postgres://", "postgresql://", "redis://", "rediss://"]
        .iter()
        .any(|scheme| store.starts_with(scheme))
        || store.starts_with("mysql://")
}

/// `palisade fence --store DIR`.
fn file(args: &FenceArgs, lease_key: Option<&str>) -> Result<String, Refusal> {
    if args.create {
        FileStore::open_or_create(&args.store)?;
        return Ok(format!("fence store {} is ready", args.store.display()));
    }
    // `open` creates nothing, so a fence call never makes a store at a mistyped or
    // deleted path.
    let fence = Fence::new(FileStore::open(&args.store)?.with_lock_timeout(args.lock_timeout));
    if args.show {
        return Ok(show_marks(&fence.marks()?));
    }
    // clap requires the token; this guards callers that build FenceArgs by hand.
    let token = args.token.ok_or_else(Refusal::token_required)?;
    if let Some(lease_key) = lease_key
        && fence.highest(&args.key)?.is_none()
        && let Some(highest) = fence.highest(lease_key)?
    {
        return Err(Refusal::store(KeyMoved {
            key: args.key.clone(),
            lease_key: lease_key.to_owned(),
            highest,
        }));
    }
    let admitted = match &args.payload {
        Some(payload) => fence.admit_write(&args.key, token, payload)?,
        None => fence.admit(&args.key, token)?,
    };
    Ok(admitted_line(&args.key, admitted))
}

fn show_marks(marks: &crate::fence::Marks) -> String {
    serde_json::to_string_pretty(marks).expect("a map from strings to integers always serializes")
}

fn admitted_line(key: &str, admitted: Admitted) -> String {
    let previous = match admitted.previous {
        None => "first token for this key".to_owned(),
        Some(previous) if previous == admitted.token => "same as the highest admitted".to_owned(),
        Some(previous) => format!("highest was {previous}"),
    };
    format!(
        "admitted: fencing token {} for key {key:?} ({previous})",
        admitted.token
    )
}

/// `palisade fence --store postgres://...`. Only `--create` runs DDL; a fence call
/// needs nothing but EXECUTE on palisade.fence.
#[cfg(feature = "postgres")]
async fn postgres(args: &FenceArgs, url: &str, lease_key: Option<&str>) -> Result<String, Refusal> {
    use crate::fence::postgres::{self, Error};
    if args.payload.is_some() {
        return Err(Refusal::Usage(
            "--payload is for the file and Redis stores; with PostgreSQL, \
             call palisade.fence in the transaction that does your write"
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
        e => Refusal::store(e),
    };
    let database = |e| refusal(Error::Database(e));
    let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(Refusal::store)?;
    tokio::spawn(connection);
    if args.create {
        postgres::install(&client).await.map_err(|e| {
            let cause = match &e {
                Error::Database(db) => error_chain(db),
                e => error_chain(e),
            };
            Refusal::Store(
                format!(
                    "cannot install palisade.fence (run --create as a role that may create \
                     the schema palisade, or that owns it): {cause}"
                )
                .into(),
            )
        })?;
        return Ok(format!(
            "palisade.fence schema version {} is installed",
            postgres::SQL_VERSION
        ));
    }
    if args.show {
        return Ok(show_marks(
            &postgres::marks(&client).await.map_err(refusal)?,
        ));
    }
    let token = args.token.ok_or_else(Refusal::token_required)?;
    // Bounds the wait for a mark whose row lock another transaction holds (0 would
    // mean no bound at all).
    let lock_timeout_ms = args.lock_timeout.as_millis().clamp(1, i32::MAX as u128);
    client
        .batch_execute(&format!("SET lock_timeout = {lock_timeout_ms}"))
        .await
        .map_err(database)?;
    let Some(lease_key) = lease_key else {
        // Autocommit: the check is a transaction of its own (see sql/palisade-fence.sql).
        let admitted = postgres::admit_with(&client, &args.key, token)
            .await
            .map_err(refusal)?;
        return Ok(admitted_line(&args.key, admitted));
    };
    admit_under_lease_key(&mut client, args, token, lease_key, refusal).await
}

/// The default key `<namespace>/<lease>`: its first mark commits only if the bare
/// lease name has none.
#[cfg(feature = "postgres")]
async fn admit_under_lease_key(
    client: &mut tokio_postgres::Client,
    args: &FenceArgs,
    token: u64,
    lease_key: &str,
    refusal: impl Fn(crate::fence::postgres::Error) -> Refusal,
) -> Result<String, Refusal> {
    use crate::fence::postgres::{self, Error};
    let database = |e| refusal(Error::Database(e));
    let mut tx = client.transaction().await.map_err(database)?;
    let admitted = postgres::admit(&tx, &args.key, token)
        .await
        .map_err(&refusal)?;
    if admitted.previous.is_none() {
        // Read through the function (a writer may not read the table): token 0 is
        // admitted on a key with no mark, refused on one above 0, and the savepoint
        // is always rolled back, so the probe writes nothing.
        let probe = tx.savepoint("palisade_lease_key").await.map_err(database)?;
        let lease_mark = match postgres::admit(&probe, lease_key, 0).await {
            Ok(probed) => probed.previous,
            Err(Error::Stale(stale)) => Some(stale.highest),
            Err(e) => return Err(refusal(e)),
        };
        probe.rollback().await.map_err(database)?;
        if let Some(highest) = lease_mark {
            return Err(Refusal::store(KeyMoved {
                key: args.key.clone(),
                lease_key: lease_key.to_owned(),
                highest,
            }));
        }
    }
    tx.commit().await.map_err(database)?;
    Ok(admitted_line(&args.key, admitted))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &FenceArgs, _: &str, _: Option<&str>) -> Result<String, Refusal> {
    Err(Refusal::Usage(
        "this build has no PostgreSQL store (feature `postgres`)".into(),
    ))
}

/// `palisade fence --store redis://...`: every admit and `--create` first checks
/// the server's settings (one round trip) and refuses where it sees them unsafe.
#[cfg(feature = "redis")]
async fn redis(args: &FenceArgs, url: &str) -> Result<String, Refusal> {
    use crate::fence::redis::{self, Error, RedisFence, Settings, Write};
    if args.create && args.token.is_some() {
        return Err(Refusal::Usage(
            "with a Redis store, --create takes no token: create a key's mark once, when \
             the key is set up, and admit without --create (a writer that always creates \
             would start a mark that Redis lost over)"
                .into(),
        ));
    }
    let client = ::redis::Client::open(url).map_err(Refusal::store)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(Refusal::store)?;
    if args.show {
        let marks = redis::marks(&mut conn).await.map_err(Refusal::store)?;
        return Ok(show_marks(&marks));
    }
    let refusal = |e: Error| match e {
        Error::Stale(stale) => Refusal::Stale(stale),
        e @ Error::BadInput(_) => Refusal::Usage(Box::new(e)),
        e => Refusal::store(e),
    };
    let note = |settings: &Settings| {
        if let Settings::CannotSee(why) = settings {
            eprintln!(
                "palisade fence: cannot see the Redis settings the fence needs ({why}); \
                 make sure of appendonly yes, appendfsync always and maxmemory-policy \
                 noeviction or volatile-*"
            );
        }
    };
    if args.create {
        let created = RedisFence::create(&mut conn, &args.key)
            .await
            .map_err(refusal)?;
        note(&created.settings);
        let mark = redis::mark_key(&args.key);
        return Ok(if created.new {
            format!("fence mark {mark} of key {:?} created", args.key)
        } else {
            format!(
                "fence mark {mark} of key {:?} exists; kept as it is",
                args.key
            )
        });
    }
    let token = args.token.ok_or_else(Refusal::token_required)?;
    note(&redis::check_settings(&mut conn).await.map_err(refusal)?);
    let value_key = redis::data_key(&args.key, "value");
    let write = match &args.payload {
        Some(payload) => Write::Set {
            key: &value_key,
            value: payload,
        },
        None => Write::None,
    };
    RedisFence::new()
        .admit(&mut conn, &args.key, token, write)
        .await
        .map(|admitted| admitted_line(&args.key, admitted))
        .map_err(refusal)
}

#[cfg(not(feature = "redis"))]
async fn redis(_: &FenceArgs, _: &str) -> Result<String, Refusal> {
    Err(Refusal::Usage(
        "this build has no Redis store (feature `redis`)".into(),
    ))
}

/// The error and its causes, `: `-separated.
fn error_chain(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
