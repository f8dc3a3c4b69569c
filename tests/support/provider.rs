//! A payment provider of our own for the fenced outbox's tests and bench: an HTTP/1.1
//! server on 127.0.0.1 that deduplicates by `Idempotency-Key`, as payment providers
//! do. The first request with a key executes (counted per key) and its answer is
//! stored; a later one gets the stored answer, and one that arrives while the first
//! is still executing gets 409 (as Stripe answers), which the relay retries.
//!
//! Faults on demand: the next requests answered 5xx before anything executes
//! ([`Provider::fail_next`]), executions whose answer is held past the relay's
//! timeout ([`Provider::delay_executions`]); a payload with `"reject": true` is
//! refused with 422 (stored, like any answer). Plain `tokio`, no HTTP library: the
//! requests it reads are simple (a POST with Content-Length), and what it counts is
//! what the tests assert.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// What the provider knows of one idempotency key.
#[derive(Debug, Clone, Default)]
pub struct KeyRecord {
    /// How many times the operation ran (1 is the promise).
    pub executions: u32,
    /// Every request that carried the key, replays and refusals included.
    pub requests: u32,
    /// The payload of the first request.
    pub payload: String,
    /// When it executed.
    pub executed_at: Option<Instant>,
    /// The stored answer; `None` while the first request is executing.
    pub answer: Option<(u16, String)>,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, KeyRecord>,
    /// Requests still to be answered with this 5xx before anything executes.
    failures: Vec<u16>,
    /// Executions whose answer waits this long (past the relay's timeout).
    delay: Option<Duration>,
    /// Requests without an Idempotency-Key (answered 400).
    keyless: u32,
}

/// The provider, serving until dropped.
pub struct Provider {
    pub port: u16,
    state: Arc<Mutex<State>>,
    server: tokio::task::JoinHandle<()>,
}

impl Provider {
    /// Starts it on a free port of 127.0.0.1, in the current runtime.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the provider binds to 127.0.0.1");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Self {
            port,
            state,
            server,
        }
    }

    /// The URL to POST intents to.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1/payments", self.port)
    }

    /// The next `count` requests are answered `status` (a 5xx) without executing.
    pub fn fail_next(&self, count: usize, status: u16) {
        self.state
            .lock()
            .unwrap()
            .failures
            .extend(vec![status; count]);
    }

    /// From now on, executions answer only after `delay` (`None`: at once).
    pub fn delay_executions(&self, delay: Option<Duration>) {
        self.state.lock().unwrap().delay = delay;
    }

    /// Every key seen so far.
    pub fn keys(&self) -> HashMap<String, KeyRecord> {
        self.state.lock().unwrap().keys.clone()
    }

    /// Requests that carried no Idempotency-Key.
    pub fn keyless_requests(&self) -> u32 {
        self.state.lock().unwrap().keyless
    }

    /// Requests received in all.
    pub fn requests(&self) -> u32 {
        let state = self.state.lock().unwrap();
        state.keys.values().map(|k| k.requests).sum::<u32>() + state.keyless
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// One connection: requests one after another (keep-alive), until the client closes.
async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) {
    let mut stream = BufReader::new(stream);
    while let Some((key, body)) = read_request(&mut stream).await {
        let (status, answer) = answer(&state, key, body).await;
        let response = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            reason(status),
            answer.len()
        );
        if stream
            .get_mut()
            .write_all(response.as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The Idempotency-Key and the body of the next request; `None` at the end or on
/// anything malformed (the connection is then closed).
async fn read_request(stream: &mut BufReader<TcpStream>) -> Option<(Option<String>, String)> {
    let mut line = String::new();
    let (mut key, mut length) = (None, 0usize);
    let mut header_bytes = 0;
    loop {
        line.clear();
        let n = stream.read_line(&mut line).await.ok()?;
        header_bytes += n;
        if n == 0 || header_bytes > 64 * 1024 {
            return None;
        }
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "idempotency-key" => key = Some(value.trim().to_owned()),
                "content-length" => length = value.trim().parse().ok()?,
                _ => {}
            }
        }
    }
    let mut body = vec![0; length.min(1 << 20)];
    stream.read_exact(&mut body).await.ok()?;
    Some((key, String::from_utf8_lossy(&body).into_owned()))
}

/// What a request gets, executing it if it is the first with its key.
async fn answer(state: &Mutex<State>, key: Option<String>, body: String) -> (u16, String) {
    let delay = {
        let mut state = state.lock().unwrap();
        let Some(key) = key.as_ref() else {
            state.keyless += 1;
            return (400, r#"{"error":"an Idempotency-Key is required"}"#.into());
        };
        if let Some(status) = state.failures.pop() {
            state.keys.entry(key.clone()).or_default().requests += 1;
            return (status, r#"{"error":"temporarily unavailable"}"#.into());
        }
        let delay = state.delay;
        let record = state.keys.entry(key.clone()).or_default();
        record.requests += 1;
        if let Some((status, answer)) = &record.answer {
            return (*status, answer.clone());
        }
        if record.executed_at.is_some() {
            return (
                409,
                r#"{"error":"a request with this key is in progress"}"#.into(),
            );
        }
        record.payload = body.clone();
        record.executed_at = Some(Instant::now());
        if rejected(&body) {
            record.answer = Some((422, r#"{"error":"payment refused: invalid"}"#.into()));
            return record.answer.clone().unwrap();
        }
        record.executions += 1;
        delay
    };
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let key = key.unwrap_or_default();
    let stored = (
        200,
        format!(r#"{{"status":"succeeded","payment":"{key}"}}"#),
    );
    state.lock().unwrap().keys.get_mut(&key).unwrap().answer = Some(stored.clone());
    stored
}

fn rejected(body: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("reject").and_then(serde_json::Value::as_bool))
        .unwrap_or(false)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
