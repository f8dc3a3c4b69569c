//! `palisade fence`: admit a fencing token from the shell, against a file store (a
//! directory), PostgreSQL (`postgres://...`) or Redis (`redis://...`).

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::{Threads, block_on, parse_duration};
use crate::fence::{Admitted, Fence, FenceError, FileStore, parse_token};

/// Exit status of `palisade fence` when the token is stale and the write refused.
pub const EXIT_STALE: u8 = 3;
/// Exit status for bad arguments (clap uses the same for its usage errors).
pub const EXIT_USAGE: u8 = 2;

/// `palisade fence`: admit a fencing token against a file-backed fence, from the shell.
///
/// Exit codes:
/// - 0: admitted (or, with `--show`, the marks were printed; with `--create` alone, the store is ready);
/// - 1: the store could not be read or written (I/O error, corrupt file);
/// - 2: bad arguments, e.g. a token that is not an unsigned decimal integer;
/// - 3: rejected: the token is lower than the highest admitted for the key.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Exit codes: 0 admitted, 1 store error, 2 bad arguments, 3 stale token rejected."
)]
pub struct FenceArgs {
    /// Where the marks live: a directory (it must exist unless --create is given),
    /// `postgres://...` (palisade.fence, installed on first use) or `redis://...`.
    #[arg(long, value_name = "DIR|URL")]
    pub store: PathBuf,

    /// Create the store first if the directory does not exist or is empty (its
    /// parent must exist). Without a token, only that. A damaged store is an error
    /// even so. Meant for setting a store up, not for every write: a writer that
    /// always passes it would start a deleted store over at zero.
    #[arg(long, conflicts_with = "show")]
    pub create: bool,

    /// How long to wait for another writer to let go of the store's lock (e.g. 500ms, 5s).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub lock_timeout: Duration,

    /// What the token fences, e.g. the resource written; defaults to the lease name.
    #[arg(long, env = "PALISADE_LEASE", default_value = "default")]
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
}

/// Why `palisade fence` admitted nothing; each kind has its exit status.
#[derive(Debug)]
enum Refusal {
    /// The token is lower than the key's mark (exit 3), in the store's words.
    Stale(Box<dyn Error>),
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
            Refusal::Stale(e) => (EXIT_STALE, e.to_string()),
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
            FenceError::Stale { .. } => Refusal::Stale(Box::new(e)),
            e => Refusal::store(e),
        }
    }
}

pub fn run(args: FenceArgs) -> ExitCode {
    let done = |result: Result<String, Refusal>| match result {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(refusal) => refusal.report(),
    };
    match args.store.to_str().filter(|s| is_database_url(s)) {
        Some(url) if url.starts_with("redis") => block_on("fence", Threads::One, async {
            done(redis(&args, url).await)
        }),
        Some(url) => block_on("fence", Threads::One, async {
            done(postgres(&args, url).await)
        }),
        None => done(file(&args)),
    }
}

fn is_database_url(store: &str) -> bool {
    ["postgres://", "postgresql://", "redis://", "rediss://"]
        .iter()
        .any(|scheme| store.starts_with(scheme))
}

/// `palisade fence --store DIR`.
fn file(args: &FenceArgs) -> Result<String, Refusal> {
    let open = || -> Result<Fence<FileStore>, FenceError> {
        // `open` creates nothing, so looking never makes a store at a mistyped path.
        let store = if args.create {
            FileStore::open_or_create(&args.store)?
        } else {
            FileStore::open(&args.store)?
        };
        Ok(Fence::new(store.with_lock_timeout(args.lock_timeout)))
    };
    if args.show {
        return Ok(show_marks(&open()?.marks()?));
    }
    let Some(token) = args.token else {
        if args.create {
            open()?;
            return Ok(format!("fence store {} is ready", args.store.display()));
        }
        // clap requires the token; this guards callers that build FenceArgs by hand.
        return Err(Refusal::token_required());
    };
    let fence = open()?;
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

/// `palisade fence --store postgres://...`.
#[cfg(feature = "postgres")]
async fn postgres(args: &FenceArgs, url: &str) -> Result<String, Refusal> {
    use crate::fence::postgres::{self, Error};
    if args.payload.is_some() {
        return Err(Refusal::Usage(
            "--payload is for the file and Redis stores; with PostgreSQL, \
             call palisade.fence in the transaction that does your write"
                .into(),
        ));
    }
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(Refusal::store)?;
    tokio::spawn(connection);
    postgres::install(&client).await.map_err(Refusal::store)?;
    if args.show {
        let marks = postgres::marks(&client).await.map_err(Refusal::store)?;
        return Ok(show_marks(&marks));
    }
    let token = args.token.ok_or_else(Refusal::token_required)?;
    // Autocommit: the check is a transaction of its own (see sql/palisade-fence.sql).
    match postgres::admit_with(&client, &args.key, token).await {
        Ok(admitted) => Ok(admitted_line(&args.key, admitted)),
        Err(e @ Error::Stale { .. }) => Err(Refusal::Stale(Box::new(e))),
        Err(e @ Error::BadInput(_)) => Err(Refusal::Usage(Box::new(e))),
        Err(e) => Err(Refusal::store(e)),
    }
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &FenceArgs, _: &str) -> Result<String, Refusal> {
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
        e @ Error::Stale { .. } => Refusal::Stale(Box::new(e)),
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
