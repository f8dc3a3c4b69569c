//! A tower layer for a kube client that records every request it sends, as
//! `METHOD path?query`, so a test can say what a component asked of the API server.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// The requests sent so far; clones share the record.
#[derive(Clone, Default)]
pub struct Recorded(Arc<Mutex<Vec<String>>>);

impl Recorded {
    /// Everything recorded up to now, in order.
    pub fn taken(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl<S> tower::Layer<S> for Recorded {
    type Service = Recording<S>;
    fn layer(&self, inner: S) -> Recording<S> {
        Recording(inner, self.clone())
    }
}

pub struct Recording<S>(S, Recorded);

impl<S, B> tower::Service<http::Request<B>> for Recording<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let target = request.uri().path_and_query().map(|p| p.as_str());
        let line = format!("{} {}", request.method(), target.unwrap_or_default());
        (self.1).0.lock().unwrap().push(line);
        self.0.call(request)
    }
}
